"""Enqueue validates, writes atomically, and refuses what could never run."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

import readyq
from readyq import CycleError, InvalidJob, JobState, UnknownJob

pytestmark = pytest.mark.backend


def total(q: readyq.Queue) -> int:
    return sum(q.counts().values())


class TestEnqueue:
    def test_new_job_without_dependencies_is_ready(self, q: readyq.Queue) -> None:
        """A job with nothing to wait for is ready at once."""
        job = q.get(q.enqueue("fetch", {"url": "u"}))
        assert (job.state, job.type, job.args) == (JobState.READY, "fetch", {"url": "u"})

    def test_job_keeps_its_settings(self, q: readyq.Queue) -> None:
        """Group, weight, priority, attempts cap and timeout are stored as given."""
        job = q.get(q.enqueue("t", group="g", weight=2.5, priority=-3, max_attempts=7, timeout=1.5))
        assert (job.group, job.weight, job.priority, job.max_attempts, job.timeout) == (
            "g",
            2.5,
            -3,
            7,
            1.5,
        )

    def test_times_keep_microseconds_in_utc(self, q: readyq.Queue) -> None:
        """run_after round-trips to the microsecond, as an aware UTC datetime."""
        when = dt.datetime(2031, 5, 6, 7, 8, 9, 654321, tzinfo=dt.UTC)
        assert q.get(q.enqueue("t", run_after=when)).run_after == when

    def test_job_with_open_dependency_is_blocked(self, q: readyq.Queue) -> None:
        """A job waits while one of its dependencies is not done."""
        a = q.enqueue("a")
        b = q.get(q.enqueue("b", after=[a]))
        assert (b.state, b.pending_deps, b.depends_on) == (JobState.BLOCKED, 1, (a,))

    def test_dependency_already_done_does_not_block(self, q: readyq.Queue) -> None:
        """Depending on a finished job costs nothing: the new job is ready."""
        a = q.enqueue("a")
        q.finalize(q.claim("w")[0])
        assert q.get(q.enqueue("b", after=[a])).state == JobState.READY

    def test_duplicate_key_returns_the_existing_job(self, q: readyq.Queue) -> None:
        """An idempotency key that exists returns that job's id and inserts nothing."""
        first = q.enqueue("t", {"n": 1}, key="k-1")
        assert (q.enqueue("t", {"n": 2}, key="k-1"), total(q)) == (first, 1)

    def test_unknown_dependency_is_refused(self, q: readyq.Queue) -> None:
        """A dependency id that does not exist raises UnknownJob and writes nothing."""
        with pytest.raises(UnknownJob, match="dependency 987654321"):
            q.enqueue("t", after=[987654321])
        assert total(q) == 0

    def test_unknown_parent_is_refused(self, q: readyq.Queue) -> None:
        """A parent id that does not exist raises UnknownJob and writes nothing."""
        with pytest.raises(UnknownJob, match="parent 987654321"):
            q.enqueue("t", parent=987654321)
        assert total(q) == 0

    def test_parent_must_be_a_container(self, q: readyq.Queue) -> None:
        """Only jobs enqueued with container=True hold children."""
        plain = q.enqueue("plain")
        with pytest.raises(InvalidJob, match="not a container"):
            q.enqueue("t", parent=plain)
        assert total(q) == 1

    def test_dependency_on_failed_job_is_refused(self, q: readyq.Queue) -> None:
        """A job that could never run is refused instead of waiting forever."""
        a = q.enqueue("a", max_attempts=1)
        q.fail(q.claim("w")[0], "boom")
        with pytest.raises(InvalidJob, match="retry job"):
            q.enqueue("b", after=[a])

    def test_dependency_on_cancelled_job_is_refused(self, q: readyq.Queue) -> None:
        """Depending on a cancelled job is refused with a hint."""
        a = q.enqueue("a")
        q.cancel(a)
        with pytest.raises(InvalidJob, match="cancelled"):
            q.enqueue("b", after=[a])

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"type": ""}, "type"),
            ({"type": 5}, "type"),
            ({"weight": 0}, "weight"),
            ({"weight": -1}, "weight"),
            ({"weight": float("nan")}, "weight"),
            ({"weight": True}, "weight"),
            ({"priority": 1.5}, "priority"),
            ({"max_attempts": 0}, "max_attempts"),
            ({"timeout": 0}, "timeout"),
            ({"timeout": -2}, "timeout"),
            ({"group": ""}, "group"),
            ({"args": [1]}, "args"),
            ({"args": {"x": {1}}}, "args"),
            ({"after": "abc"}, "after"),
            ({"after": [0]}, "after"),
            ({"run_after": dt.datetime(2030, 1, 1)}, "timezone"),
            ({"run_after": 5}, "run_after"),
            ({"key": ""}, "key"),
        ],
        ids=lambda v: str(v) if isinstance(v, str) else None,
    )
    def test_invalid_argument_is_refused_and_nothing_written(
        self, q: readyq.Queue, kwargs: dict[str, object], match: str
    ) -> None:
        """Each invalid argument raises InvalidJob naming it; the table stays empty."""
        args = {"type": "t", **kwargs}
        with pytest.raises(InvalidJob, match=match):
            q.enqueue(**args)  # type: ignore[arg-type]
        assert total(q) == 0

    def test_enqueue_before_install_says_to_install(self, db_url: str) -> None:
        """Using a database without readyq's tables raises SchemaNotInstalled."""
        with readyq.Queue(db_url) as q, pytest.raises(readyq.SchemaNotInstalled, match="install"):
            q.enqueue("t")

    def test_install_is_idempotent(self, q: readyq.Queue) -> None:
        """install() twice keeps the tables and their rows."""
        q.enqueue("t")
        q.install()
        assert total(q) == 1


class TestGraph:
    def test_graph_inserts_everything_with_edges(self, q: readyq.Queue) -> None:
        """A graph's jobs and dependencies arrive together; handles resolve to ids."""
        with q.graph() as g:
            a = g.add("fetch")
            b = g.add("train", after=[a])
        assert q.get(b.id).depends_on == (a.id,)
        assert q.get(b.id).state == JobState.BLOCKED

    def test_error_inside_graph_writes_nothing(self, q: readyq.Queue) -> None:
        """An invalid add() aborts the whole graph."""
        with pytest.raises(InvalidJob), q.graph() as g:
            g.add("ok")
            g.add("bad", weight=0)
        assert total(q) == 0

    def test_database_error_inside_graph_writes_nothing(self, q: readyq.Queue) -> None:
        """A refusal found at commit (a missing dependency) rolls back every job."""
        with pytest.raises(UnknownJob), q.graph() as g:
            g.add("ok")
            g.add("bad", after=[987654322])
        assert total(q) == 0

    def test_cycle_is_refused(self, q: readyq.Queue) -> None:
        """Jobs that wait for each other are refused with CycleError naming the loop."""
        loop = r"#0 a -> #1 b -> #0 a|#1 b -> #0 a -> #1 b"
        with pytest.raises(CycleError, match=loop), q.graph() as g:
            a = g.add("a")
            b = g.add("b", after=[a])
            g.depends(a, b)
        assert total(q) == 0

    def test_self_dependency_is_a_cycle(self, q: readyq.Queue) -> None:
        """A job that waits for itself is refused."""
        with pytest.raises(CycleError), q.graph() as g:
            a = g.add("a")
            g.depends(a, a)

    def test_job_waiting_for_its_own_container_is_a_cycle(self, q: readyq.Queue) -> None:
        """A container waits for its children, so a child cannot wait for the container."""
        with pytest.raises(CycleError), q.graph() as g:
            box = g.add("box", container=True)
            child = g.add("child", parent=box)
            g.depends(child, box)

    def test_child_waiting_for_existing_ancestor_is_a_cycle(self, q: readyq.Queue) -> None:
        """The same holds for containers that already exist."""
        with q.graph() as g:
            outer = g.add("outer", container=True)
            inner = g.add("inner", container=True, parent=outer)
            g.add("keep-open", parent=inner)
        with pytest.raises(CycleError, match="contains it"):
            q.enqueue("child", parent=inner.id, after=[outer.id])

    def test_container_with_dependencies_is_refused(self, q: readyq.Queue) -> None:
        """Dependencies belong on a container's children, not on the container."""
        a = q.enqueue("a")
        with pytest.raises(InvalidJob, match="container cannot have dependencies"):
            q.enqueue("box", container=True, after=[a])

    def test_container_with_children_waits(self, q: readyq.Queue) -> None:
        """A container never becomes ready; it waits for its children."""
        with q.graph() as g:
            box = g.add("box", container=True)
            g.add("child", parent=box)
        assert q.get(box.id).state == JobState.WAITING

    def test_empty_container_is_done_at_once(self, q: readyq.Queue) -> None:
        """A container committed without children has nothing to wait for."""
        assert q.get(q.enqueue("box", container=True)).state == JobState.DONE

    def test_handle_id_is_unknown_before_commit(self, q: readyq.Queue) -> None:
        """Asking a handle for its id inside the graph is an error, not a wrong number."""
        g = q.graph()
        handle = g.add("a")
        with pytest.raises(InvalidJob, match="after its graph has committed"):
            _ = handle.id

    def test_existing_key_in_graph_resolves_to_existing_job(self, q: readyq.Queue) -> None:
        """A graph node whose key exists becomes that job; edges to it still work."""
        a = q.enqueue("a", key="shared")
        with q.graph() as g:
            again = g.add("a", key="shared")
            b = g.add("b", after=[again])
        assert again.id == a
        assert q.get(b.id).depends_on == (a,)
        assert total(q) == 2


def test_concurrent_enqueues_with_one_key_make_one_job(make_queue, queue_url: str) -> None:  # type: ignore[no-untyped-def]
    """Two queues racing to enqueue the same key both get the one job's id."""
    import threading

    queues = [make_queue() for _ in range(4)]
    ids: list[int] = []
    barrier = threading.Barrier(len(queues))

    def go(q: readyq.Queue) -> None:
        barrier.wait()
        ids.append(q.enqueue("t", key="race"))

    threads = [threading.Thread(target=go, args=(q,)) for q in queues]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine = sa.create_engine(queue_url)
    with engine.connect() as conn:
        n = conn.execute(sa.text("SELECT count(*) FROM readyq_jobs")).scalar()
    engine.dispose()
    assert (len(set(ids)), n) == (1, 1)


class TestHasOpenJobs:
    """Queue.has_open_jobs: whether a worker running until idle still has work to wait for."""

    def test_an_empty_queue_has_none(self, q: readyq.Queue) -> None:
        assert q.has_open_jobs() is False

    def test_a_job_not_yet_due_is_open(self, q: readyq.Queue) -> None:
        q.enqueue("t", run_after=dt.datetime(2999, 1, 1, tzinfo=dt.UTC))
        assert q.has_open_jobs() is True

    def test_a_running_job_is_open(self, q: readyq.Queue) -> None:
        q.enqueue("t")
        assert len(q.claim("w")) == 1
        assert q.has_open_jobs() is True

    def test_a_blocked_job_is_open_until_its_dependency_is_cancelled(self, q: readyq.Queue) -> None:
        """Cancelling the dependency cancels the blocked job too: nothing is left open."""
        a = q.enqueue("t", run_after=dt.datetime(2999, 1, 1, tzinfo=dt.UTC))
        b = q.enqueue("t", after=[a])
        assert q.has_open_jobs() is True
        q.cancel(a)
        assert (q.get(b).state, q.has_open_jobs()) == (JobState.CANCELLED, False)

    def test_finished_jobs_and_their_rolled_up_container_are_not_open(
        self, q: readyq.Queue
    ) -> None:
        with q.graph() as g:
            box = g.add("box", container=True)
            g.add("t", parent=box)
            g.add("t", parent=box)
        for lease in q.claim("w", limit=2):
            q.finalize(lease)
        assert (q.get(box.id).state, q.has_open_jobs()) == (JobState.DONE, False)
