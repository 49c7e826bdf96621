"""The ready set's shape per group (Queue.scan): exact, or capped at a limit, on every backend.

Both are compared with a pure-Python model of the rows they read: running jobs per group,
ready jobs (state ready, run_after reached) per group, and the group's weight, the
largest among its running jobs and the ready jobs counted. The capped scan counts a
group's first ``limit`` ready jobs in claim order (priority, run_after, id).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import readyq
from readyq import InvalidJob, Worker
from readyq._scan import _ARMS, GroupStats
from readyq.schema import deps, jobs

pytestmark = pytest.mark.backend

#: One job: (group, priority, seconds until run_after, weight, claimed and running).
Spec = tuple[str, int, int, float, bool]


def model(specs: list[tuple[int, Spec]], limit: int | None) -> list[GroupStats]:
    """What a scan must report for ``specs`` = (job id, spec), at the clock's now."""
    running: dict[str, list[float]] = {}
    ready: dict[str, list[tuple[int, int, int, float]]] = {}
    for job_id, (group, priority, delay, weight, claimed) in specs:
        if claimed:
            running.setdefault(group, []).append(weight)
        elif delay <= 0:
            ready.setdefault(group, []).append((priority, delay, job_id, weight))
    out = []
    for group in sorted(running.keys() | ready.keys()):
        counted = sorted(ready.get(group, []))[:limit]
        weights = running.get(group, []) + [r[3] for r in counted]
        out.append(GroupStats(group, len(counted), len(running.get(group, [])), max(weights)))
    return out


def _reset(q: readyq.Queue) -> None:
    """Empty this test's own tables (its database is its own) between examples."""
    with q.engine.begin() as conn:
        conn.execute(sa.delete(deps))
        conn.execute(sa.delete(jobs))


def _enqueue(q: readyq.Queue, specs: list[Spec]) -> list[tuple[int, Spec]]:
    """Enqueue ``specs``; those marked claimed first, each claimed as the only ready job
    (so their delay is not used)."""
    made = []
    for spec in sorted(specs, key=lambda s: not s[4]):
        group, priority, delay, weight, claimed = spec
        run_after = dt.timedelta(seconds=delay) if delay > 0 and not claimed else None
        job_id = q.enqueue("t", group=group, priority=priority, weight=weight, run_after=run_after)
        if claimed:
            assert [lease.job_id for lease in q.claim("w")] == [job_id]
        made.append((job_id, spec))
    return made


spec_st = st.tuples(
    st.sampled_from("abc"),
    st.integers(0, 2),
    st.sampled_from([0, 0, 5]),
    st.sampled_from([1.0, 2.0, 3.5]),
    st.booleans(),
)


def test_the_model_counts_the_first_ready_jobs_in_claim_order() -> None:
    """The oracle itself: a's heavy job is third in claim order, beyond a limit of 2."""
    specs: list[tuple[int, Spec]] = [
        (1, ("a", 0, 0, 1.0, False)),
        (2, ("a", 1, 0, 9.0, False)),
        (3, ("a", 0, 0, 1.0, False)),
        (4, ("b", 0, 5, 1.0, False)),
        (5, ("b", 0, 0, 2.0, True)),
    ]
    assert model(specs, 2) == [GroupStats("a", 2, 0, 1.0), GroupStats("b", 0, 1, 2.0)]
    assert model(specs, None) == [GroupStats("a", 3, 0, 9.0), GroupStats("b", 0, 1, 2.0)]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(specs=st.lists(spec_st, max_size=12), limit=st.one_of(st.none(), st.integers(1, 4)))
def test_scan_reports_what_the_model_of_its_rows_says(
    q: readyq.Queue, specs: list[Spec], limit: int | None
) -> None:
    """Whatever the jobs (priorities, deferred, weights, running) and the limit."""
    _reset(q)
    made = _enqueue(q, specs)
    assert q.scan(limit=limit) == model(made, limit)


class TestCappedScan:
    def test_ready_count_stops_at_the_limit(self, q: readyq.Queue) -> None:
        _enqueue(q, [("a", 0, 0, 1.0, False)] * 5)
        assert q.scan(limit=3) == [GroupStats("a", 3, 0, 1.0)]

    def test_weight_ignores_ready_jobs_beyond_the_limit(self, q: readyq.Queue) -> None:
        """A heavy job fourth in claim order does not weigh its group's next three."""
        _enqueue(q, [("a", 0, 0, 1.0, False)] * 3 + [("a", 1, 0, 9.0, False)])
        assert q.scan(limit=3) == [GroupStats("a", 3, 0, 1.0)]

    def test_weight_counts_a_running_job(self, q: readyq.Queue) -> None:
        _enqueue(q, [("a", 0, 0, 4.0, True), ("a", 0, 0, 1.0, False)])
        assert q.scan(limit=1) == [GroupStats("a", 1, 1, 4.0)]

    def test_a_group_with_only_running_jobs_is_listed(self, q: readyq.Queue) -> None:
        """It holds slots, which fair share counts against the others' shares."""
        _enqueue(q, [("a", 0, 0, 1.0, True), ("b", 0, 0, 1.0, False)])
        assert q.scan(limit=2) == [GroupStats("a", 0, 1, 1.0), GroupStats("b", 1, 0, 1.0)]

    def test_a_group_whose_ready_jobs_are_all_deferred_is_not_listed(
        self, q: readyq.Queue, clock: Any
    ) -> None:
        _enqueue(q, [("a", 0, 5, 1.0, False), ("b", 0, 0, 1.0, False)])
        assert [s.group for s in q.scan(limit=2)] == ["b"]
        clock.advance(5)
        assert [s.group for s in q.scan(limit=2)] == ["a", "b"]

    def test_more_groups_than_one_statement_holds_are_all_counted(self, q: readyq.Queue) -> None:
        names = [f"g{i:03d}" for i in range(_ARMS + 9)]
        _enqueue(q, [(name, 0, 0, 1.0, False) for name in names for _ in range(2)])
        assert q.scan(limit=1) == [GroupStats(name, 1, 0, 1.0) for name in names]

    def test_no_jobs_give_no_groups(self, q: readyq.Queue) -> None:
        assert q.scan(limit=4) == []

    @pytest.mark.parametrize("limit", [0, -1, True, 1.5, "2"])
    def test_a_limit_that_is_not_a_positive_int_is_rejected(
        self, q: readyq.Queue, limit: Any
    ) -> None:
        _enqueue(q, [("a", 0, 0, 1.0, False)])
        with pytest.raises(InvalidJob, match="scan limit must be a positive int"):
            q.scan(limit=limit)


def test_a_workers_scan_counts_ready_jobs_up_to_its_free_slots(q: readyq.Queue) -> None:
    """Three slots, none held: each group's count stops at 3, however many wait."""
    _enqueue(q, [("a", 0, 0, 1.0, False)] * 7 + [("b", 0, 0, 1.0, False)] * 2)
    worker = Worker(q, {"t": lambda ctx, args: None}, limits=[readyq.Concurrency(3)])
    assert worker.scan() == [GroupStats("a", 3, 0, 1.0), GroupStats("b", 2, 0, 1.0)]


def test_reads_run_in_autocommit_exactly_where_the_adapter_says(q: readyq.Queue) -> None:
    """read_autocommit: no BEGIN/ROLLBACK around reads; writes after them still begin."""
    job = q.enqueue("t")
    seen: dict[str, set[bool]] = {"read": set(), "write": set()}
    phase = ["read"]

    def record(conn: sa.Connection, *args: Any) -> None:
        auto = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
        seen[phase[0]].add(auto)

    sa.event.listen(q.engine, "before_cursor_execute", record)
    q.scan(limit=2)
    q.counts()
    q.get(job)
    phase[0] = "write"
    q.cancel(job)
    assert seen == {"read": {q.adapter.read_autocommit}, "write": {False}}


class _Growing(readyq.Limit):
    """A limit that allows one more job each time it is asked (a refilling bucket)."""

    def __init__(self) -> None:
        self.asked = 0

    def available(self, now: float) -> int:
        self.asked += 1
        return self.asked


def test_a_tick_ranks_the_free_slots_its_scan_was_capped_at(q: readyq.Queue) -> None:
    """Free slots are read once per tick: a limit that grew between the scan and the rank
    must not rank more slots than the scan counted ready jobs for."""
    _enqueue(q, [(g, 0, 0, 1.0, False) for g in "abc" for _ in range(3)])
    worker = Worker(q, {"t": lambda ctx, args: None}, limits=[_Growing()])
    report = worker.tick()
    assert sum(report.claimed.values()) == 1
