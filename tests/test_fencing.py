"""Every write on behalf of a lease is compare-and-set on (id, token, running)."""

from __future__ import annotations

import pytest

import readyq
from readyq import JobState, LeaseLost

pytestmark = pytest.mark.backend


def stale_and_current(q: readyq.Queue, clock) -> tuple[readyq.Lease, readyq.Lease]:  # type: ignore[no-untyped-def]
    """A lease that expired and was reclaimed and re-claimed, and the one that replaced it."""
    q.enqueue("t", max_attempts=5)
    old = q.claim("w1", ttl=10)[0]
    clock.advance(11)
    assert q.reclaim() == 1
    new = q.claim("w2", ttl=10)[0]
    return old, new


class TestHeartbeat:
    def test_heartbeat_extends_the_lease(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """A live lease's expiry moves to now + ttl."""
        q.enqueue("t")
        lease = q.claim("w", ttl=10)[0]
        clock.advance(5)
        assert q.heartbeat(lease, ttl=10) == clock.now_us() + 10_000_000

    def test_heartbeat_keeps_a_lease_from_reclaim(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """A lease renewed before expiry is not reclaimed."""
        q.enqueue("t")
        lease = q.claim("w", ttl=10)[0]
        clock.advance(8)
        q.heartbeat(lease, ttl=10)
        clock.advance(8)
        assert q.reclaim() == 0

    def test_stale_heartbeat_is_lease_lost(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """A heartbeat with a replaced token raises LeaseLost and changes nothing."""
        old, new = stale_and_current(q, clock)
        with pytest.raises(LeaseLost, match="token 1"):
            q.heartbeat(old)
        assert q.get(new.job_id).lease_expires_at == new.expires_at

    def test_heartbeat_after_finalize_is_lease_lost(self, q: readyq.Queue) -> None:
        """A finished job cannot be revived by a late heartbeat."""
        q.enqueue("t")
        lease = q.claim("w")[0]
        q.finalize(lease)
        with pytest.raises(LeaseLost):
            q.heartbeat(lease)


class TestFinalize:
    def test_finalize_records_result_and_done(self, q: readyq.Queue) -> None:
        """Result and state land together; the lease is cleared."""
        job_id = q.enqueue("t")
        outcome = q.finalize(q.claim("w")[0], {"answer": 42})
        job = q.get(job_id)
        assert (outcome.state, outcome.replayed) == (JobState.DONE, False)
        assert (job.state, job.result, job.lease_owner) == (JobState.DONE, {"answer": 42}, None)

    def test_stale_finalize_is_lease_lost(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """A worker whose lease was reclaimed cannot overwrite the new holder's job."""
        old, new = stale_and_current(q, clock)
        with pytest.raises(LeaseLost):
            q.finalize(old, {"from": "old"})
        job = q.get(new.job_id)
        assert (job.state, job.result, job.lease_token) == (JobState.RUNNING, None, new.token)

    def test_same_worker_id_with_old_token_is_still_fenced(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """The token, not the worker id, fences: one worker re-claiming its job is fenced too."""
        q.enqueue("t", max_attempts=5)
        old = q.claim("w", ttl=10)[0]
        clock.advance(11)
        q.reclaim()
        q.claim("w", ttl=10)
        with pytest.raises(LeaseLost):
            q.finalize(old)

    def test_finalize_retried_with_same_lease_returns_recorded_outcome(
        self, q: readyq.Queue
    ) -> None:
        """A finalize repeated after an unknown outcome replays instead of failing."""
        job_id = q.enqueue("t")
        lease = q.claim("w")[0]
        q.finalize(lease, {"n": 1})
        again = q.finalize(lease, {"n": 2})
        assert (again.state, again.replayed) == (JobState.DONE, True)
        assert q.get(job_id).result == {"n": 1}

    def test_finalize_after_expiry_but_before_reclaim_is_accepted(
        self,
        q: readyq.Queue,
        clock,  # type: ignore[no-untyped-def]
    ) -> None:
        """Expiry only makes a lease reclaimable; until someone reclaims it, it is still held."""
        q.enqueue("t")
        lease = q.claim("w", ttl=10)[0]
        clock.advance(60)
        assert q.finalize(lease).state == JobState.DONE

    def test_non_json_result_is_refused_and_job_stays_running(self, q: readyq.Queue) -> None:
        """A bad result raises InvalidJob before any write."""
        job_id = q.enqueue("t")
        lease = q.claim("w")[0]
        with pytest.raises(readyq.InvalidJob):
            q.finalize(lease, {"x": {1, 2}})
        assert q.get(job_id).state == JobState.RUNNING

    def test_finalize_of_a_cancelled_job_is_lease_lost(self, q: readyq.Queue) -> None:
        """Cancelling a running job retires its lease."""
        job_id = q.enqueue("t")
        lease = q.claim("w")[0]
        assert q.cancel(job_id)
        with pytest.raises(LeaseLost, match="cancelled"):
            q.finalize(lease)


class TestFail:
    def test_failed_attempt_is_retried_after_backoff(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """With attempts left, fail() makes the job ready again after a backoff delay."""
        job_id = q.enqueue("t", max_attempts=3)
        outcome = q.fail(q.claim("w")[0], "flaky")
        job = q.get(job_id)
        assert (outcome.state, job.state, job.error) == (JobState.READY, JobState.READY, "flaky")
        assert q.claim("w") == []
        clock.advance(q.backoff.cap)
        assert len(q.claim("w")) == 1

    def test_last_attempt_fails_for_good(self, q: readyq.Queue) -> None:
        """At max_attempts the job is failed, with the error kept."""
        job_id = q.enqueue("t", max_attempts=1)
        q.fail(q.claim("w")[0], ValueError("bad input"))
        job = q.get(job_id)
        assert (job.state, job.error) == (JobState.FAILED, "ValueError: bad input")

    def test_fail_without_retry_fails_for_good(self, q: readyq.Queue) -> None:
        """retry=False skips the remaining attempts."""
        job_id = q.enqueue("t", max_attempts=5)
        q.fail(q.claim("w")[0], "fatal", retry=False)
        assert q.get(job_id).state == JobState.FAILED

    def test_stale_fail_is_lease_lost(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """A stale worker cannot fail the new holder's job."""
        old, new = stale_and_current(q, clock)
        with pytest.raises(LeaseLost):
            q.fail(old, "late")
        assert q.get(new.job_id).state == JobState.RUNNING

    def test_long_error_is_truncated(self, q: readyq.Queue) -> None:
        """Stored errors are cut to the documented size."""
        job_id = q.enqueue("t", max_attempts=1)
        q.fail(q.claim("w")[0], "x" * 10_000)
        assert len(q.get(job_id).error or "") == readyq.job.MAX_ERROR_CHARS


class TestRelease:
    def test_release_hands_the_job_back_at_once(self, q: readyq.Queue) -> None:
        """A released job is ready immediately and the attempt is not counted."""
        job_id = q.enqueue("t")
        q.release(q.claim("w1")[0])
        lease = q.claim("w2")[0]
        assert (lease.job_id, lease.attempt, lease.token) == (job_id, 1, 2)
