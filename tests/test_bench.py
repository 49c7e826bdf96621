"""`readyq bench --quick` runs on every backend and reports every section (a smoke test).

Speed is measured by the bench, never asserted here: these tests only check that each
section ran, produced positive figures, and left no database of its own behind.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import NullPool

pytestmark = pytest.mark.backend

SECTIONS = ("meta", "reference", "enqueue", "drain", "latency", "scaling", "backlog", "write_cost")


# One bench run per backend, shared by the tests below (a run takes seconds, not millis).
_RUNS: dict[str, dict[str, Any]] = {}


@pytest.fixture
def quick_result(backend: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The JSON of one `readyq bench --quick` run against the backend's server."""
    from readyq_bench.cli import main

    if backend.name not in _RUNS:
        out = tmp_path_factory.mktemp("bench") / "bench.json"
        argv = ["--quick", "--json", str(out)]
        if backend.name != "sqlite":  # SQLite: the bench's own temporary file
            argv += ["--url", backend.url]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(argv) == 0
        result: dict[str, Any] = json.loads(out.read_text())
        result["_stdout"] = printed.getvalue()
        _RUNS[backend.name] = result
    return _RUNS[backend.name]


def _positive(stats: dict[str, Any]) -> bool:
    return all(stats[k] > 0 for k in ("median", "min", "max"))


def test_quick_bench_reports_every_section(quick_result: dict[str, Any]) -> None:
    """The JSON has the meta data and every measured section."""
    assert all(quick_result.get(name) for name in SECTIONS), sorted(quick_result)
    assert quick_result["meta"]["config"]["quick"] is True


def test_reference_rates_are_positive_per_client_count(quick_result: dict[str, Any]) -> None:
    """The reference transaction rate is measured for one client and each worker count."""
    ref = quick_result["reference"]
    assert {"1", "4", "8"} <= set(ref["thread"])
    assert ref["process"]
    assert all(_positive(s) for by in ref.values() for s in by.values())


def test_enqueue_rates_and_ratios_are_positive(quick_result: dict[str, Any]) -> None:
    """Single, batched (100 and 1,000) and DAG enqueues each have a rate and a ratio."""
    enq = quick_result["enqueue"]
    for kind in ("single", "batch_100", "batch_1000", "dag"):
        assert _positive(enq[kind]), kind
        assert enq[kind]["ratio"] > 0, kind


def test_drain_covers_workers_modes_limits_and_the_fair_worker(
    quick_result: dict[str, Any],
) -> None:
    """Raw drains in threads and processes, limit 1 and batched, plus readyq.Worker in
    threads and in processes (one Worker per process, as deployed), with its handlers on
    threads and inline."""
    rows = quick_result["drain"]
    raw = {(r["mode"], r["workers"], r["limit"]) for r in rows if r["runner"] == "raw"}
    assert {("thread", w, lim) for w in (1, 4, 8) for lim in (1, 10)} <= raw
    batched = {(r["mode"], r["limit"]) for r in rows if r.get("finalize") == "batch"}
    assert ("thread", 10) in batched
    assert all(lim > 1 for _, lim in batched)
    fused = {(r["mode"], r["limit"]) for r in rows if r.get("finalize") == "fused"}
    assert {("thread", 1), ("thread", 10)} <= fused
    assert any(mode == "process" for mode, _, _ in raw)
    fair = {(r["mode"], r["executor"]) for r in rows if r["runner"] == "worker"}
    assert fair == {(m, e) for m in ("thread", "process") for e in ("thread", "inline")}
    assert {r["groups"] for r in rows if r["runner"] == "worker"} == {10}
    assert all(_positive(r["jobs_per_s"]) and r["ratio"] > 0 for r in rows)


def test_drain_rows_split_their_cpu_between_server_and_the_rest(
    quick_result: dict[str, Any], backend: Any
) -> None:
    """Each drain row says how busy the machine was and what the rest spent per job; the
    server's share where the server runs on this machine (SQLite has no server). A row
    too short for /proc's 10 ms ticks has none (test_bench_cpu covers that rule)."""
    if not Path("/proc/stat").is_file():
        pytest.skip("the CPU split needs Linux /proc")
    for row in quick_result["drain"]:
        split = row["cpu"]
        if not split:
            continue
        assert 0 < split["busy"] <= 1, row
        assert split["rest_ms_per_job"] > 0, row
        if backend.name == "sqlite":
            assert "server_ms_per_job" not in split, row
        else:
            assert split["server_ms_per_job"] >= 0, row
    assert re.search(r"x raw\s+server\s+rest\s+busy", quick_result["_stdout"])


def test_latency_percentiles_are_ordered(quick_result: dict[str, Any]) -> None:
    """Polling latency has p50 <= p95 <= p99, all positive (LISTEN too on PostgreSQL)."""
    lat = quick_result["latency"]
    blocks = [lat["polling"]] + ([lat["listen_notify"]] if "listen_notify" in lat else [])
    if quick_result["meta"]["backend"] == "postgresql":
        assert len(blocks) == 2
    for block in blocks:
        p50, p95, p99 = (block[k]["median"] for k in ("p50_ms", "p95_ms", "p99_ms"))
        assert 0 < p50 <= p95 <= p99


def test_scaling_reports_finished_blocked_and_deferred_ratios(
    quick_result: dict[str, Any],
) -> None:
    """Claim latency per filler size, with the largest/smallest ratio, for each kind."""
    scaling = quick_result["scaling"]
    for kind in ("finished", "blocked", "deferred"):
        sizes = scaling[kind]["sizes"]
        assert len(sizes) >= 2
        assert all(_positive(s["claim_finalize_ms"]) for s in sizes.values())
        assert scaling[kind]["ratio_largest_smallest"] > 0


def test_deferred_filler_is_ready_ahead_in_claim_order_and_not_due(backend: Any) -> None:
    """What the scaling section's deferred rows must be: ready, first in claim order
    (priority -1), and not claimed before they are due."""
    from readyq_bench import db

    import readyq

    if backend.name != "sqlite":
        pytest.skip("the bookkeeping of the bench, not of the database")
    with readyq.Queue(backend.url) as q:
        q.install()
        due = q.enqueue("noop")
        db.fill_jobs(q.engine, 50, state="deferred", now=q.clock.now_us())
        assert q.counts()["ready"] == 51
        assert [lease.job_id for lease in q.claim("w", limit=5)] == [due]


def test_backlog_reports_worker_rate_and_scan_per_backlog_size(
    quick_result: dict[str, Any],
) -> None:
    """A Worker's jobs/s and scan time per tick beside each ready backlog, with the ratios."""
    backlog = quick_result["backlog"]
    sizes = backlog["sizes"]
    assert len(sizes) >= 2
    assert all(_positive(s["jobs_per_s"]) and _positive(s["scan_ms"]) for s in sizes.values())
    assert backlog["ratio_smallest_largest"] > 0
    assert backlog["scan_ratio_largest_smallest"] > 0


def test_write_cost_counts_statements_and_transactions(quick_result: dict[str, Any]) -> None:
    """Per phase: statements, transactions and round trips per job; PG adds WAL and dead rows."""
    cost = quick_result["write_cost"]
    pg = quick_result["meta"]["backend"] == "postgresql"
    phases = ("enqueue_single", "enqueue_batch_100", "drain_limit_1", "drain_limit_10")
    for phase in (*phases, "drain_limit_10_batch"):
        row = cost[phase]
        assert row["statements_per_job"] > 0, phase
        assert row["transactions_per_job"] > 0, phase
        assert row["round_trips_per_job"] >= row["transactions_per_job"], phase
        if pg:
            assert row["wal_bytes_per_job"] > 0, phase
    if pg:
        assert cost["drain_limit_1"]["dead_tuples_per_job"] >= 0


def test_report_says_the_drain_tables_were_analyzed(quick_result: dict[str, Any]) -> None:
    assert quick_result["meta"]["config"]["analyze"] is True
    assert "tables ANALYZEd after each fill" in quick_result["_stdout"]


def test_terminal_table_names_every_section(quick_result: dict[str, Any]) -> None:
    """The printed table has a heading per section."""
    text = quick_result["_stdout"]
    for heading in ("Reference", "Enqueue", "Drain", "latency", "Scaling", "Backlog", "Write cost"):
        assert heading in text, heading


def test_bench_drops_its_own_database(quick_result: dict[str, Any], backend: Any) -> None:
    """The scratch database the run created on the server is gone afterwards."""
    if backend.name == "sqlite":
        return
    name = quick_result["meta"]["database"]
    assert name.startswith("readyq_bench_")
    engine = sa.create_engine(backend.url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            if backend.name == "postgresql":
                sql = "SELECT count(*) FROM pg_database WHERE datname = :n"
            else:
                sql = "SELECT count(*) FROM information_schema.schemata WHERE schema_name = :n"
            assert conn.execute(sa.text(sql), {"n": name}).scalar_one() == 0
    finally:
        engine.dispose()


def test_profile_times_every_worker_stage(
    backend: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """``--profile`` adds the Worker's time per tick by stage (one backend is enough)."""
    from readyq_bench.cli import main
    from readyq_bench.loops import STAGES

    if backend.name != "sqlite":
        pytest.skip("one backend is enough for the profile's shape")
    out = tmp_path_factory.mktemp("bench") / "profile.json"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["--quick", "--only", "reference", "--profile", "--json", str(out)]) == 0
    worker = json.loads(out.read_text())["profile"]["worker"]
    assert set(worker["stages"]) == set(STAGES)
    assert worker["ticks"] >= worker["jobs"] / worker["slots"]
    assert all(st["ms_per_tick"] >= 0 for st in worker["stages"].values())
    assert worker["stages"]["persist_and_lease"]["ms_per_tick"] > 0


@pytest.mark.parametrize("analyze", [True, False], ids=["analyze", "no-analyze"])
def test_drain_fill_leaves_planner_statistics_unless_no_analyze(
    backend: Any, analyze: bool
) -> None:
    """The drain's tables are ANALYZEd after filling (PostgreSQL: ``reltuples`` counts
    them), as autovacuum would; ``--no-analyze`` leaves a table never analyzed (-1)."""
    from readyq_bench.config import Config
    from readyq_bench.sections import Bench

    import readyq

    if backend.name != "postgresql":
        pytest.skip("PostgreSQL shows whether a table was analyzed (InnoDB recounts alone)")
    with readyq.Queue(backend.url) as q:
        q.install()
    bench = Bench(Config(analyze=analyze), backend.url, clients=None, log=lambda _: None)
    bench._prefill(30, groups=3)  # no clients: only the fill runs
    with backend.engine().connect() as conn:
        tuples = conn.execute(
            sa.text("SELECT reltuples FROM pg_class WHERE relname = 'readyq_jobs'")
        ).scalar_one()
    assert tuples == (30 if analyze else -1)


def test_no_analyze_flag_turns_the_fill_analyze_off() -> None:
    from readyq_bench.cli import build_parser, config_from

    assert config_from(build_parser().parse_args([])).analyze is True
    assert config_from(build_parser().parse_args(["--no-analyze"])).analyze is False


def test_scan_max_age_flag_sets_the_workers_option() -> None:
    from readyq_bench.cli import build_parser, config_from

    assert config_from(build_parser().parse_args([])).scan_max_age is None
    assert config_from(build_parser().parse_args(["--scan-max-age", "0"])).scan_max_age == 0


def test_scan_max_age_flag_refuses_a_negative_age() -> None:
    from readyq_bench.cli import build_parser, config_from

    with pytest.raises(SystemExit, match="scan-max-age"):
        config_from(build_parser().parse_args(["--scan-max-age", "-1"]))


def test_report_says_which_scan_max_age_the_workers_used(quick_result: dict[str, Any]) -> None:
    assert quick_result["meta"]["config"]["scan_max_age"] is None
    assert "Workers: scan_max_age (the Worker default)" in quick_result["_stdout"]


@pytest.mark.parametrize("age", [0.0, 3600.0], ids=["every-tick", "reused"])
def test_worker_stages_count_the_ticks_that_scanned(backend: Any, age: float) -> None:
    """With ``scan_max_age`` 0 every tick scans; with an hour, most ticks reuse a scan."""
    from readyq_bench import db
    from readyq_bench.loops import worker_stages

    import readyq

    if backend.name != "sqlite":
        pytest.skip("the bookkeeping of the bench, not of the database")
    with readyq.Queue(backend.url) as q:
        q.install()
        db.fill_jobs(q.engine, 60, state="ready", now=q.clock.now_us(), groups=3)
    got = worker_stages(backend.url, 4, 0.005, scan_max_age=age)
    assert got["done"] == 60
    if age == 0:
        assert got["scans"] == got["ticks"]
    else:
        assert 0 < got["scans"] < got["ticks"] / 2


def test_worker_stages_count_the_leases_an_inline_worker_claimed(backend: Any) -> None:
    """Every job of the queue is claimed once, 4 per tick at most, handlers run inline."""
    from readyq_bench import db
    from readyq_bench.loops import worker_stages

    import readyq

    if backend.name != "sqlite":
        pytest.skip("the bookkeeping of the bench, not of the database")
    with readyq.Queue(backend.url) as q:
        q.install()
        db.fill_jobs(q.engine, 30, state="ready", now=q.clock.now_us(), groups=3)
    got = worker_stages(backend.url, 4, 0.005, executor="inline")
    assert (got["done"], got["claimed"]) == (30, 30)
    assert got["ticks"] >= 30 / 4


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind (bench.instructions)")
def test_instructions_counts_a_workers_client_work_per_job(backend: Any) -> None:
    """Drains of 20 and 60 jobs under callgrind: a count per job, start-up cancelled out."""
    from readyq_bench.instructions import count

    import readyq

    if backend.name != "sqlite":
        pytest.skip("a tool's arithmetic: SQLite is enough (one drain takes 15 s)")
    with readyq.Queue(backend.url) as q:
        q.install()
    per_job = count(backend.url, "inline", 20)
    # A no-op job through a Worker and SQLite: hundreds of thousands of instructions,
    # not the hundreds of millions of start-up and imports (counted in both, cancelled).
    assert 10_000 < per_job < 5_000_000, per_job


_SERVER_LOG = """\
03:40:01.100 UTC [11] LOG:  duration: 0.300 ms  bind _pg3_1: WITH picked AS MATERIALIZED
	(SELECT readyq_jobs.id FROM readyq_jobs)
03:40:01.200 UTC [11] LOG:  duration: 0.100 ms  bind _pg3_1: WITH picked AS MATERIALIZED
03:40:01.300 UTC [11] LOG:  duration: 0.450 ms  execute _pg3_1: WITH picked AS MATERIALIZED
03:40:01.400 UTC [12] LOG:  duration: 1.000 ms  statement: COMMIT
03:40:01.500 UTC [12] LOG:  checkpoint starting: time
"""


def test_serverlog_sums_each_statements_phases_costliest_first() -> None:
    """Planning (bind) and running (execute) of one statement are kept apart; lines that
    are not durations are ignored."""
    from readyq_bench.serverlog import parse

    got = [
        (line.phase, line.statement, round(line.ms, 6), line.count) for line in parse(_SERVER_LOG)
    ]
    assert got == [
        ("statement", "COMMIT", 1.0, 1),
        ("execute", "WITH picked AS MATERIALIZED", 0.45, 1),
        ("bind", "WITH picked AS MATERIALIZED", 0.4, 2),
    ]


def test_serverlog_reports_per_job() -> None:
    """Microseconds per job and calls per job, from the totals of a drain of N jobs."""
    from readyq_bench.serverlog import parse, summarize

    table = summarize(parse(_SERVER_LOG), jobs=10)
    assert table.splitlines()[0].strip() == "185.0 us of logged server time per job"
    assert "100.0      0.100   1000.0  statement  COMMIT" in table
