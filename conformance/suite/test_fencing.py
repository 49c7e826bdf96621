"""Fencing: every write on behalf of a lease is compare-and-set on its token."""

from __future__ import annotations

import pytest
from readyq_conformance.env import ManualClock

import readyq
from readyq import JobState, LeaseLost


def stale_and_current(q: readyq.Queue, clock: ManualClock) -> tuple[readyq.Lease, readyq.Lease]:
    """A lease that expired and was reclaimed and re-claimed, and the one that replaced it."""
    q.enqueue("t", max_attempts=5)
    old = q.claim("w1", ttl=10)[0]
    clock.advance(11)
    assert q.reclaim() == 1
    new = q.claim("w2", ttl=10)[0]
    return old, new


def test_heartbeat_extends_a_live_lease(q: readyq.Queue, clock: ManualClock) -> None:
    """A heartbeat moves expiry to now + ttl, and keeps the lease from being reclaimed."""
    q.enqueue("t")
    lease = q.claim("w", ttl=10)[0]
    clock.advance(8)
    assert q.heartbeat(lease, ttl=10) == clock.now_us() + 10_000_000
    clock.advance(8)
    assert q.reclaim() == 0


@pytest.mark.core
def test_stale_heartbeat_is_lease_lost(q: readyq.Queue, clock: ManualClock) -> None:
    """A heartbeat with a replaced token raises LeaseLost and changes nothing."""
    old, new = stale_and_current(q, clock)
    with pytest.raises(LeaseLost):
        q.heartbeat(old)
    assert q.get(new.job_id).lease_expires_at == new.expires_at


@pytest.mark.core
def test_stale_finalize_is_lease_lost(q: readyq.Queue, clock: ManualClock) -> None:
    """A worker whose lease was reclaimed cannot overwrite the new holder's job."""
    old, new = stale_and_current(q, clock)
    with pytest.raises(LeaseLost):
        q.finalize(old, {"from": "old"})
    job = q.get(new.job_id)
    assert (job.state, job.result, job.lease_token) == (JobState.RUNNING, None, new.token)


def test_same_worker_with_old_token_is_fenced(q: readyq.Queue, clock: ManualClock) -> None:
    """The token, not the worker id, fences: a worker that got its job back is fenced too."""
    q.enqueue("t", max_attempts=5)
    old = q.claim("w", ttl=10)[0]
    clock.advance(11)
    q.reclaim()
    q.claim("w", ttl=10)
    with pytest.raises(LeaseLost):
        q.finalize(old)


def test_stale_fail_is_lease_lost(q: readyq.Queue, clock: ManualClock) -> None:
    """A stale worker cannot fail the new holder's job."""
    old, new = stale_and_current(q, clock)
    with pytest.raises(LeaseLost):
        q.fail(old, "late")
    assert q.get(new.job_id).state == JobState.RUNNING


def test_reclaim_does_not_touch_a_renewed_lease(q: readyq.Queue, clock: ManualClock) -> None:
    """A lease renewed before the sweep is not reclaimed: the sweep re-checks expiry."""
    q.enqueue("t")
    lease = q.claim("w", ttl=10)[0]
    clock.advance(9)
    q.heartbeat(lease, ttl=10)
    clock.advance(9)
    assert q.reclaim() == 0
    assert q.get(lease.job_id).lease_token == lease.token


@pytest.mark.core
def test_finalize_retry_with_the_same_lease_replays(q: readyq.Queue) -> None:
    """A finalize repeated after an unknown outcome returns the recorded outcome."""
    job = q.enqueue("t")
    lease = q.claim("w")[0]
    q.finalize(lease, {"n": 1})
    again = q.finalize(lease, {"n": 2})
    assert (again.state, again.replayed) == (JobState.DONE, True)
    assert q.get(job).result == {"n": 1}


def test_finalize_after_expiry_but_before_reclaim_is_accepted(
    q: readyq.Queue, clock: ManualClock
) -> None:
    """Expiry only makes a lease reclaimable; until reclaimed it is still held."""
    q.enqueue("t")
    lease = q.claim("w", ttl=10)[0]
    clock.advance(60)
    assert q.finalize(lease).state == JobState.DONE


def test_finalize_of_a_cancelled_job_is_lease_lost(q: readyq.Queue) -> None:
    """Cancelling a running job retires its lease."""
    job = q.enqueue("t")
    lease = q.claim("w")[0]
    assert q.cancel(job)
    with pytest.raises(LeaseLost):
        q.finalize(lease)
