"""Fair share: the ranking's long-run bound, and claims that follow the ranking."""

from __future__ import annotations

import random

import pytest
from readyq_conformance._threads import Attempt
from readyq_conformance.env import Env

import readyq
from readyq import GroupDemand, fair_share
from readyq._claim import claim as store_claim

WEIGHTS = {"a": 1.0, "b": 2.0, "c": 5.0}


def test_backlogged_groups_stay_within_one_slot_of_their_weight() -> None:
    """With every group backlogged, each group's dispatches stay within 1 of t*w/W."""
    rnd = random.Random(5)
    used = dict.fromkeys(WEIGHTS, 0)
    total_w = sum(WEIGHTS.values())
    t = 0
    for _ in range(200):
        free = rnd.randint(1, 3)
        demands = [GroupDemand(g, w, 0, 10, used[g]) for g, w in WEIGHTS.items()]
        for g in fair_share(demands, free):
            used[g] += 1
            t += 1
            for name, w in WEIGHTS.items():
                assert abs(used[name] - t * w / total_w) < 1, (t, dict(used))


def test_ranking_is_work_conserving() -> None:
    """The ranking fills min(free, ready) slots and never more than a group has ready."""
    demands = [GroupDemand("a", 1, 0, 1), GroupDemand("b", 1, 0, 5)]
    got = fair_share(demands, 4)
    assert len(got) == 4
    assert got.count("a") <= 1


@pytest.mark.core
def test_claims_follow_the_ranking(env: Env) -> None:
    """Claiming with groups=fair_share(...) takes jobs in the ranked groups' order, and the
    served counts track the weights."""
    q = env.queue()
    with q.graph() as g:
        for name, w in WEIGHTS.items():
            for i in range(12):
                g.add("t", {"i": i}, group=name, weight=w)
    served = dict.fromkeys(WEIGHTS, 0)
    for _ in range(8):
        stats = {s.group: s for s in q.scan()}
        demands = [
            GroupDemand(s.group, s.weight, s.running, s.ready, served[s.group])
            for s in stats.values()
        ]
        ranking = fair_share(demands, 2)
        leases = q.claim("w", limit=2, groups=ranking)
        assert [le.group for le in leases] == ranking[: len(leases)]
        assert len(leases) == 2
        for le in leases:
            served[le.group] += 1
            q.finalize(le)
    t = sum(served.values())
    for name, w in WEIGHTS.items():
        assert abs(served[name] - t * w / sum(WEIGHTS.values())) < 1, served


@pytest.mark.core
def test_a_capped_scan_finds_every_group_and_stops_counting_at_the_limit(env: Env) -> None:
    """Queue.scan(limit=k), the Worker's scan (the adapter's loose_distinct finds the
    groups): every group with ready or running jobs, each ready count min(ready, k)."""
    q = env.queue()
    with q.graph() as g:
        for name, n in (("a", 5), ("b", 1), ("c", 3)):
            for i in range(n):
                g.add("t", {"i": i}, group=name)
    q.claim("w", limit=1, groups=["c"])
    got = [(s.group, s.ready, s.running) for s in q.scan(limit=2)]
    assert got == [("a", 2, 0), ("b", 1, 0), ("c", 2, 1)]


@pytest.mark.requires("skip_locked")
def test_claim_falls_through_when_the_top_group_is_locked(env: Env) -> None:
    """When another transaction holds the top-ranked group's only job, the ranked claim
    takes the next group's job without waiting."""
    q = env.queue()
    q.enqueue("t", group="a")
    b = q.enqueue("t", group="b")
    other = env.queue()
    other.counts()
    with env.write() as (conn, ad):
        store_claim(
            conn, ad, worker_id="x", now=q.clock.now_us(), ttl_us=10**7, limit=1, groups=["a"]
        )
        att = Attempt(lambda: other.claim("w", groups=["a", "b"]), "ranked-claim")
        finished = att.wait(env.block_timeout * 3)
    got = att.result(30)
    assert finished, "the ranked claim waited for the locked group"
    assert [le.job_id for le in got] == [b]


_ = readyq
