"""DAG: promotion when dependencies finish, failure propagation, container roll-up."""

from __future__ import annotations

import random
import threading

import pytest
from readyq_conformance.env import Env

import readyq
from readyq import JobState

S = JobState


def run_one(q: readyq.Queue, type_: str | None = None, ok: bool = True) -> int:
    leases = q.claim("w", limit=100)
    lease = next(le for le in leases if type_ in (None, le.type))
    for other in leases:
        if other is not lease:
            q.release(other)
    if ok:
        q.finalize(lease, {})
    else:
        q.fail(lease, "broken", retry=False)
    return lease.job_id


def states(q: readyq.Queue, *ids: int) -> list[JobState]:
    return [q.get(i).state for i in ids]


def test_child_waits_for_every_parent(q: readyq.Queue) -> None:
    """Fan-in: the child stays blocked until its last parent is done, then is ready."""
    a, b = q.enqueue("a"), q.enqueue("b")
    child = q.enqueue("c", after=[a, b])
    run_one(q, "a")
    assert (states(q, child), q.get(child).pending_deps) == ([S.BLOCKED], 1)
    run_one(q, "b")
    assert states(q, child) == [S.READY]


def test_chain_runs_in_dependency_order(q: readyq.Queue) -> None:
    """A chain is dispatched one link after the other."""
    with q.graph() as g:
        prev = g.add("n0")
        for i in range(1, 4):
            prev = g.add(f"n{i}", after=[prev])
    assert [q.get(run_one(q)).type for _ in range(4)] == ["n0", "n1", "n2", "n3"]


@pytest.mark.core
def test_parents_finishing_together_promote_each_child_once(env: Env) -> None:
    """Many pairs of parents finalized at once by 6 threads never leave a child blocked."""
    q = env.queue()
    children = []
    with q.graph() as g:
        for i in range(15):
            a, b = g.add("p", {"i": i}), g.add("p", {"i": i})
            children.append(g.add("child", after=[a, b]))
    leases = q.claim("w", limit=30, ttl=600)
    assert len(leases) == 30
    random.Random(7).shuffle(leases)
    queues = [env.queue() for _ in range(6)]
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def finish(k: int) -> None:
        try:
            barrier.wait()
            for lease in leases[k::6]:
                queues[k].finalize(lease)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=finish, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    got = [(q.get(ch.id).state, q.get(ch.id).pending_deps) for ch in children]
    assert got == [(S.READY, 0)] * 15


def test_failed_job_cancels_its_dependents_transitively(q: readyq.Queue) -> None:
    """Nothing waits forever on a job that failed for good."""
    a = q.enqueue("a")
    b = q.enqueue("b", after=[a])
    c = q.enqueue("c", after=[b])
    run_one(q, ok=False)
    assert states(q, a, b, c) == [S.FAILED, S.CANCELLED, S.CANCELLED]


def test_container_rolls_up_when_its_last_child_is_done(q: readyq.Queue) -> None:
    """A container is done in the finalize of its last child, and its dependents run."""
    with q.graph() as g:
        box = g.add("box", container=True)
        g.add("c1", parent=box)
        g.add("c2", parent=box)
        after = g.add("after", after=[box])
    run_one(q, "c1")
    assert states(q, box.id, after.id) == [S.WAITING, S.BLOCKED]
    run_one(q, "c2")
    assert states(q, box.id, after.id) == [S.DONE, S.READY]


def test_failed_child_fails_its_container_and_cancels_what_follows(q: readyq.Queue) -> None:
    """A failed child fails its container once all children end; dependents are cancelled."""
    with q.graph() as g:
        box = g.add("box", container=True)
        g.add("bad", parent=box)
        g.add("good", parent=box)
        after = g.add("after", after=[box])
    run_one(q, "bad", ok=False)
    assert states(q, box.id) == [S.WAITING]
    run_one(q, "good")
    assert states(q, box.id, after.id) == [S.FAILED, S.CANCELLED]


def test_nested_containers_roll_up_in_turn(q: readyq.Queue) -> None:
    """An inner container's roll-up counts as a child finishing for the outer one."""
    with q.graph() as g:
        outer = g.add("outer", container=True)
        inner = g.add("inner", container=True, parent=outer)
        g.add("leaf", parent=inner)
    run_one(q)
    assert states(q, inner.id, outer.id) == [S.DONE, S.DONE]
