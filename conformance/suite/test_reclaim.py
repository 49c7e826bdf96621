"""Reclaim: expired leases back to ready, hang timeouts, the attempt cap."""

from __future__ import annotations

import pytest
from readyq_conformance.env import ManualClock

import readyq
from readyq import JobState, LeaseLost

S = JobState


@pytest.mark.core
def test_expired_lease_goes_back_to_ready(q: readyq.Queue, clock: ManualClock) -> None:
    """A lease not renewed within its TTL is reclaimed; the next claim has a higher token."""
    job = q.enqueue("t")
    first = q.claim("w1", ttl=10)[0]
    clock.advance(10.000001)
    assert q.reclaim() == 1
    assert (q.get(job).state, q.get(job).lease_owner) == (S.READY, None)
    second = q.claim("w2", ttl=10)[0]
    assert (second.token, second.attempt) == (first.token + 1, 2)


def test_reclaim_is_never_early(q: readyq.Queue, clock: ManualClock) -> None:
    """At the exact expiry instant (and before) the lease is still held."""
    q.enqueue("t")
    q.claim("w1", ttl=10)
    clock.advance(5)
    assert q.reclaim() == 0
    clock.advance(5)
    assert q.reclaim() == 0


def test_attempt_cap_fails_the_job(q: readyq.Queue, clock: ManualClock) -> None:
    """A job that keeps losing its worker fails at max_attempts instead of looping."""
    job = q.enqueue("t", max_attempts=2)
    for _ in range(2):
        q.claim("w", ttl=1)
        clock.advance(2)
        q.reclaim()
    info = q.get(job)
    assert info.state == S.FAILED
    assert "attempts exhausted" in (info.error or "")


def test_hung_job_times_out_while_heart_beating(q: readyq.Queue, clock: ManualClock) -> None:
    """The hang timeout counts from the claim, whatever the heartbeats say."""
    job = q.enqueue("t", timeout=30, max_attempts=1)
    lease = q.claim("w", ttl=10)[0]
    for _ in range(4):
        clock.advance(8)
        q.heartbeat(lease, ttl=10)
    assert q.sweep().timed_out == 1
    assert q.get(job).state == S.FAILED


def test_timed_out_worker_is_fenced(q: readyq.Queue, clock: ManualClock) -> None:
    """The late result of a timed-out handler is rejected; with attempts left it reruns."""
    job = q.enqueue("t", timeout=5, max_attempts=2)
    lease = q.claim("w", ttl=60)[0]
    clock.advance(6)
    q.reclaim()
    assert q.get(job).state == S.READY
    with pytest.raises(LeaseLost):
        q.finalize(lease, {"late": True})
