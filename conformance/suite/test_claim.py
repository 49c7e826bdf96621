"""Claims: the ready set, claim order, limits, ranked groups and the lease they return."""

from __future__ import annotations

import datetime as dt

import pytest
from readyq_conformance.env import ManualClock

import readyq
from readyq import JobState


class TestReadySet:
    def test_blocked_job_is_not_claimed(self, q: readyq.Queue) -> None:
        """A job whose dependency is open is never claimed."""
        a = q.enqueue("a")
        q.enqueue("b", after=[a])
        assert [lease.job_id for lease in q.claim("w", limit=10)] == [a]

    def test_container_is_never_claimed(self, q: readyq.Queue) -> None:
        """A container is never dispatched; its children are."""
        with q.graph() as g:
            box = g.add("box", container=True)
            child = g.add("child", parent=box)
        assert [lease.job_id for lease in q.claim("w", limit=10)] == [child.id]

    def test_job_before_run_after_is_not_claimed(self, q: readyq.Queue, clock: ManualClock) -> None:
        """A job is claimable only once the clock reaches its run_after."""
        q.enqueue("later", run_after=dt.timedelta(seconds=10))
        assert q.claim("w") == []
        clock.advance(10)
        assert [lease.type for lease in q.claim("w")] == ["later"]

    @pytest.mark.core
    def test_running_job_is_not_claimed_again(self, q: readyq.Queue) -> None:
        """A leased job is out of the ready set until it is reclaimed or released."""
        q.enqueue("a")
        assert len(q.claim("w1")) == 1
        assert q.claim("w2") == []

    def test_finished_and_cancelled_jobs_are_not_claimed(self, q: readyq.Queue) -> None:
        """Done and cancelled jobs never come back."""
        q.enqueue("a")
        b = q.enqueue("b")
        q.finalize(q.claim("w")[0])
        q.cancel(b)
        assert q.claim("w") == []


class TestOrderAndLimits:
    def test_lower_priority_value_first(self, q: readyq.Queue) -> None:
        """Lower priority values are claimed first."""
        q.enqueue("low", priority=5)
        q.enqueue("high", priority=-5)
        assert [lease.type for lease in q.claim("w", limit=2)] == ["high", "low"]

    def test_earlier_run_after_then_lower_id(self, q: readyq.Queue) -> None:
        """Within a priority: earlier run_after first, then enqueue order."""
        q.enqueue("second")
        q.enqueue("first", run_after=dt.timedelta(seconds=-1))
        q.enqueue("third")
        assert [lease.type for lease in q.claim("w", limit=3)] == ["first", "second", "third"]

    @pytest.mark.core
    def test_limit_caps_the_claim(self, q: readyq.Queue) -> None:
        """A claim returns at most ``limit`` leases, and exactly that many when available."""
        for _ in range(5):
            q.enqueue("t")
        assert len(q.claim("w", limit=3)) == 3
        assert len(q.claim("w", limit=3)) == 2
        assert q.claim("w", limit=3) == []

    @pytest.mark.core
    def test_ranked_groups_come_in_rank_order(self, q: readyq.Queue) -> None:
        """With groups=[...], jobs come from the groups in the order given."""
        for g in ("a", "b", "c"):
            q.enqueue("t", group=g)
        got = [lease.group for lease in q.claim("w", limit=3, groups=["c", "a", "b"])]
        assert got == ["c", "a", "b"]

    def test_repeated_group_asks_for_several_jobs(self, q: readyq.Queue) -> None:
        """A group named twice in the ranking gets two slots."""
        for g in ("a", "a", "b"):
            q.enqueue("t", group=g)
        got = [lease.group for lease in q.claim("w", limit=2, groups=["a", "a", "b"])]
        assert got == ["a", "a"]

    def test_group_named_twice_gets_two_of_the_slots_it_fits_in(self, q: readyq.Queue) -> None:
        """A ranking that fits the limit (one statement where the adapter has one) gives
        a group named twice two jobs."""
        for g in ("a", "a", "a", "b", "b"):
            q.enqueue("t", group=g)
        got = [lease.group for lease in q.claim("w", limit=3, groups=["a", "b", "a"])]
        assert got == ["a", "a", "b"]

    def test_group_without_jobs_falls_through(self, q: readyq.Queue) -> None:
        """An empty group passes its slot down the ranking."""
        q.enqueue("t", group="b")
        assert [lease.group for lease in q.claim("w", groups=["a", "b"])] == ["b"]

    def test_unused_slots_go_to_groups_with_more(self, q: readyq.Queue) -> None:
        """Slots a ranked group cannot use go to ranked groups that have more jobs."""
        for _ in range(3):
            q.enqueue("t", group="a")
        assert len(q.claim("w", limit=3, groups=["a", "b"])) == 3

    def test_unranked_groups_are_not_claimed(self, q: readyq.Queue) -> None:
        """groups= restricts the claim to the groups named."""
        q.enqueue("t", group="other")
        assert q.claim("w", groups=["a"]) == []


class TestLease:
    @pytest.mark.core
    def test_claim_sets_token_attempt_and_exact_expiry(
        self, q: readyq.Queue, clock: ManualClock
    ) -> None:
        """The lease has token 1, attempt 1 and expiry = now + ttl to the microsecond."""
        job = q.enqueue("t", {"x": 1}, group="g")
        lease = q.claim("worker-1", ttl=12.345678)[0]
        assert (lease.job_id, lease.args, lease.group, lease.token, lease.attempt) == (
            job,
            {"x": 1},
            "g",
            1,
            1,
        )
        assert lease.expires_us == clock.now_us() + 12_345_678
        info = q.get(job)
        assert (info.state, info.lease_owner, info.lease_token) == (
            JobState.RUNNING,
            "worker-1",
            1,
        )
        assert info.lease_expires_at == lease.expires_at

    def test_hang_deadline_is_set_from_timeout(self, q: readyq.Queue, clock: ManualClock) -> None:
        """A job with a timeout gets deadline = claim time + timeout."""
        q.enqueue("t", timeout=5)
        assert q.claim("w")[0].deadline_us == clock.now_us() + 5_000_000

    def test_each_claim_increments_the_token(self, q: readyq.Queue) -> None:
        """Re-claiming a released job gives a higher token."""
        q.enqueue("t")
        first = q.claim("w")[0]
        q.release(first)
        second = q.claim("w")[0]
        assert second.token == first.token + 1
