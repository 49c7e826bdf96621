"""Concurrency: claimers on separate connections get disjoint jobs and do not wait."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import sqlalchemy as sa
from readyq_conformance._threads import Attempt
from readyq_conformance.env import Env, ManualClock

import readyq
from readyq import JobState, _claim, graph
from readyq.schema import jobs

c = jobs.c


def fill(q: readyq.Queue, n: int) -> set[int]:
    with q.graph() as g:
        handles = [g.add("noop", {"i": i}, group=f"g{i % 3}") for i in range(n)]
    return {h.id for h in handles}


def _drain(
    q: readyq.Queue,
    name: str,
    events: list[tuple[str, int, int]],
    groups: list[str] | None = None,
) -> None:
    # By groups: one job asked of each, so the shares fit the limit (a Worker's claim).
    limit = 2 if groups is None else len(groups)
    idle = 0
    while idle < 3:
        leases = q.claim(name, limit=limit, ttl=600, groups=groups)
        if not leases:
            idle += 1
            continue
        idle = 0
        for lease in leases:
            events.append((name, lease.job_id, lease.token))
            q.finalize(lease, {"by": name})


@pytest.mark.core
@pytest.mark.parametrize(
    "groups", [None, ["g1", "g0", "g2"]], ids=["in claim order", "by ranked groups"]
)
def test_concurrent_claimers_get_disjoint_jobs(env: Env, groups: list[str] | None) -> None:
    """6 threads, each on its own connection, drain 60 jobs (claiming in priority order,
    or by a ranking of their 3 groups): each job runs exactly once."""
    q = env.queue()
    ids = fill(q, 60)
    events: list[tuple[str, int, int]] = []
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            _drain(env.queue(), f"t{k}", events, groups)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, f"claimers failed: {errors[:3]}"
    claims = Counter(job for _, job, _ in events)
    twice = sorted(j for j, n in claims.items() if n > 1)
    assert not twice, f"jobs handed to two claimers: {twice[:10]}"
    assert set(claims) == ids, "every job was claimed"
    assert q.counts()["done"] == 60


@pytest.mark.core
def test_simultaneous_claims_each_get_a_job(env: Env) -> None:
    """4 claims started together, with 8 jobs ready: each gets exactly one, all different."""
    q = env.queue()
    fill(q, 8)
    queues = [env.queue() for _ in range(4)]
    for other in queues:
        other.counts()  # connect before the race
    barrier = threading.Barrier(4)

    def claim(k: int) -> list[int]:
        barrier.wait()
        return [lease.job_id for lease in queues[k].claim(f"w{k}", ttl=600)]

    attempts = [Attempt(lambda k=k: claim(k), f"claimer-{k}") for k in range(4)]
    got = [a.result(60) for a in attempts]
    assert all(len(g) == 1 for g in got), f"claims returned {got} with 8 jobs ready"
    flat = [j for g in got for j in g]
    assert len(set(flat)) == 4, f"two claimers got the same job: {got}"


@pytest.mark.core
@pytest.mark.requires("skip_locked")
def test_claimers_never_wait_on_each_other(env: Env) -> None:
    """While one claim transaction is open, another claim returns at once with another job."""
    q = env.queue()
    fill(q, 3)
    other = env.queue()
    other.counts()
    with env.write() as (conn, ad):
        held = _claim.claim(
            conn, ad, worker_id="a", now=q.clock.now_us(), ttl_us=10**7, limit=1, groups=None
        )
        second = Attempt(lambda: other.claim("b"), "second-claimer")
        finished = second.wait(env.block_timeout * 3)
    assert finished, "the second claimer waited for the first claim transaction"
    got = second.result(30)
    assert len(got) == 1, got
    assert got[0].job_id != held[0].job_id, (held, got)


@pytest.mark.requires("serialized_writers")
def test_serialized_claimers_wait_then_take_another_job(env: Env) -> None:
    """With one writer at a time, a second claim waits for the first, then takes another job."""
    q = env.queue()
    fill(q, 2)
    other = env.queue()
    with env.write() as (conn, ad):
        held = _claim.claim(
            conn, ad, worker_id="a", now=q.clock.now_us(), ttl_us=10**7, limit=1, groups=None
        )
        second = Attempt(lambda: other.claim("b"), "second-claimer")
        second.wait(env.block_timeout)
    got = second.result(60)
    assert [le.job_id for le in got] != [held[0].job_id]
    assert len(got) == 1


@pytest.mark.core
@pytest.mark.requires("concurrent_writers")
def test_open_claim_does_not_block_enqueue(env: Env) -> None:
    """An enqueue commits while a claim transaction is open (InnoDB gap locks would block it)."""
    q = env.queue()
    fill(q, 5)
    other = env.queue()
    other.counts()
    with env.write() as (conn, ad):
        got = _claim.claim(
            conn, ad, worker_id="w", now=q.clock.now_us(), ttl_us=10**7, limit=1, groups=None
        )
        assert len(got) == 1
        enq = Attempt(lambda: other.enqueue("new", priority=-1), "enqueuer")
        finished = enq.wait(env.block_timeout * 3)
    enq.result(60)
    assert finished, "the enqueue waited for the open claim transaction"


@pytest.mark.requires("key_share_lock")
def test_open_dependency_insert_does_not_hide_a_ready_job(env: Env) -> None:
    """A claimer still sees (and takes) a ready job another transaction is adding a dependent to."""
    q = env.queue(ManualClock())
    parent = q.enqueue("parent")
    claimer = env.queue()
    claimer.counts()
    g = q.graph()
    g.add("child", after=[parent])
    with env.write() as (conn, ad):
        graph._insert(conn, ad, g._order(), q.clock.now_us())
        att = Attempt(lambda: [le.job_id for le in claimer.claim("w")], "claimer")
        finished = att.wait(env.block_timeout * 3)
    assert finished, "the claim waited for the open dependency insert"
    assert att.result(30) == [parent]


@pytest.mark.requires("skip_locked")
def test_open_dependency_insert_does_not_block_claim(env: Env) -> None:
    """A claim returns at once while another transaction adds a dependent to a ready job."""
    q = env.queue(ManualClock())
    parent = q.enqueue("parent")
    claimer = env.queue()
    claimer.counts()
    g = q.graph()
    g.add("child", after=[parent])
    with env.write() as (conn, ad):
        graph._insert(conn, ad, g._order(), q.clock.now_us())
        att = Attempt(lambda: claimer.claim("w"), "claimer")
        finished = att.wait(env.block_timeout * 3)
    att.result(30)
    assert finished, "the claim waited for the open dependency insert"


@pytest.mark.requires("skip_locked")
def test_reclaim_does_not_wait_behind_an_open_heartbeat(env: Env, clock: ManualClock) -> None:
    """The sweeper skips a row another transaction holds and reclaims the rest."""
    q = env.queue(clock)
    held, free = q.enqueue("held"), q.enqueue("free")
    q.claim("w", ttl=1, limit=2)
    clock.advance(2)
    sweeper = env.queue(clock)
    sweeper.counts()
    with env.write() as (conn, _):
        conn.execute(sa.update(jobs).where(c.id == held).values(heartbeat_us=1))
        att = Attempt(sweeper.reclaim, "sweeper")
        finished = att.wait(env.block_timeout * 3)
    att.result(60)
    assert finished, "the sweeper waited behind the open heartbeat"
    assert [q.get(held).state, q.get(free).state] == [JobState.RUNNING, JobState.READY]
