"""Dependencies, containers, failure propagation, cancel and retry."""

from __future__ import annotations

import pytest

import readyq
from readyq import InvalidJob, JobState, UnknownJob

pytestmark = pytest.mark.backend
S = JobState


def run_one(q: readyq.Queue, type_: str | None = None, ok: bool = True) -> int:
    """Claim one job (of ``type_`` if given), finish it, return its id."""
    leases = q.claim("w", limit=100)
    lease = next(lease for lease in leases if type_ in (None, lease.type))
    for other in leases:
        if other is not lease:
            q.release(other)
    if ok:
        q.finalize(lease, {"by": "w"})
    else:
        q.fail(lease, "broken", retry=False)
    return lease.job_id


def states(q: readyq.Queue, *ids: int) -> list[JobState]:
    return [q.get(i).state for i in ids]


class TestPromotion:
    def test_child_becomes_ready_when_its_only_parent_is_done(self, q: readyq.Queue) -> None:
        """Finishing a dependency promotes the job waiting on it, in the same transaction."""
        a = q.enqueue("a")
        b = q.enqueue("b", after=[a])
        run_one(q)
        assert states(q, b) == [S.READY]

    def test_child_waits_for_every_parent(self, q: readyq.Queue) -> None:
        """Fan-in: the child stays blocked until its last parent is done."""
        a, b = q.enqueue("a"), q.enqueue("b")
        child = q.enqueue("c", after=[a, b])
        run_one(q, "a")
        assert (states(q, child), q.get(child).pending_deps) == ([S.BLOCKED], 1)
        run_one(q, "b")
        assert states(q, child) == [S.READY]

    def test_chain_runs_in_dependency_order(self, q: readyq.Queue) -> None:
        """A chain is dispatched strictly one link after the other."""
        with q.graph() as g:
            prev = g.add("n0")
            for i in range(1, 5):
                prev = g.add(f"n{i}", after=[prev])
        order = [q.get(run_one(q)).type for _ in range(5)]
        assert order == ["n0", "n1", "n2", "n3", "n4"]


class TestContainers:
    def test_container_is_done_when_its_last_child_is_done(self, q: readyq.Queue) -> None:
        """Roll-up happens in the finalize of the last child."""
        with q.graph() as g:
            box = g.add("box", container=True)
            g.add("c1", parent=box)
            g.add("c2", parent=box)
        run_one(q)
        assert states(q, box.id) == [S.WAITING]
        run_one(q)
        assert states(q, box.id) == [S.DONE]

    def test_job_after_a_container_waits_for_all_of_it(self, q: readyq.Queue) -> None:
        """Depending on a container means depending on everything inside it."""
        with q.graph() as g:
            box = g.add("box", container=True)
            g.add("c1", parent=box)
            report = g.add("report", after=[box])
        run_one(q, "c1")
        assert states(q, report.id) == [S.READY]

    def test_nested_containers_roll_up_in_turn(self, q: readyq.Queue) -> None:
        """An inner container's roll-up counts as a child finishing for the outer one."""
        with q.graph() as g:
            outer = g.add("outer", container=True)
            inner = g.add("inner", container=True, parent=outer)
            g.add("leaf", parent=inner)
        run_one(q)
        assert states(q, inner.id, outer.id) == [S.DONE, S.DONE]

    def test_child_added_later_keeps_container_open(self, q: readyq.Queue) -> None:
        """A container with unfinished children accepts more children."""
        with q.graph() as g:
            box = g.add("box", container=True)
            g.add("first", parent=box)
        late = q.enqueue("late", parent=box.id)
        run_one(q, "first")
        assert states(q, box.id) == [S.WAITING]
        run_one(q, "late")
        assert (states(q, box.id), q.get(late).parent) == ([S.DONE], box.id)

    def test_finished_container_refuses_children(self, q: readyq.Queue) -> None:
        """A done container cannot grow; the message says how to add children."""
        box = q.enqueue("box", container=True)
        with pytest.raises(InvalidJob, match="same graph"):
            q.enqueue("late", parent=box)


class TestFailurePropagation:
    def test_failed_job_cancels_its_dependents_transitively(self, q: readyq.Queue) -> None:
        """Nothing waits forever on a job that failed for good."""
        a = q.enqueue("a")
        b = q.enqueue("b", after=[a])
        c = q.enqueue("c", after=[b])
        run_one(q, ok=False)
        assert states(q, a, b, c) == [S.FAILED, S.CANCELLED, S.CANCELLED]
        assert q.get(c).error == f"cancelled: dependency {b} ended cancelled"

    def test_failed_child_fails_its_container_once_all_children_end(self, q: readyq.Queue) -> None:
        """A container rolls up failed, naming the child, after its last child ends."""
        with q.graph() as g:
            box = g.add("box", container=True)
            bad = g.add("bad", parent=box)
            g.add("good", parent=box)
        run_one(q, "bad", ok=False)
        assert states(q, box.id) == [S.WAITING]
        run_one(q, "good")
        info = q.get(box.id)
        assert (info.state, info.error) == (
            S.FAILED,
            f"1 child job(s) did not succeed (first: job {bad.id})",
        )

    def test_failed_container_cancels_jobs_after_it(self, q: readyq.Queue) -> None:
        """The roll-up failure propagates to the container's dependents."""
        with q.graph() as g:
            box = g.add("box", container=True)
            g.add("bad", parent=box)
            after = g.add("after", after=[box])
        run_one(q, ok=False)
        assert states(q, after.id) == [S.CANCELLED]

    def test_attempts_exhausted_by_reclaim_propagate(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """A job failed by the sweeper cancels its dependents like any other failure."""
        a = q.enqueue("a", max_attempts=1)
        b = q.enqueue("b", after=[a])
        q.claim("w", ttl=5)
        clock.advance(6)
        q.reclaim()
        assert states(q, a, b) == [S.FAILED, S.CANCELLED]


class TestCancel:
    def test_cancel_ready_job(self, q: readyq.Queue) -> None:
        """A cancelled job is terminal and never claimed."""
        a = q.enqueue("a")
        assert q.cancel(a)
        assert (states(q, a), q.claim("w")) == ([S.CANCELLED], [])

    def test_cancel_container_cancels_its_contents(self, q: readyq.Queue) -> None:
        """Cancelling a container cancels every unfinished job inside it."""
        with q.graph() as g:
            box = g.add("box", container=True)
            c1 = g.add("c1", parent=box)
            inner = g.add("inner", container=True, parent=box)
            c2 = g.add("c2", parent=inner)
        q.cancel(box.id)
        assert states(q, box.id, c1.id, inner.id, c2.id) == [S.CANCELLED] * 4

    def test_cancel_finished_job_changes_nothing(self, q: readyq.Queue) -> None:
        """cancel() of a done job returns False and keeps it done."""
        a = q.enqueue("a")
        run_one(q)
        assert (q.cancel(a), states(q, a)) == (False, [S.DONE])

    def test_cancel_unknown_job_is_unknown_job(self, q: readyq.Queue) -> None:
        """A missing id raises UnknownJob."""
        with pytest.raises(UnknownJob):
            q.cancel(987654321)


class TestRetry:
    def test_retry_runs_a_failed_job_again_with_fresh_attempts(self, q: readyq.Queue) -> None:
        """A failed job becomes ready again, attempts reset, error cleared."""
        a = q.enqueue("a", max_attempts=1)
        run_one(q, ok=False)
        assert q.retry(a)
        info = q.get(a)
        assert (info.state, info.attempts, info.error) == (S.READY, 0, None)

    def test_retry_revives_what_the_failure_cancelled(self, q: readyq.Queue) -> None:
        """Dependents cancelled by the failure come back blocked, and run after it."""
        a = q.enqueue("a")
        b = q.enqueue("b", after=[a])
        c = q.enqueue("c", after=[b])
        run_one(q, ok=False)
        q.retry(a)
        assert states(q, a, b, c) == [S.READY, S.BLOCKED, S.BLOCKED]
        for _ in range(3):
            run_one(q)
        assert states(q, a, b, c) == [S.DONE] * 3

    def test_retry_of_a_child_reopens_its_failed_container(self, q: readyq.Queue) -> None:
        """A container failed by one child waits again when that child is retried."""
        with q.graph() as g:
            box = g.add("box", container=True)
            bad = g.add("bad", parent=box)
            after = g.add("after", after=[box])
        run_one(q, ok=False)
        q.retry(bad.id)
        assert states(q, box.id, after.id) == [S.WAITING, S.BLOCKED]
        run_one(q, "bad")
        assert states(q, box.id, after.id) == [S.DONE, S.READY]

    def test_retry_of_a_container_retries_its_failed_children(self, q: readyq.Queue) -> None:
        """Retrying the container brings back every failed child, not the done ones."""
        with q.graph() as g:
            box = g.add("box", container=True)
            bad = g.add("bad", parent=box)
            good = g.add("good", parent=box)
        run_one(q, "bad", ok=False)
        run_one(q, "good")
        q.retry(box.id)
        assert states(q, box.id, bad.id, good.id) == [S.WAITING, S.READY, S.DONE]
        run_one(q, "bad")
        assert states(q, box.id) == [S.DONE]

    def test_revived_job_still_waiting_on_another_failure_is_cancelled_again(
        self, q: readyq.Queue
    ) -> None:
        """Retry never leaves a job blocked on something that cannot finish."""
        a, b = q.enqueue("a"), q.enqueue("b")
        child = q.enqueue("child", after=[a, b])
        run_one(q, "a", ok=False)
        run_one(q, "b", ok=False)
        q.retry(a)
        assert states(q, child) == [S.CANCELLED]
        assert q.get(child).error == f"cancelled: dependency {b} is not done"

    def test_retry_inside_a_cancelled_container_is_refused(self, q: readyq.Queue) -> None:
        """The container was cancelled on purpose; retry it instead."""
        with q.graph() as g:
            box = g.add("box", container=True)
            child = g.add("child", parent=box)
        q.cancel(box.id)
        with pytest.raises(InvalidJob, match=f"retry container {box.id}"):
            q.retry(child.id)

    def test_retry_of_a_cancelled_container_brings_back_its_contents(self, q: readyq.Queue) -> None:
        """A container cancelled by request comes back with everything cancelled with it."""
        with q.graph() as g:
            box = g.add("box", container=True)
            child = g.add("child", parent=box)
        q.cancel(box.id)
        q.retry(box.id)
        assert states(q, box.id, child.id) == [S.WAITING, S.READY]

    def test_retry_of_a_running_job_changes_nothing(self, q: readyq.Queue) -> None:
        """Only failed or cancelled jobs can be retried."""
        a = q.enqueue("a")
        q.claim("w")
        assert (q.retry(a), states(q, a)) == (False, [S.RUNNING])
