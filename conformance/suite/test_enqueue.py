"""Enqueue: validation, dependencies, idempotency keys, all-or-nothing graphs."""

from __future__ import annotations

import datetime as dt

import pytest

import readyq
from readyq import CycleError, InvalidJob, JobState, UnknownJob


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"type": ""}, "type"),
        ({"group": ""}, "group"),
        ({"weight": 0}, "weight"),
        ({"weight": float("nan")}, "weight"),
        ({"priority": 1.5}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"timeout": -1}, "timeout"),
        ({"run_after": dt.datetime(2030, 1, 1)}, "timezone"),
        ({"args": {"x": {1, 2}}}, "args"),
        ({"key": ""}, "key"),
    ],
)
def test_invalid_job_is_refused_and_nothing_written(
    q: readyq.Queue, kwargs: dict[str, object], match: str
) -> None:
    """A bad job spec raises InvalidJob and writes no row."""
    spec: dict[str, object] = {"type": "t", **kwargs}
    with pytest.raises(InvalidJob, match=match):
        q.enqueue(**spec)  # type: ignore[arg-type]
    assert sum(q.counts().values()) == 0


def test_enqueue_returns_distinct_ids_and_stores_the_job(q: readyq.Queue) -> None:
    """Each enqueue returns a new id; the row holds what was given."""
    a = q.enqueue("t", {"n": 1}, group="g", priority=3)
    b = q.enqueue("t", {"n": 2})
    info = q.get(a)
    assert a != b
    assert (info.state, info.args, info.group, info.priority) == (JobState.READY, {"n": 1}, "g", 3)


def test_job_with_open_dependency_is_blocked(q: readyq.Queue) -> None:
    """A job whose dependency is not done starts blocked, counting it."""
    a = q.enqueue("a")
    b = q.enqueue("b", after=[a])
    assert (q.get(b).state, q.get(b).pending_deps) == (JobState.BLOCKED, 1)


def test_dependency_on_a_done_job_starts_ready(q: readyq.Queue) -> None:
    """A dependency that already finished does not hold the new job back."""
    a = q.enqueue("a")
    q.finalize(q.claim("w")[0])
    b = q.enqueue("b", after=[a])
    assert (q.get(b).state, q.get(b).pending_deps) == (JobState.READY, 0)


def test_dependency_on_a_failed_job_is_refused(q: readyq.Queue) -> None:
    """A job that could never run (its dependency failed) is refused, not left waiting."""
    a = q.enqueue("a", max_attempts=1)
    q.fail(q.claim("w")[0], "x")
    with pytest.raises(InvalidJob, match="could never run"):
        q.enqueue("b", after=[a])


def test_unknown_dependency_is_refused(q: readyq.Queue) -> None:
    """A dependency id that does not exist raises UnknownJob."""
    with pytest.raises(UnknownJob):
        q.enqueue("b", after=[987654321])


def test_cycle_is_refused_and_nothing_written(q: readyq.Queue) -> None:
    """A graph whose jobs wait for each other is refused as a whole."""
    g = q.graph()
    a = g.add("a")
    b = g.add("b", after=[a])
    g.depends(a, b)
    with pytest.raises(CycleError):
        g.commit()
    assert sum(q.counts().values()) == 0


def test_graph_is_all_or_nothing(q: readyq.Queue) -> None:
    """A graph whose last job is invalid writes none of its jobs."""
    with pytest.raises(UnknownJob), q.graph() as g:  # noqa: PT012 -- the block is the graph
        g.add("a")
        g.add("b", after=[987654321])
    assert sum(q.counts().values()) == 0


def test_idempotency_key_returns_the_existing_job(q: readyq.Queue) -> None:
    """Enqueueing twice with one key gives one job and the same id."""
    a = q.enqueue("t", key="k1")
    assert q.enqueue("t", key="k1") == a
    assert q.counts()["ready"] == 1
