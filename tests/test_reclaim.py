"""The sweeper: expired leases back to ready, hung jobs timed out, attempts capped."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

import readyq
from readyq import JobState, LeaseLost
from readyq.schema import jobs

pytestmark = pytest.mark.backend
S = JobState


def test_expired_lease_goes_back_to_ready(q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
    """A lease not renewed within its TTL is reclaimed, with the reason recorded."""
    job_id = q.enqueue("t")
    q.claim("w1", ttl=10)
    clock.advance(10.000001)
    assert q.reclaim() == 1
    info = q.get(job_id)
    assert (info.state, info.lease_owner, info.error) == (
        S.READY,
        None,
        "lease of worker 'w1' expired without a heartbeat",
    )


def test_reclaim_is_never_early(q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
    """At the exact expiry instant the lease is still held."""
    q.enqueue("t")
    q.claim("w1", ttl=10)
    clock.advance(10)
    assert q.reclaim() == 0


def test_live_lease_is_not_reclaimed(q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
    """A lease within its TTL is left alone."""
    q.enqueue("t")
    q.claim("w1", ttl=10)
    clock.advance(5)
    assert (q.reclaim(), q.counts()["running"]) == (0, 1)


def test_reclaimed_job_gets_a_higher_token(q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
    """The next claim of a reclaimed job carries a new token and counts an attempt."""
    q.enqueue("t")
    first = q.claim("w1", ttl=10)[0]
    clock.advance(11)
    q.reclaim()
    second = q.claim("w2", ttl=10)[0]
    assert (second.token, second.attempt) == (first.token + 1, 2)


def test_attempt_cap_fails_the_job(q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
    """A job that keeps losing its worker fails at max_attempts instead of looping forever."""
    job_id = q.enqueue("t", max_attempts=2)
    for _ in range(2):
        q.claim("w", ttl=1)
        clock.advance(2)
        q.reclaim()
    info = q.get(job_id)
    assert info.state == S.FAILED
    assert info.error is not None
    assert "attempts exhausted (2 of 2)" in info.error


def test_hung_job_is_timed_out_while_heart_beating(q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
    """The hang timeout counts from the claim, whatever the heartbeats say."""
    job_id = q.enqueue("t", timeout=30, max_attempts=1)
    lease = q.claim("w", ttl=10)[0]
    for _ in range(4):
        clock.advance(8)
        q.heartbeat(lease, ttl=10)
    assert q.sweep().timed_out == 1
    info = q.get(job_id)
    assert info.state == S.FAILED
    assert info.error is not None
    assert info.error.startswith("timed out after 30s")


def test_timed_out_job_with_attempts_left_is_retried(q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
    """A timeout is a failed attempt: with attempts left the job is ready again."""
    job_id = q.enqueue("t", timeout=5, max_attempts=2)
    q.claim("w", ttl=60)
    clock.advance(6)
    q.reclaim()
    assert q.get(job_id).state == S.READY


def test_timed_out_worker_is_fenced(q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
    """The late result of a timed-out handler is rejected."""
    q.enqueue("t", timeout=5)
    lease = q.claim("w", ttl=60)[0]
    clock.advance(6)
    q.reclaim()
    with pytest.raises(LeaseLost):
        q.finalize(lease, {"late": True})


def test_reclaim_does_not_wait_behind_an_open_heartbeat(  # type: ignore[no-untyped-def]
    queue: readyq.Queue, make_queue, clock
) -> None:
    """The sweeper skips a row another transaction holds (NOTES 11) and reclaims the rest."""
    if not queue.adapter.skip_locked:
        pytest.skip("needs capability skip_locked (a single-writer database serializes these)")
    q = make_queue(clock)
    held, free = q.enqueue("held"), q.enqueue("free")
    q.claim("w", ttl=1, limit=2)
    clock.advance(2)
    done = threading.Event()
    with q.engine.connect() as conn, conn.begin():
        conn.execute(sa.update(jobs).where(jobs.c.id == held).values(heartbeat_us=1))
        sweeper = threading.Thread(target=lambda: (q.reclaim(), done.set()))
        sweeper.start()
        finished_while_held = done.wait(20)
    sweeper.join()
    assert finished_while_held
    assert [q.get(held).state, q.get(free).state] == [S.RUNNING, S.READY]
