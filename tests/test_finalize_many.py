"""Batched finalize: several leases' results in one transaction, each all-or-nothing."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

import readyq
from readyq import InvalidJob, JobState, LeaseLost, Outcome, _claim, _store
from readyq.schema import jobs

try:
    from tests.observers import Recorder
except ImportError:  # pragma: no cover - tests/ on sys.path instead
    from observers import Recorder  # type: ignore[no-redef]

pytestmark = pytest.mark.backend


def leased(q: readyq.Queue, n: int) -> list[readyq.Lease]:
    for i in range(n):
        q.enqueue("t", {"i": i})
    leases = q.claim("w", limit=n, ttl=60)
    assert len(leases) == n
    return leases


def states(q: readyq.Queue, ids: list[int]) -> list[JobState]:
    return [q.get(i).state for i in ids]


def test_every_lease_is_finalized_with_its_own_result(q: readyq.Queue) -> None:
    """Three leases in one call: each job done with the result given for it."""
    leases = leased(q, 3)
    out = q.finalize_many([(lease, {"n": lease.job_id}) for lease in leases])
    assert [(o.job_id, o.state) for o in out] == [(ls.job_id, JobState.DONE) for ls in leases]
    assert [q.get(ls.job_id).result for ls in leases] == [{"n": ls.job_id} for ls in leases]


def test_the_whole_batch_commits_once(q: readyq.Queue) -> None:
    """Ten results cost one transaction, not ten."""
    leases = leased(q, 10)
    commits: list[int] = []

    def count(conn: Any) -> None:
        commits.append(1)

    sa.event.listen(q.engine, "commit", count)
    try:
        q.finalize_many([(lease, None) for lease in leases])
    finally:
        sa.event.remove(q.engine, "commit", count)
    assert len(commits) == 1


def test_a_stale_lease_gets_lease_lost_in_its_slot_and_the_rest_commit(
    q: readyq.Queue,
    clock: Any,
) -> None:
    """The reclaimed job keeps its new holder; its neighbours in the batch are done."""
    q.enqueue("stale", max_attempts=5)
    old = q.claim("w1", ttl=10)[0]
    clock.advance(11)
    assert q.reclaim() == 1
    new = q.claim("w2", ttl=100)[0]
    fresh = leased(q, 2)
    out = q.finalize_many([(fresh[0], None), (old, {"from": "old"}), (fresh[1], None)])
    assert isinstance(out[1], LeaseLost)
    assert [type(o) for o in (out[0], out[2])] == [Outcome, Outcome]
    job = q.get(old.job_id)
    assert (job.state, job.result, job.lease_token) == (JobState.RUNNING, None, new.token)
    assert states(q, [f.job_id for f in fresh]) == [JobState.DONE, JobState.DONE]


def test_calling_again_after_success_replays_every_outcome(q: readyq.Queue) -> None:
    """A retried batch (unknown outcome) reports each job as replayed and changes nothing."""
    leases = leased(q, 3)
    q.finalize_many([(lease, {"first": True}) for lease in leases])
    again = q.finalize_many([(lease, {"second": True}) for lease in leases])
    assert [(o.state, o.replayed) for o in again if isinstance(o, Outcome)] == [
        (JobState.DONE, True)
    ] * 3
    assert [q.get(ls.job_id).result for ls in leases] == [{"first": True}] * 3


def test_the_same_job_twice_is_refused_and_changes_nothing(q: readyq.Queue) -> None:
    """Duplicate leases are a caller's bug: InvalidJob before any write."""
    (lease,) = leased(q, 1)
    with pytest.raises(InvalidJob, match="same job twice"):
        q.finalize_many([(lease, None), (lease, None)])
    assert q.get(lease.job_id).state == JobState.RUNNING


def test_a_non_json_result_is_refused_and_changes_nothing(q: readyq.Queue) -> None:
    """One bad result stops the whole call before the transaction: no job is finalized."""
    leases = leased(q, 2)
    with pytest.raises(InvalidJob):
        q.finalize_many([(leases[0], None), (leases[1], {"bad": {1, 2}})])
    assert states(q, [ls.job_id for ls in leases]) == [JobState.RUNNING] * 2


def test_items_that_are_not_pairs_are_refused(q: readyq.Queue) -> None:
    """A bare lease instead of (lease, result) is InvalidJob with the expected shape."""
    (lease,) = leased(q, 1)
    with pytest.raises(InvalidJob, match=r"\(lease, result\) pairs"):
        q.finalize_many([lease])  # type: ignore[list-item]
    assert q.get(lease.job_id).state == JobState.RUNNING


def test_an_empty_batch_is_a_no_op(q: readyq.Queue) -> None:
    """Nothing to finalize: an empty list back, no transaction needed."""
    assert q.finalize_many([]) == []


def test_a_child_of_two_parents_in_one_batch_becomes_ready(q: readyq.Queue) -> None:
    """Both open dependencies finished together: the count drops by two, the child is ready."""
    with q.graph() as g:
        a, b = g.add("p"), g.add("p")
        child = g.add("c", after=[a, b])
    leases = q.claim("w", limit=2)
    out = q.finalize_many([(lease, None) for lease in leases])
    info = q.get(child.id)
    assert (info.state, info.pending_deps) == (JobState.READY, 0)
    assert sum(o.dependents for o in out if isinstance(o, Outcome)) == 1


def test_a_child_with_an_open_dependency_outside_the_batch_stays_blocked(
    q: readyq.Queue,
) -> None:
    """Two of its three parents finished in one batch: one count left, still blocked."""
    with q.graph() as g:
        parents = [g.add("p") for _ in range(3)]
        child = g.add("c", after=parents)
    leases = q.claim("w", limit=3)
    q.finalize_many([(lease, None) for lease in leases[:2]])
    info = q.get(child.id)
    assert (info.state, info.pending_deps) == (JobState.BLOCKED, 1)


def test_children_of_one_container_finished_together_roll_it_up(q: readyq.Queue) -> None:
    """Every child of a container in one batch: the container is done."""
    with q.graph() as g:
        box = g.add("box", container=True)
        for _ in range(3):
            g.add("child", parent=box)
    leases = q.claim("w", limit=3)
    q.finalize_many([(lease, None) for lease in leases])
    assert q.get(box.id).state == JobState.DONE


class TestFinalizeAndClaim:
    def test_results_and_next_leases_commit_together(self, q: readyq.Queue) -> None:
        """The results of one round and the next round's leases cost one commit."""
        (first,) = leased(q, 1)
        q.enqueue("t")
        commits: list[int] = []
        sa.event.listen(q.engine, "commit", lambda conn: commits.append(1))
        out, nxt = q.finalize_and_claim([(first, {"ok": 1})], "w", limit=5)
        assert len(commits) == 1
        assert [o.state for o in out] == [JobState.DONE]
        assert [lease.job_id for lease in nxt] == [first.job_id + 1]

    def test_claim_sees_the_dependents_it_just_promoted(self, q: readyq.Queue) -> None:
        """A dependent made ready by this finalize is leased in the same transaction."""
        a = q.enqueue("a")
        b = q.enqueue("b", after=[a])
        (lease,) = q.claim("w")
        _, nxt = q.finalize_and_claim([(lease, None)], "w")
        assert [x.job_id for x in nxt] == [b]

    def test_stale_lease_gets_its_lease_lost_and_the_claim_goes_on(
        self, q: readyq.Queue, clock: Any
    ) -> None:
        """A stale result does not stop the claim: its slot holds LeaseLost."""
        (old,) = leased(q, 1)
        clock.advance(120)
        q.reclaim()
        out, nxt = q.finalize_and_claim([(old, None)], "w")
        assert isinstance(out[0], LeaseLost)
        assert [x.job_id for x in nxt] == [old.job_id]

    def test_claim_failing_in_the_database_records_no_result(self, q: readyq.Queue) -> None:
        """All or nothing: the claim's statement failing rolls the results back too."""
        if q.adapter.name == "sqlite":
            pytest.skip("SQLite turns an overflowing integer sum into a float, no error")
        (lease,) = leased(q, 1)
        waiting = q.enqueue("t")
        # The claim computes deadline_us = now + timeout_us: out of BIGINT range here.
        with q.engine.begin() as conn:
            conn.execute(sa.update(jobs).where(jobs.c.id == waiting).values(timeout_us=2**63 - 1))
        with pytest.raises(sa.exc.DBAPIError):
            q.finalize_and_claim([(lease, {"ok": 1})], "w")
        assert (q.get(lease.job_id).state, q.get(waiting).state) == (
            JobState.RUNNING,
            JobState.READY,
        )

    def test_claim_failing_after_its_statements_records_no_result_in_a_transaction(
        self, q: readyq.Queue, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Where the finalize and claim run in a client-side transaction, an error after
        the statements (building the leases) rolls everything back."""
        if readyq._store.commits_at_once(q.adapter, q.engine, claims=True, groups=None):
            pytest.skip("commit_together: the commit leaves with the statements")
        (lease,) = leased(q, 1)
        waiting = q.enqueue("t")

        def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError("claim failed")

        monkeypatch.setattr(_claim, "_leases", broken)
        with pytest.raises(RuntimeError, match="claim failed"):
            q.finalize_and_claim([(lease, {"ok": 1})], "w")
        assert (q.get(lease.job_id).state, q.get(waiting).state) == (
            JobState.RUNNING,
            JobState.READY,
        )

    def test_ranked_claim_gives_unused_slots_to_groups_with_more(self, q: readyq.Queue) -> None:
        """By ranked groups, as claim() does: a slot group "b" cannot use goes to "a"."""
        (lease,) = leased(q, 1)
        for _ in range(3):
            q.enqueue("t", group="a")
        _, nxt = q.finalize_and_claim([(lease, None)], "w", limit=2, groups=["b", "a"])
        assert [x.group for x in nxt] == ["a", "a"]

    def test_ranked_claim_leaves_with_the_results_where_the_adapter_can(
        self, q: readyq.Queue
    ) -> None:
        """grouped_claim_in_one_statement and a pipeline: the results, the ranked claim and
        the COMMIT leave in one round trip."""
        if not _store.commits_at_once(q.adapter, q.engine, claims=True, groups=["a"], limit=1):
            pytest.skip("needs commit_together and grouped_claim_in_one_statement")
        (lease,) = leased(q, 1)
        q.enqueue("t", group="a")
        seen = Recorder()
        with readyq.Queue(q.engine.execution_options(readyq_pipeline_observer=seen)) as obs:
            _, nxt = obs.finalize_and_claim([(lease, None)], "w", limit=1, groups=["a"])
        assert [x.group for x in nxt] == ["a"]
        assert len(seen.statements) == 1, seen.statements
        assert any("SKIP LOCKED" in sql for sql in seen.statements[0])
        assert q.get(lease.job_id).state == JobState.DONE  # committed by the pipeline itself

    def test_a_failed_top_up_keeps_the_results_and_the_leases_taken(
        self, q: readyq.Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """After the results and the first pass committed together, the second pass is
        its own transaction: if it fails, what committed stands and the error is logged."""
        if not _store.commits_at_once(q.adapter, q.engine, claims=True, groups=["a"], limit=1):
            pytest.skip("needs commit_together and grouped_claim_in_one_statement")
        (lease,) = leased(q, 1)
        for _ in range(3):
            q.enqueue("t", group="a")

        def cut(*args: object, **kwargs: object) -> None:
            raise sa.exc.OperationalError("UPDATE", {}, ConnectionError("connection cut"))

        monkeypatch.setattr(_claim, "top_up", cut)
        out, nxt = q.finalize_and_claim([(lease, None)], "w", limit=2, groups=["b", "a"])
        assert [o.state for o in out] == [JobState.DONE]
        assert [x.group for x in nxt] == ["a"]
        assert q.get(nxt[0].job_id).state == JobState.RUNNING
        assert "top-up failed" in caplog.text

    def test_a_top_up_claims_each_group_in_a_round_trip_of_its_own(self, q: readyq.Queue) -> None:
        """Where a claim commits by itself, so does each group's second-pass claim: one
        pipeline each, with no transaction around them."""
        if not _claim.claim_autocommits(q.adapter, ["a"], 1):
            pytest.skip("needs claim_autocommit and grouped_claim_in_one_statement")
        (lease,) = leased(q, 1)
        for group in "aac":
            q.enqueue("t", group=group)
        seen = Recorder()
        with readyq.Queue(q.engine.execution_options(readyq_pipeline_observer=seen)) as obs:
            _, nxt = obs.finalize_and_claim([(lease, None)], "w", limit=4, groups=["b", "a", "c"])
        assert [x.group for x in nxt] == ["a", "c", "a"]
        assert len(seen.statements) == 3, seen.statements  # the finalize's, a's, then c's
        assert all("SKIP LOCKED" in sql[-1] for sql in seen.statements[1:])

    def test_a_top_up_failing_at_its_second_group_keeps_the_first_groups_leases(
        self, q: readyq.Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Each group's claim committed by itself: the one that failed took nothing, the
        ones before it are leased and returned, and the error is logged."""
        if not _claim.claim_autocommits(q.adapter, ["a"], 1):
            pytest.skip("needs claim_autocommit and grouped_claim_in_one_statement")
        (lease,) = leased(q, 1)
        for group in "aacc":
            q.enqueue("t", group=group)
        real, calls = _claim.top_up, []

        def second_cut(*args: Any, **kwargs: Any) -> Any:
            calls.append(args[2].groups)
            if len(calls) == 2:
                raise sa.exc.OperationalError("UPDATE", {}, ConnectionError("connection cut"))
            return real(*args, **kwargs)

        monkeypatch.setattr(_claim, "top_up", second_cut)
        _, nxt = q.finalize_and_claim([(lease, None)], "w", limit=4, groups=["b", "a", "c"])
        assert calls == [["a"], ["c"]]
        assert [x.group for x in nxt] == ["a", "c", "a"]
        assert [q.get(x.job_id).state for x in nxt] == [JobState.RUNNING] * 3
        assert q.counts()[JobState.READY] == 1  # c's second job: its claim failed
        assert "top-up failed" in caplog.text

    def test_ranked_claim_after_the_last_child_of_a_container_rolls_it_up(
        self, q: readyq.Queue
    ) -> None:
        """A result inside a container takes the transaction path (its roll-up needs more
        statements): the container is done, the ranked claim leases, nothing twice."""
        with q.graph() as g:
            box = g.add("box", container=True)
            g.add("child", parent=box, group="a")
        (lease,) = q.claim("w")
        other = q.enqueue("t", group="a")
        _, nxt = q.finalize_and_claim([(lease, None)], "w", limit=1, groups=["a"])
        assert [x.job_id for x in nxt] == [other]
        assert q.get(box.id).state == JobState.DONE

    @pytest.mark.parametrize("groups", [None, ["a"]], ids=["plain claim", "ranked claim"])
    def test_promoting_dependents_notifies_listeners(
        self, q: readyq.Queue, groups: list[str] | None
    ) -> None:
        """A result that makes a dependent ready wakes listening workers (PostgreSQL)."""
        if not q.adapter.listen_notify:
            pytest.skip("needs capability listen_notify")
        parent = q.enqueue("p", group="a")
        q.enqueue("c", after=[parent], group="a")
        (lease,) = q.claim("w")
        raw = q.engine.raw_connection()
        try:
            listener = raw.driver_connection
            listener.autocommit = True
            listener.execute(f"LISTEN {q.channel}")
            q.finalize_and_claim([(lease, None)], "w", groups=groups)
            heard = list(listener.notifies(timeout=5, stop_after=1))
        finally:
            raw.invalidate()
        assert [n.channel for n in heard] == [q.channel]

    def test_no_results_is_a_plain_claim(self, q: readyq.Queue) -> None:
        """The first round has nothing to finalize."""
        job = q.enqueue("t")
        assert [x.job_id for x in q.finalize_and_claim([], "w")[1]] == [job]

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [({"limit": 0}, "limit"), ({"ttl": -1}, "ttl"), ({"groups": "g"}, "groups")],
    )
    def test_bad_claim_argument_changes_nothing(
        self, q: readyq.Queue, kwargs: dict[str, Any], match: str
    ) -> None:
        """Invalid claim arguments are refused before the results are written."""
        (lease,) = leased(q, 1)
        with pytest.raises(InvalidJob, match=match):
            q.finalize_and_claim([(lease, None)], "w", **kwargs)
        assert q.get(lease.job_id).state == JobState.RUNNING

    def test_same_job_twice_is_refused(self, q: readyq.Queue) -> None:
        """Each lease once, as in finalize_many."""
        (lease,) = leased(q, 1)
        with pytest.raises(InvalidJob, match="same job twice"):
            q.finalize_and_claim([(lease, None), (lease, None)], "w")
        assert q.get(lease.job_id).state == JobState.RUNNING
