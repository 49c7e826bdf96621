"""The simulator: fixed seeds pass every checker on every backend, runs replay exactly, and
deliberately broken variants of readyq (tests/sim_broken.py) are caught."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from freezegun import freeze_time

import readyq

try:
    import sim_broken as broken
except ImportError:  # pragma: no cover - tests/ imported as a package
    from tests import sim_broken as broken

from readyq_sim.checkers import Check, check_all
from readyq_sim.cli import main
from readyq_sim.clock import DEFAULT_START_US
from readyq_sim.config import FAULT_KINDS, FaultPlan, scenario
from readyq_sim.run import RunResult, run
from readyq_sim.world import Hooks

pytestmark = pytest.mark.backend

#: The fixed seed set CI runs per backend (default scenario, swarm faults from the seed; every
#: fault kind is on in at least one of their plans).
SEEDS = (1, 2, 3, 4)
#: A broken variant must be caught within this many seeds.
BUDGET = (1, 2, 3)


def _server(backend: Any) -> str | None:
    """The URL the simulator gets: it makes a fresh database of its own on that server."""
    return None if backend.name == "sqlite" else backend.url


def _checks(res: RunResult) -> list[Check]:
    return check_all(res.world, res.final, res.live)


def _failed(checks: list[Check]) -> dict[str, str | None]:
    return {c.name: c.first for c in checks if c.ok is False}


def test_the_seed_set_turns_on_every_fault_kind() -> None:
    """Swarm testing over SEEDS draws every kind the simulator knows at least once."""
    drawn = {kind for seed in SEEDS for kind in scenario("default", seed).faults.p}
    assert drawn == set(FAULT_KINDS)


@pytest.mark.parametrize("seed", SEEDS)
def test_default_scenario_passes_every_checker(backend: Any, seed: int) -> None:
    """A faulty default run (swarm faults) ends quiet with every checker green."""
    res = run(scenario("default", seed), _server(backend))
    assert res.stuck is None
    assert not res.actor_errors
    assert _failed(_checks(res)) == {}
    assert res.live


@pytest.mark.slow
def test_fencing_scenario_passes_and_exercises_fencing(backend: Any) -> None:
    """Paused workers come back to LeaseLost, never to an accepted stale write."""
    res = run(scenario("fencing", 1), _server(backend))
    checks = {c.name: c for c in _checks(res)}
    assert _failed(list(checks.values())) == {}
    assert checks["fencing"].counts["stale_rejected"] > 0
    assert res.world.faults["pause"] > 0


def test_fair_share_scenario_stays_within_its_lag_bound(backend: Any) -> None:
    """Saturated tenants 1/1/8 get their weighted share within workers * limit + 1 slots."""
    res = run(scenario("fair-share", 1), _server(backend))
    fair = next(c for c in _checks(res) if c.name == "fair-share")
    assert fair.ok is True, fair.first
    assert fair.counts["window"] > 50


def test_same_seed_gives_the_same_digest(backend: Any) -> None:
    """Two runs of one seed on fresh databases send the same statement stream."""
    cfg = scenario("default", 2).with_(jobs=30)
    first, second = run(cfg, _server(backend)), run(cfg, _server(backend))
    assert (first.steps, first.digest) == (second.steps, second.digest), _first_difference(
        first.trace, second.trace
    )


def _first_difference(a: list[str], b: list[str]) -> str:
    """Where two traces part (what a failed replay needs first), with the lines before."""
    same = zip(a, b, strict=False)  # traces of different lengths part where one ends
    k = next((i for i, (x, y) in enumerate(same) if x != y), min(len(a), len(b)))

    def show(trace: list[str]) -> str:
        return "\n".join(f"  {line[:200]}" for line in trace[max(0, k - 3) : k + 2])

    return f"traces part at line {k}:\nfirst run:\n{show(a)}\nsecond run:\n{show(b)}"


def test_statements_sent_in_one_pipeline_are_scheduled_and_recorded_as_one_step(
    backend: Any,
) -> None:
    """Where finalize commits in one round trip (PostgreSQL's pipeline), the interleaver
    still sees it, so the checkers cover the path production takes."""
    with readyq.Queue(backend.engine()) as q:
        if not q.adapter.commit_together_capable:
            pytest.skip("needs capability commit_together_capable")
    res = run(scenario("quiet", 1).with_(jobs=10), _server(backend))
    whats = [line.split("|")[2] for line in res.trace]
    # The finalize's lock in a pipeline: after the adapter's plan setting, before its
    # update + promotion (which the trace's cut text may leave out).
    lock = ";\nSELECT readyq_jobs.id, readyq_jobs.state, readyq_jobs.lease_token"
    pipelined = [w for w in whats if lock in w or ";\nWITH fin AS" in w]
    assert pipelined  # (jobs inside a container take the transaction instead)
    assert _failed(_checks(res)) == {}


def test_a_crash_after_a_finalize_pipeline_that_committed_nothing_is_no_finalize(
    backend: Any,
) -> None:
    """A job inside a container is finalized by a transaction, after a pipeline that
    committed nothing; a worker that crashes inside that transaction finalized nothing.
    Seed 12 crashes there (the history said "maybe committed", and the checker then
    reported a second effective finalize when the reclaimed job was finalized again)."""
    with readyq.Queue(backend.engine()) as q:
        if not q.adapter.commit_together_capable:
            pytest.skip("needs capability commit_together_capable")
    res = run(scenario("default", 12), _server(backend))
    crashed = [
        e
        for e in res.world.history.events
        if e.f == "finalize" and e.detail.get("error") == "crashed" and e.job is not None
    ]
    boxed = [e for e in crashed if res.world.jobs[e.job].container_id is not None]
    assert boxed, "seed 12 no longer crashes a finalize of a job inside a container"
    assert all(e.type == "fail" and e.commit_step is None for e in boxed)
    assert _failed(_checks(res)) == {}


def test_different_seeds_give_different_schedules(backend: Any) -> None:
    """The digest depends on the seed (it is not trivially constant)."""
    a = run(scenario("quiet", 1).with_(jobs=15), _server(backend))
    b = run(scenario("quiet", 2).with_(jobs=15), _server(backend))
    assert a.digest != b.digest


def _caught(
    backend: Any, name: str, make: Callable[[], Hooks], seeds: tuple[int, ...] = BUDGET
) -> tuple[int, dict[str, str | None]]:
    """The first seed of ``seeds`` on which scenario ``name`` fails a checker, and how."""
    for seed in seeds:
        failed = _failed(_checks(run(scenario(name, seed), _server(backend), make())))
        if failed:
            return seed, failed
    return 0, {}


class TestBrokenVariantsAreCaught:
    @pytest.mark.slow
    def test_two_transaction_claim_is_double_dispatch(self, backend: Any) -> None:
        """Picking ids in one transaction and taking them in another dispatches twice."""
        seed, failed = _caught(backend, "quiet", broken.two_transaction_claim)
        assert "no-double-dispatch" in failed, f"seed {seed} of {BUDGET}: {failed}"

    @pytest.mark.slow
    def test_unfenced_finalize_accepts_stale_tokens(
        self, backend: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A finalize by job id alone lets a paused worker overwrite the new holder."""
        seed, failed = _caught(backend, "fencing", lambda: broken.unfenced_finalize(monkeypatch))
        assert "fencing" in failed, f"seed {seed} of {BUDGET}: {failed}"

    @pytest.mark.slow
    def test_reclaiming_live_leases_is_caught(
        self, backend: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A sweeper that reclaims before expiry takes leases from live workers."""
        seed, failed = _caught(backend, "quiet", lambda: broken.reclaim_live_leases(monkeypatch))
        assert {"reclaim-not-early", "no-double-dispatch"} & set(failed), f"seed {seed}: {failed}"

    def test_seed_fair_share_breaks_the_lag_bound(self, backend: Any) -> None:
        """The seed's rounding fair_share serves 1/1/8 tenants far from 10/10/80."""
        seed, failed = _caught(backend, "fair-share", broken.seed_fair_share, seeds=(1,))
        assert "fair-share" in failed, f"seed {seed}: {failed}"

    def test_claim_without_locks_or_state_guard_is_double_dispatch(
        self, backend: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Dropping the lock clause and the UPDATE's state re-check hands one job to two."""
        seed, failed = _caught(backend, "quiet", lambda: broken.unguarded_claim(monkeypatch))
        assert {"tokens", "no-double-dispatch"} & set(failed), f"seed {seed}: {failed}"

    def test_sqlite_claim_without_begin_immediate_or_state_guard_is_double_dispatch(
        self, backend: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without BEGIN IMMEDIATE, Python's sqlite3 runs the claim's SELECT before the
        deferred transaction it begins at the UPDATE; with no state re-check either, two
        claimers that read the same ready row both take it."""
        if backend.name != "sqlite":
            pytest.skip("SQLite only")

        def make() -> Hooks:
            return broken.sqlite_deferred_unguarded(monkeypatch)

        seed, failed = _caught(backend, "quiet", make)
        assert "no-double-dispatch" in failed, f"seed {seed} of {BUDGET}: {failed}"


def test_claim_without_locks_only_loses_races(backend: Any) -> None:
    """Dropping SKIP LOCKED (and BEGIN IMMEDIATE) cannot double-dispatch while the claim
    UPDATE re-checks ``state = 'ready'``: the UPDATE sees the row's latest committed version
    (PostgreSQL re-evaluates its WHERE after the row lock, MariaDB's READ COMMITTED UPDATE
    reads semi-consistently, SQLite has one writer), so a row another claim took in between
    is skipped and the claim comes back short. SKIP LOCKED buys throughput, the state
    re-check buys safety; the variant that drops both is caught above."""
    res = run(scenario("quiet", 1), _server(backend), broken.no_locking())
    assert _failed(_checks(res)) == {}


def test_sqlite_without_begin_immediate_stays_correct(backend: Any) -> None:
    """A claim whose SELECT runs outside the (deferred) write transaction only loses races
    while the UPDATE re-checks the state; without the re-check it is caught above."""
    if backend.name != "sqlite":
        pytest.skip("SQLite only")
    res = run(scenario("quiet", 1), None, broken.sqlite_deferred())
    assert _failed(_checks(res)) == {}


def test_sqlite_deferred_transaction_loses_its_write_upgrade_but_never_double_dispatches(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN DEFERRED with the SELECT inside it, and no state re-check: still exclusive, and
    no broken variant of this kind can be caught, because SQLite allows one writer and a
    deferred transaction whose read snapshot another writer has overtaken cannot upgrade to
    a writer (SQLITE_BUSY / SQLITE_BUSY_SNAPSHOT, "database is locked"). The upgrade loses
    with an error readyq retries from the start, never by overwriting; BEGIN IMMEDIATE only
    saves those failed attempts (and lets the busy timeout wait instead of failing)."""
    if backend.name != "sqlite":
        pytest.skip("SQLite only")
    res = run(scenario("quiet", 1), None, broken.sqlite_begin_deferred_unguarded(monkeypatch))
    assert res.world.driver.blocked["UPDATE"] > 0  # upgrades that lost
    assert _failed(_checks(res)) == {}


def test_readyq_reads_no_system_clock_during_a_run(backend: Any) -> None:
    """With wall time frozen in 2001, every timestamp readyq wrote is virtual (2026 on)."""
    if backend.name != "sqlite":
        pytest.skip("one backend is enough for the tripwire")
    with freeze_time("2001-01-01"):
        res = run(scenario("default", 1).with_(jobs=20), None)
    stamps = [
        row[k]
        for row in res.final.values()
        for k in ("created_us", "started_us", "finished_us")
        if row[k] is not None
    ]
    assert stamps
    assert min(stamps) >= DEFAULT_START_US
    assert _failed(_checks(res)) == {}


def test_cli_default_run_reports_and_exits_zero(
    backend: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """`readyq sim --seed 1` prints checkers and a replay line, writes JSON, exits 0."""
    if backend.name != "sqlite":
        pytest.skip("the CLI is exercised once, on SQLite")
    out = tmp_path / "report.json"
    md = tmp_path / "report.md"
    assert main(["--seed", "1", "--jobs", "20", "--json", str(out), "--markdown", str(md)]) == 0
    text = capsys.readouterr().out
    assert "replay: python -m readyq_sim --seed 1" in text
    assert "PASS  no-double-dispatch" in text
    rep = json.loads(out.read_text())
    assert rep["ok"]
    assert {c["verdict"] for c in rep["checks"]} <= {"PASS", "n/a"}
    assert "| checker | verdict |" in md.read_text()


def test_cli_check_determinism_compares_two_runs(
    backend: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """--check-determinism runs the seed twice and reports the same digest."""
    if backend.name != "sqlite":
        pytest.skip("the CLI is exercised once, on SQLite")
    assert main(["--seed", "4", "--jobs", "15", "--check-determinism", "-q"]) == 0
    assert "PASS seed 4" in capsys.readouterr().out


def test_cli_rejects_an_unknown_fault_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt --faults kind is a usage error (exit 2), not a silent no-fault run."""
    assert main(["--faults", "crash,gremlins"]) == 2
    assert "gremlins" in capsys.readouterr().err


def test_ttl_sweep_low_ratio_with_lagging_clocks_reclaims_live_leases_but_never_double_commits(
    backend: Any,
) -> None:
    """L/h = 1.5 with pauses and +/-h skew: live leases are reclaimed, fencing still holds."""
    if backend.name != "sqlite":
        pytest.skip("the experiment runs on SQLite")
    from readyq_sim import ttl

    row = ttl.measure(ttl.Cell(1.5, "exp", 1), seeds=(1,))
    assert row.false_reclaims > 0
    assert (row.double_commits, row.checker_failures) == (0, 0)


def test_ttl_sweep_default_ratio_without_pauses_recovers_within_the_band(backend: Any) -> None:
    """L/h = 3, no pauses or skew: no false reclaim, every crash reclaimed in [L-h, L+S]."""
    if backend.name != "sqlite":
        pytest.skip("the experiment runs on SQLite")
    from readyq_sim import ttl

    d = ttl.measure(ttl.Cell(3.0, "none", 0), seeds=(1,)).as_dict()
    assert d["false_reclaims"] == 0
    assert d["recovery_n"] > 0
    assert d["recovery_in_band"] == d["recovery_n"]
    assert "| L/h |" in ttl.markdown([ttl.measure(ttl.Cell(8.0, "none", 0), seeds=())])


def test_slow_commits_keep_every_guarantee(backend: Any) -> None:
    """Finalizes whose COMMIT is held while others run (locks kept) break no checker."""
    res = run(scenario("default", 3, ("slow_commit", "crash")), _server(backend))
    assert res.world.faults["slow_commit"] > 0
    assert _failed(_checks(res)) == {}


def test_transactions_hung_on_their_locks_keep_every_guarantee(backend: Any) -> None:
    """Claims, heartbeats and finalizes that stall holding their locks while others run, then
    commit late or have their session killed, break no checker, and the run goes quiet."""
    plan = FaultPlan({"hang_in_txn": 0.05, "crash": 0.04})
    heals: set[str] = set()
    # Each hang heals one way or the other at random: seeds until both ways have run
    # (seed 1 drew only late commits once the grouped claim became one statement).
    for seed in range(1, 6):
        res = run(scenario("default", seed).with_(jobs=30, faults=plan), _server(backend))
        heals |= {e.detail["heal"] for e in res.world.history.events if e.f == "hang_end"}
        assert (res.stuck, res.actor_errors) == (None, {}), f"seed {seed}"
        assert _failed(_checks(res)) == {}, f"seed {seed}"
        if heals == {"commit", "kill"}:
            break
    assert heals == {"commit", "kill"}
    assert res.live
