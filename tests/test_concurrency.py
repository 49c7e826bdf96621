"""Races between real connections: threads and processes claiming from one queue."""

from __future__ import annotations

import multiprocessing
import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
import sqlalchemy as sa

import readyq
from readyq import JobState
from readyq.graph import _insert
from readyq.schema import jobs

try:
    from tests.racers import drain, drain_fused
except ImportError:
    from racers import drain, drain_fused  # type: ignore[no-redef]

pytestmark = [pytest.mark.backend, pytest.mark.concurrency]
JOBS = 240
Event = tuple[str, int, int, str]


def fill(q: readyq.Queue, n: int = JOBS) -> set[int]:
    with q.graph() as g:
        handles = [g.add("noop", {"i": i}, group=f"g{i % 3}") for i in range(n)]
    return {h.id for h in handles}


def check_exactly_once(events: list[tuple[str, int, int, str]], ids: set[int]) -> None:
    claims = Counter(job for kind, job, _, _ in events if kind == "claim")
    finals = Counter(job for kind, job, _, _ in events if kind == "finalize")
    assert set(claims) == ids, "every job was claimed"
    assert max(claims.values()) == 1, "no job was handed to two claimers"
    assert finals == claims, "every claim was finalized exactly once"


@pytest.mark.parametrize("loop", [drain, drain_fused], ids=["finalize", "finalize_and_claim"])
@pytest.mark.parametrize("limit", [1, 4])
def test_eight_threads_claim_disjoint_jobs(
    queue_url: str, queue: readyq.Queue, limit: int, loop: Callable[..., list[Event]]
) -> None:
    """8 threads, each on its own connection, drain the queue; each job runs exactly once
    (results finalized on their own, or committed with the next claim)."""
    ids = fill(queue)
    with ThreadPoolExecutor(8) as pool:
        results = pool.map(loop, [queue_url] * 8, [f"t{i}" for i in range(8)], [limit] * 8)
        events = [e for r in results for e in r]
    check_exactly_once(events, ids)
    assert queue.counts()["done"] == JOBS


@pytest.mark.parametrize("loop", [drain, drain_fused], ids=["finalize", "finalize_and_claim"])
def test_eight_threads_claiming_by_ranked_groups_take_disjoint_jobs(
    queue_url: str, queue: readyq.Queue, loop: Callable[..., list[Event]]
) -> None:
    """The grouped claim (a locked select per group) raced by 8 threads: each job runs
    exactly once, and the groups' leftovers are claimed too."""
    ids = fill(queue)
    ranking = ["g2", "g0", "g2", "g1"]
    with ThreadPoolExecutor(8) as pool:
        results = pool.map(
            loop, [queue_url] * 8, [f"t{i}" for i in range(8)], [4] * 8, [ranking] * 8
        )
        events = [e for r in results for e in r]
    check_exactly_once(events, ids)
    assert queue.counts()["done"] == JOBS


def test_eight_processes_claim_disjoint_jobs(queue_url: str, queue: readyq.Queue) -> None:
    """8 processes (true parallelism, separate engines) drain the queue exactly once."""
    ids = fill(queue)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(8, mp_context=ctx) as pool:
        results = pool.map(drain, [queue_url] * 8, [f"p{i}" for i in range(8)], [2] * 8)
        events = [e for r in results for e in r]
    check_exactly_once(events, ids)


@pytest.mark.parametrize("batched", [False, True], ids=["finalize", "finalize_many"])
def test_parents_finishing_together_promote_each_child_exactly_once(
    make_queue,
    queue: readyq.Queue,  # type: ignore[no-untyped-def]
    batched: bool,
) -> None:
    """Two parents of one child finalized at the same time never leave the child blocked.

    Batched: each of the 8 threads finalizes its shuffled share in batches of 5.
    """
    children = []
    with queue.graph() as g:
        for i in range(40):
            a, b = g.add("p", {"i": i}), g.add("p", {"i": i})
            children.append(g.add("child", after=[a, b]))
    leases = queue.claim("w", limit=80)
    assert len(leases) == 80
    random.Random(7).shuffle(leases)
    queues = [make_queue() for _ in range(8)]
    barrier = threading.Barrier(8)

    def finish(k: int) -> None:
        barrier.wait()
        mine = leases[k::8]
        if batched:
            for start in range(0, len(mine), 5):
                queues[k].finalize_many([(lease, None) for lease in mine[start : start + 5]])
        else:
            for lease in mine:
                queues[k].finalize(lease)

    threads = [threading.Thread(target=finish, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [(queue.get(c.id).state, queue.get(c.id).pending_deps) for c in children]
    assert got == [(JobState.READY, 0)] * 40


def test_stale_workers_never_finalize_over_new_holders(make_queue, queue: readyq.Queue) -> None:  # type: ignore[no-untyped-def]
    """With leases expiring under real contention, only each job's latest token finalizes."""
    fill(queue, 60)
    stop = threading.Event()
    wins: list[tuple[int, int]] = []
    lost: list[tuple[int, int]] = []
    lock = threading.Lock()

    def sweeper(q: readyq.Queue) -> None:
        while not stop.is_set():
            q.reclaim()

    def worker(q: readyq.Queue, name: str, seed: int) -> None:
        rnd = random.Random(seed)
        while not stop.is_set():
            leases = q.claim(name, ttl=0.02)
            if not leases:
                if q.counts()["ready"] + q.counts()["running"] == 0:
                    return
                continue
            lease = leases[0]
            if rnd.random() < 0.3:
                stop.wait(0.05)  # pause past the TTL: the lease may be reclaimed meanwhile
            try:
                q.finalize(lease)
                with lock:
                    wins.append((lease.job_id, lease.token))
            except readyq.LeaseLost:
                with lock:
                    lost.append((lease.job_id, lease.token))

    sweep = threading.Thread(target=sweeper, args=(make_queue(),))
    sweep.start()
    workers = [threading.Thread(target=worker, args=(make_queue(), f"w{i}", i)) for i in range(8)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(120)
    stop.set()
    sweep.join()
    with queue.engine.connect() as conn:
        done = sa.select(jobs.c.id, jobs.c.lease_token).where(jobs.c.state == JobState.DONE)
        final = {r.id: r.lease_token for r in conn.execute(done)}
    assert sorted(j for j, _ in wins) == sorted(final), "one finalize per finished job"
    assert all(final[j] == t for j, t in wins), "the finalizing token is the job's last one"
    assert queue.counts()["done"] + queue.counts()["failed"] == 60


@pytest.mark.parametrize("engine_from", ["url", "user-engine"])
def test_open_claim_does_not_block_enqueue(  # type: ignore[no-untyped-def]
    make_queue, queue: readyq.Queue, queue_url: str, engine_from: str
) -> None:
    """An enqueue commits while another transaction holds claimed rows (NOTES 5: gap locks),
    whether readyq made the engine or the application passed its own (default isolation)."""
    for i in range(5):
        queue.enqueue("t", {"i": i})
    other = make_queue()
    done = threading.Event()
    user_engine = sa.create_engine(queue_url) if engine_from == "user-engine" else None
    claimer = readyq.Queue(user_engine) if user_engine is not None else make_queue()
    ad = claimer.adapter
    with claimer.engine.connect() as conn, conn.begin():
        ad.begin_write(conn)
        from readyq import _claim

        got = _claim.claim(
            conn, ad, worker_id="w", now=claimer.clock.now_us(), ttl_us=10**7, limit=1, groups=None
        )
        assert len(got) == 1
        if ad.serialized_writers:
            pytest.skip("needs a database with concurrent writers (SQLite has one writer)")
        t = threading.Thread(target=lambda: (other.enqueue("new", priority=-1), done.set()))
        t.start()
        committed_while_claim_open = done.wait(20)
    t.join()
    if user_engine is not None:
        user_engine.dispose()
    assert committed_while_claim_open


def test_open_dependency_insert_does_not_hide_a_ready_job(make_queue, queue: readyq.Queue) -> None:  # type: ignore[no-untyped-def]
    """A claimer still sees a ready job that an open transaction is adding a dependent to."""
    if not queue.adapter.key_share_lock:
        pytest.skip("needs capability key_share_lock (MySQL/MariaDB lack it: NOTES 8)")
    parent = queue.enqueue("parent")
    claimer = make_queue()
    g = queue.graph()
    g.add("child", after=[parent])
    specs = g._order()
    with queue.engine.connect() as conn, conn.begin():
        _insert(conn, queue.adapter, specs, queue.clock.now_us())
        got = [lease.job_id for lease in claimer.claim("w")]
    assert got == [parent]


def test_dependent_added_while_its_dependency_finishes_is_promoted(
    make_queue, queue: readyq.Queue
) -> None:  # type: ignore[no-untyped-def]
    """An edge committed while its dependency finalizes is seen by it (no lost wake-up)."""
    parent = queue.enqueue("parent")
    lease = queue.claim("w")[0]
    finisher = make_queue()
    g = queue.graph()
    child = g.add("child", after=[parent])
    specs = g._order()
    with queue.engine.connect() as conn, conn.begin():
        queue.adapter.begin_write(conn)
        ids = _insert(conn, queue.adapter, specs, queue.clock.now_us())
        t = threading.Thread(target=finisher.finalize, args=(lease,))
        t.start()
        t.join(0.5)  # the finalize reaches its lock meanwhile (or, if broken, finishes early)
    t.join()
    assert child is not None
    assert (queue.get(ids[0]).state, queue.get(ids[0]).pending_deps) == (JobState.READY, 0)


@pytest.mark.parametrize("batched", [False, True], ids=["finalize", "finalize_many"])
def test_enqueue_racing_its_dependencys_finalize_never_leaves_it_blocked(  # type: ignore[no-untyped-def]
    make_queue, queue: readyq.Queue, batched: bool
) -> None:
    """150 races of finalize(D) against enqueue(after=[D]): the new job always ends ready.

    Batched: D is finalized with another job in one finalize_many transaction.
    Regression: on PostgreSQL the FOR KEY SHARE read of D could return D as it was before
    a concurrent finalize committed, so the new job counted a done dependency as open.
    """
    other = make_queue()
    stuck = []
    for i in range(150):
        d = queue.enqueue("d")
        if batched:
            queue.enqueue("filler")
        leases = queue.claim("w", limit=2 if batched else 1)
        barrier = threading.Barrier(2)
        child: list[int] = []

        def finish(ls: list[readyq.Lease] = leases, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            if batched:
                queue.finalize_many([(lease, None) for lease in ls])
            else:
                queue.finalize(ls[0])

        def add(d: int = d, barrier: threading.Barrier = barrier, child: list[int] = child) -> None:
            barrier.wait()
            child.append(other.enqueue("c", after=[d]))

        threads = [threading.Thread(target=finish), threading.Thread(target=add)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if queue.get(child[0]).state != JobState.READY:
            stuck.append(i)
        for lease_ in queue.claim("w", limit=5):
            queue.finalize(lease_)
    assert stuck == []
