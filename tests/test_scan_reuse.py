"""A Worker reuses its last scan of the ready set for ``scan_max_age`` seconds.

The bookkeeping (``readyq._scan.RecentScan``) is checked alone; the Worker's use of it on
real databases, with a virtual clock so that the scan's age is exact.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import readyq
from readyq import Concurrency, Worker
from readyq._scan import GroupStats, RecentScan


def ok(ctx: readyq.JobContext, args: dict[str, Any]) -> None:
    return None


def settle(worker: Worker) -> None:
    """Wait until every dispatched handler of ``worker`` has returned."""
    for run in list(worker._runs.values()):
        if run.thread is not None:
            run.thread.join(30)
            assert not run.thread.is_alive(), "a handler did not return"


def count_scans(worker: Worker) -> list[int | None]:
    """Record the ``free`` of every fresh scan ``worker`` makes from now on."""
    calls: list[int | None] = []
    real = worker.scan

    def counted(free: int | None = None) -> list[GroupStats]:
        calls.append(free)
        return real(free)

    worker.scan = counted  # type: ignore[method-assign]  # the tick calls the instance's
    return calls


STATS = [GroupStats("a", 4, 1, 1.0), GroupStats("b", 2, 0, 2.0)]


class TestRecentScan:
    def fresh(self, max_age: float = 1.0) -> RecentScan:
        recent = RecentScan(max_age)
        recent.took(list(STATS), cap=4, now=10.0)
        return recent

    def test_nothing_is_offered_before_a_scan(self) -> None:
        assert RecentScan(1.0).view(4, 0.0) is None

    def test_a_scan_is_offered_unchanged_until_it_is_max_age_old(self) -> None:
        recent = self.fresh()
        assert (recent.view(4, 10.99), recent.view(4, 11.0)) == (STATS, None)

    def test_max_age_zero_never_offers_a_scan(self) -> None:
        assert self.fresh(max_age=0).view(4, 10.0) is None

    def test_more_free_slots_than_the_scan_was_capped_at_need_a_fresh_scan(self) -> None:
        assert self.fresh().view(5, 10.0) is None

    def test_claims_since_count_as_running_and_no_longer_ready(self) -> None:
        recent = self.fresh()
        recent.claimed("b")
        assert recent.view(4, 10.0) == [GroupStats("a", 4, 1, 1.0), GroupStats("b", 1, 1, 2.0)]

    def test_runs_that_ended_since_no_longer_count_as_running(self) -> None:
        recent = self.fresh()
        recent.claimed("b")
        recent.ended("b")  # the one just claimed
        recent.ended("a")  # one the scan counted
        assert recent.view(4, 10.0) == [GroupStats("a", 4, 0, 1.0), GroupStats("b", 1, 0, 2.0)]

    def test_a_group_at_the_cap_keeps_its_ready_count(self) -> None:
        """It may hold any number more than the cap: a claim that finds fewer tells."""
        recent = self.fresh()
        recent.claimed("a")
        assert recent.view(4, 10.0) == [GroupStats("a", 4, 2, 1.0), GroupStats("b", 2, 0, 2.0)]

    def test_a_view_with_no_ready_job_is_not_offered(self) -> None:
        """New work must be found at once: only a fresh scan can show it."""
        recent = RecentScan(1.0)
        recent.took([GroupStats("b", 2, 0, 1.0)], cap=4, now=0.0)
        recent.claimed("b")
        recent.claimed("b")
        assert recent.view(4, 0.0) is None

    def test_a_group_that_ran_out_shows_no_ready_job_until_the_next_scan(self) -> None:
        recent = self.fresh()
        recent.ran_out("a")
        assert recent.view(4, 10.0) == [GroupStats("a", 0, 1, 1.0), GroupStats("b", 2, 0, 2.0)]

    def test_a_fresh_scan_shows_a_group_that_ran_out_again(self) -> None:
        recent = self.fresh()
        recent.ran_out("a")
        recent.took(list(STATS), cap=4, now=11.0)
        assert recent.view(4, 11.0) == STATS

    def test_a_view_whose_groups_all_ran_out_is_not_offered(self) -> None:
        recent = self.fresh()
        recent.ran_out("a")
        recent.ran_out("b")
        assert recent.view(4, 10.0) is None

    def test_a_forgotten_scan_is_not_offered(self) -> None:
        recent = self.fresh()
        recent.forget()
        assert recent.view(4, 10.0) is None

    def test_a_fresh_scan_starts_its_bookkeeping_anew(self) -> None:
        recent = self.fresh()
        recent.claimed("a")
        recent.took(list(STATS), cap=4, now=11.0)
        assert recent.view(4, 11.0) == STATS


@pytest.mark.backend
class TestWorkerReusesItsScan:
    def backlog(self, q: readyq.Queue, groups: str = "abc", each: int = 20) -> None:
        with q.graph() as g:
            for name in groups:
                for i in range(each):
                    g.add("ok", {"n": i}, group=name)

    def test_ticks_within_scan_max_age_scan_once(self, q: readyq.Queue, clock: Any) -> None:
        self.backlog(q)
        w = Worker(q, {"ok": ok}, limits=[Concurrency(3)], scan_max_age=1.0)
        scans = count_scans(w)
        claimed = 0
        for _ in range(4):
            claimed += w.tick().dispatched
            settle(w)
            clock.advance(0.2)
        assert (claimed, len(scans)) == (12, 1)

    def test_a_tick_after_scan_max_age_scans_again(self, q: readyq.Queue, clock: Any) -> None:
        self.backlog(q)
        w = Worker(q, {"ok": ok}, limits=[Concurrency(3)], scan_max_age=1.0)
        scans = count_scans(w)
        w.tick()
        settle(w)
        clock.advance(1.0)
        w.tick()
        assert len(scans) == 2

    def test_scan_max_age_zero_scans_on_every_tick(self, q: readyq.Queue, clock: Any) -> None:
        self.backlog(q)
        w = Worker(q, {"ok": ok}, limits=[Concurrency(3)], scan_max_age=0)
        scans = count_scans(w)
        for _ in range(3):
            w.tick()
            settle(w)
        assert len(scans) == 3

    def test_a_group_that_appears_is_ranked_once_the_scan_is_max_age_old(
        self, q: readyq.Queue, clock: Any
    ) -> None:
        self.backlog(q, groups="a")
        w = Worker(q, {"ok": ok}, limits=[Concurrency(2)], scan_max_age=1.0)
        w.tick()
        settle(w)
        q.enqueue("ok", group="b")
        before = w.tick().claimed
        settle(w)
        clock.advance(1.0)
        after = w.tick().claimed
        assert (before, after) == ({"a": 2}, {"a": 1, "b": 1})

    def test_a_group_whose_claim_comes_back_short_is_not_ranked_again_until_a_scan(
        self, q: readyq.Queue, clock: Any
    ) -> None:
        """Another worker took a ranked group's jobs: the next tick, reusing the scan,
        ranks only the groups that still have some."""
        self.backlog(q, groups="abc", each=4)
        w = Worker(q, {"ok": ok}, limits=[Concurrency(3)], scan_max_age=3600)
        scans = count_scans(w)
        rankings: list[list[str]] = []
        real_rank = w.rank

        def recorded(stats: list[GroupStats], free: int | None = None) -> list[str]:
            rankings.append(real_rank(stats, free))
            return rankings[-1]

        w.rank = recorded  # type: ignore[method-assign]  # the tick calls the instance's
        w.tick()  # a, b and c, one each; the view now shows three more of each
        settle(w)
        taken = q.claim("other", ttl=60, limit=5, groups=["b"] * 5)
        w.tick()  # ranks a, b and c; b has none left, the second pass fills its slot
        settle(w)
        w.tick()
        assert (len(taken), "b" in rankings[1], len(scans)) == (3, True, 1)
        assert sorted(set(rankings[2])) == ["a", "c"], rankings

    def test_a_claim_that_empties_the_last_ranked_group_makes_the_next_tick_scan(
        self, q: readyq.Queue, clock: Any
    ) -> None:
        """Once every group of the view ran out, only a fresh scan can show new work."""
        self.backlog(q, groups="a", each=3)
        w = Worker(q, {"ok": ok}, limits=[Concurrency(2)], scan_max_age=3600)
        scans = count_scans(w)
        w.tick()  # two of a's three; the view keeps a at the cap
        settle(w)
        w.tick()  # asks two, gets the last one: a ran out
        settle(w)
        q.enqueue("ok", group="b")
        found = w.tick().claimed
        assert (found, len(scans)) == ({"b": 1}, 2)

    def test_an_empty_scan_is_not_reused(self, q: readyq.Queue, clock: Any) -> None:
        """A job enqueued after a scan that found nothing is claimed by the next tick."""
        w = Worker(q, {"ok": ok}, limits=[Concurrency(2)], scan_max_age=3600)
        idle = w.tick()
        q.enqueue("ok", group="a")
        assert (idle.claimed, w.tick().claimed) == ({}, {"a": 1})

    def test_a_sweep_that_readies_jobs_makes_the_tick_scan(
        self, q: readyq.Queue, clock: Any
    ) -> None:
        """A job whose lease expired is ready again: the tick that swept it may claim it."""
        lost = q.enqueue("ok", group="a")
        [lease] = q.claim("crashed", ttl=1, limit=1)
        self.backlog(q, groups="b")
        w = Worker(q, {"ok": ok}, limits=[Concurrency(2)], scan_max_age=3600, reclaim_every=1)
        w.tick()  # sweeps nothing; ranks b twice (a holds a running slot)
        settle(w)
        clock.advance(2.0)  # the lease of "crashed" expires; the sweep is due
        report = w.tick()
        settle(w)
        assert (lease.job_id, report.reclaimed, report.claimed) == (lost, 1, {"a": 1, "b": 1})

    def test_a_single_worker_reusing_its_scan_keeps_weighted_shares_within_one_slot(
        self, q: readyq.Queue, clock: Any
    ) -> None:
        """Its own claims and ends are counted exactly: the shares do not drift while
        every tick reuses the first scan."""
        weights = {"a": 1, "b": 3}
        with q.graph() as g:
            for name, weight in weights.items():
                for i in range(80):
                    g.add("ok", {"n": i}, group=name, weight=weight)
        w = Worker(q, {"ok": ok}, limits=[Concurrency(4)], scan_max_age=3600)
        scans = count_scans(w)
        served: Counter[str] = Counter()
        worst = 0.0
        while sum(served.values()) < 80:
            served.update(w.tick().claimed)
            settle(w)
            total = sum(served.values())
            worst = max(worst, *(abs(served[n] - total * wt / 4) for n, wt in weights.items()))
        assert (len(scans), served["b"] > served["a"] > 0) == (1, True)
        assert worst < 1.5, f"lag {worst:.2f} with {dict(served)}"
