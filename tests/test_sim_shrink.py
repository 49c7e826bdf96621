"""Traces and shrinking: a run's decisions replay exactly, and a failing run shrinks to a
shorter schedule that still fails."""

from __future__ import annotations

from typing import Any

import pytest

try:
    import sim_broken as broken
except ImportError:  # pragma: no cover - tests/ imported as a package
    from tests import sim_broken as broken

from readyq_sim.cli import main
from readyq_sim.config import SimConfig, scenario
from readyq_sim.run import run
from readyq_sim.shrink import Trace, failures, replay, shrink, step_table

pytestmark = pytest.mark.backend


def _server(backend: Any) -> str | None:
    return None if backend.name == "sqlite" else backend.url


def _race() -> SimConfig:
    """A small saturated workload where a racy claim shows up in the first claims."""
    return scenario("quiet", 3).with_(
        jobs=12, workers=3, steps=800, backlog=True, dag_share=0.0, work_min=0.2, work_max=1.0
    )


def test_replaying_a_trace_gives_the_same_digest(backend: Any) -> None:
    """Following a run's recorded decisions sends the same statement stream."""
    res = run(scenario("default", 2).with_(jobs=12, workers=3, steps=800), _server(backend))
    trace = Trace.of(res)
    assert trace.faults
    again = replay(trace, _server(backend))
    assert (again.digest, again.world.driver.diverged) == (res.digest, 0)


def test_trace_round_trips_through_a_gzip_file(tmp_path: Any) -> None:
    """A saved trace loads back with the same config, schedule and faults."""
    trace = Trace(scenario("fencing", 5), ["w1", "w2", "sweeper"], [("w1", 3, "pause")], "x 1")
    path = str(tmp_path / "t.json.gz")
    trace.save(path)
    back = Trace.load(path)
    assert (back.cfg, back.schedule, back.faults) == (trace.cfg, trace.schedule, trace.faults)


def test_shrunk_two_transaction_claim_still_fails_and_is_shorter(backend: Any) -> None:
    """Bisection keeps only the prefix the double dispatch needs; the rest runs serially."""
    res = next(
        r
        for seed in (3, 2, 4)
        if failures(
            r := run(_race().with_(seed=seed), _server(backend), broken.two_transaction_claim())
        )
    )
    got = shrink(Trace.of(res), _server(backend), make_hooks=broken.two_transaction_claim)
    assert got.reproduced
    assert len(got.trace.schedule) < len(got.original.schedule) // 2
    assert "no-double-dispatch" in got.failed
    again = replay(got.trace, _server(backend), broken.two_transaction_claim())
    assert "no-double-dispatch" in failures(again)


def test_shrinking_a_passing_run_finds_nothing(backend: Any) -> None:
    """A run that passes every checker is reported as not reproduced, unchanged."""
    if backend.name != "sqlite":
        pytest.skip("one backend is enough")
    trace = Trace.of(run(_race(), None))
    got = shrink(trace)
    assert (got.reproduced, got.runs, got.trace.schedule) == (False, 1, trace.schedule)


def test_step_table_shows_one_line_per_step_with_completed_operations(backend: Any) -> None:
    """The step table names each step's actor and statement, and the ok events it ended."""
    if backend.name != "sqlite":
        pytest.skip("one backend is enough")
    res = run(_race().with_(steps=200), None)
    table = step_table(res, 120, tail=30).splitlines()
    assert table[0].startswith("step")
    assert "not shown" in table[1]
    assert any("= ok claim" in line for line in table) or any("COMMIT" in line for line in table)


def test_cli_records_and_replays_a_trace(
    backend: Any, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """--trace writes the decision list and --replay-trace reproduces the run's digest."""
    if backend.name != "sqlite":
        pytest.skip("the CLI is exercised once, on SQLite")
    path = str(tmp_path / "run.json.gz")
    assert main(["--seed", "2", "--jobs", "12", "--trace", path]) == 0
    first = capsys.readouterr().out
    assert main(["--replay-trace", path]) == 0
    second = capsys.readouterr().out
    digest = next(line for line in first.splitlines() if "digest" in line)
    assert digest in second
