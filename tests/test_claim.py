"""The ready set and the claim: what can be leased, in which order, with which lease."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

import readyq
from readyq import InvalidJob, JobState

try:
    from tests.observers import Recorder, cursor_statements
except ImportError:  # pragma: no cover - tests/ on sys.path instead
    from observers import Recorder, cursor_statements  # type: ignore[no-redef]

pytestmark = pytest.mark.backend


class TestReadySet:
    def test_blocked_job_is_not_claimed(self, q: readyq.Queue) -> None:
        """A job whose dependency is open stays out of claims."""
        a = q.enqueue("a")
        q.enqueue("b", after=[a])
        assert [lease.job_id for lease in q.claim("w", limit=10)] == [a]

    def test_container_is_never_claimed(self, q: readyq.Queue) -> None:
        """Containers roll up; they are never dispatched."""
        with q.graph() as g:
            box = g.add("box", container=True)
            child = g.add("child", parent=box)
        assert [lease.job_id for lease in q.claim("w", limit=10)] == [child.id]

    def test_job_before_run_after_is_not_claimed(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """run_after in the future keeps a job out of claims until the clock reaches it."""
        q.enqueue("later", run_after=dt.timedelta(seconds=10))
        assert q.claim("w") == []
        clock.advance(10)
        assert [lease.type for lease in q.claim("w")] == ["later"]

    def test_running_job_is_not_claimed_again(self, q: readyq.Queue) -> None:
        """A leased job is not in the ready set."""
        q.enqueue("a")
        assert len(q.claim("w1")) == 1
        assert q.claim("w2") == []

    def test_finished_job_is_not_claimed(self, q: readyq.Queue) -> None:
        """A done job never comes back."""
        q.enqueue("a")
        q.finalize(q.claim("w")[0])
        assert q.claim("w") == []


class TestClaimOrder:
    def test_lower_priority_value_first(self, q: readyq.Queue) -> None:
        """Priority: lower values run first."""
        q.enqueue("low", priority=5)
        q.enqueue("high", priority=-5)
        assert [lease.type for lease in q.claim("w", limit=2)] == ["high", "low"]

    def test_older_first_within_a_priority(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """Same priority: earlier run_after first, then lower id."""
        q.enqueue("second")
        q.enqueue("first", run_after=dt.timedelta(seconds=-1))
        q.enqueue("third")
        assert [lease.type for lease in q.claim("w", limit=3)] == ["first", "second", "third"]

    def test_limit_caps_the_claim(self, q: readyq.Queue) -> None:
        """A claim returns at most ``limit`` leases."""
        for _ in range(5):
            q.enqueue("t")
        assert len(q.claim("w", limit=3)) == 3

    def test_ranked_groups_come_in_rank_order(self, q: readyq.Queue) -> None:
        """With groups=[...], jobs come from the groups in the order given."""
        for g in ("a", "b", "c"):
            q.enqueue("t", group=g)
        assert [lease.group for lease in q.claim("w", limit=3, groups=["c", "a", "b"])] == [
            "c",
            "a",
            "b",
        ]

    def test_more_ranked_groups_than_one_statement_holds_keep_their_rank_order(
        self, q: readyq.Queue
    ) -> None:
        """40 ranked groups (a one-select pick sends them as two statements of at most 32
        windows): the leases still follow the ranking, across both."""
        ranking = [f"g{k:02d}" for k in range(39, -1, -1)]
        with q.graph() as g:
            for name in sorted(ranking):
                g.add("t", group=name)
        got = q.claim("w", limit=len(ranking), groups=ranking)
        assert [lease.group for lease in got] == ranking

    @pytest.mark.parametrize(
        "name",
        ['say "hi"', "back\\slash", 'a","b', "[1, 2]", "{}", "null", "emoji \U0001f600", "tab\t"],
    )
    def test_a_ranked_group_is_claimed_by_its_exact_name(self, q: readyq.Queue, name: str) -> None:
        """Names that mean something in JSON (the ranking travels as JSON on PostgreSQL)
        or in SQL are matched exactly, in the first pass and the second."""
        with q.graph() as g:
            mine = [g.add("t", group=name) for _ in range(2)]
            g.add("t", group="decoy")
        got = q.claim("w", limit=3, groups=[name])
        assert sorted(lease.job_id for lease in got) == sorted(j.id for j in mine)

    def test_repeated_group_asks_for_several_jobs(self, q: readyq.Queue) -> None:
        """A group named twice in the ranking gets two slots."""
        for g in ("a", "a", "b"):
            q.enqueue("t", group=g)
        got = [lease.group for lease in q.claim("w", limit=2, groups=["a", "a", "b"])]
        assert got == ["a", "a"]

    def test_group_without_jobs_falls_through(self, q: readyq.Queue) -> None:
        """An empty (or fully taken) group passes its slot down the ranking."""
        q.enqueue("t", group="b")
        assert [lease.group for lease in q.claim("w", groups=["a", "b"])] == ["b"]

    def test_unused_slots_go_to_groups_with_more(self, q: readyq.Queue) -> None:
        """Work-conserving: slots a group cannot use go to ranked groups that have more."""
        for g in ("a", "a", "a"):
            q.enqueue("t", group=g)
        assert len(q.claim("w", limit=3, groups=["a", "b"])) == 3

    def test_unranked_groups_are_not_claimed(self, q: readyq.Queue) -> None:
        """groups= restricts the claim to the groups named."""
        q.enqueue("t", group="other")
        assert q.claim("w", groups=["a"]) == []


class TestLease:
    def test_claim_sets_lease_fields(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """The lease carries the job, the new token, the attempt and expiry = now + ttl."""
        job_id = q.enqueue("t", {"x": 1}, group="g")
        lease = q.claim("worker-1", ttl=12.5)[0]
        assert (
            lease.job_id,
            lease.type,
            lease.args,
            lease.group,
            lease.token,
            lease.attempt,
            lease.worker_id,
        ) == (job_id, "t", {"x": 1}, "g", 1, 1, "worker-1")
        assert lease.expires_us == clock.now_us() + 12_500_000

    def test_claim_records_the_lease_in_the_row(self, q: readyq.Queue) -> None:
        """The row shows who holds the job, with which token, until when."""
        job_id = q.enqueue("t")
        lease = q.claim("worker-1")[0]
        job = q.get(job_id)
        assert (job.state, job.lease_owner, job.lease_token, job.attempts) == (
            JobState.RUNNING,
            "worker-1",
            lease.token,
            1,
        )
        assert job.lease_expires_at == lease.expires_at

    def test_hang_deadline_is_set_from_timeout(self, q: readyq.Queue, clock) -> None:  # type: ignore[no-untyped-def]
        """A job with a timeout gets deadline = claim time + timeout."""
        q.enqueue("t", timeout=5)
        assert q.claim("w")[0].deadline_us == clock.now_us() + 5_000_000

    def test_idempotency_key_depends_on_job_and_token(self, q: readyq.Queue) -> None:
        """Side effects can be keyed by (job id, token)."""
        job_id = q.enqueue("t")
        lease = q.claim("w")[0]
        assert lease.idempotency_key == f"readyq:{job_id}:1"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"limit": 0}, "limit"),
        ({"ttl": 0}, "ttl"),
        ({"ttl": -1}, "ttl"),
        ({"groups": "abc"}, "groups"),
        ({"limit": True}, "limit"),
    ],
)
def test_invalid_claim_argument_is_refused(
    q: readyq.Queue, kwargs: dict[str, object], match: str
) -> None:
    """Bad claim arguments raise InvalidJob and lease nothing."""
    q.enqueue("t")
    with pytest.raises(InvalidJob, match=match):
        q.claim("w", **kwargs)  # type: ignore[arg-type]
    assert q.counts()["ready"] == 1


def test_empty_worker_id_is_refused(q: readyq.Queue) -> None:
    """A claim must say who holds the lease."""
    with pytest.raises(InvalidJob, match="worker_id"):
        q.claim("")


class TestClaimTransaction:
    @staticmethod
    def _autocommit_per_phase(q: readyq.Queue, groups: list[str] | None) -> dict[str, set[bool]]:
        phase = ["enqueue"]
        seen: dict[str, set[bool]] = {}

        def record(conn: sa.Connection) -> None:
            auto = conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT"
            seen.setdefault(phase[0], set()).add(auto)

        # Every write begins (an autocommit one too); some statements bypass cursor events.
        sa.event.listen(q.engine, "begin", record)
        q.enqueue("t")
        phase[0] = "claim"
        (lease,) = q.claim("w", groups=groups)
        phase[0] = "heartbeat"
        q.heartbeat(lease)
        return seen

    def test_plain_claim_commits_by_itself_where_the_adapter_allows(self, q: readyq.Queue) -> None:
        """claim_autocommit: the one-statement claim is sent without BEGIN/COMMIT."""
        seen = self._autocommit_per_phase(q, None)
        assert seen["claim"] == {q.adapter.claim_autocommit}

    def test_write_after_an_autocommit_claim_is_a_transaction_again(self, q: readyq.Queue) -> None:
        """The pooled connection goes back to transactions (a heartbeat needs one)."""
        seen = self._autocommit_per_phase(q, None)
        assert seen["heartbeat"] == {False}

    def test_grouped_claim_in_one_statement_commits_by_itself(self, q: readyq.Queue) -> None:
        """A claim by groups whose shares fit its limit is one self-guarding statement where
        the adapter has one (sent without BEGIN/COMMIT); else several, in a transaction."""
        seen = self._autocommit_per_phase(q, ["default"])
        alone = q.adapter.claim_autocommit and q.adapter.grouped_claim_in_one_statement
        assert seen["claim"] == {alone}

    def test_grouped_claims_second_pass_commits_by_itself_after_the_first(
        self, q: readyq.Queue
    ) -> None:
        """Slots a ranked group left free go to the full groups after the first pass
        committed, each group's claim one statement committing by itself (what committed
        stands if a later one fails)."""
        if not (q.adapter.claim_autocommit and q.adapter.grouped_claim_in_one_statement):
            pytest.skip("needs a grouped claim in one statement that commits by itself")
        for _ in range(2):
            q.enqueue("t", group="a")
        seen: list[bool] = []

        def record(conn: sa.Connection) -> None:
            seen.append(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")

        sa.event.listen(q.engine, "begin", record)
        leases = q.claim("w", limit=2, groups=["a", "b"])
        assert ([lease.group for lease in leases], seen) == (["a", "a"], [True, True])


def _claim_sending(
    queue: readyq.Queue, capability: str, enqueued: str, ranking: str
) -> tuple[str, list[str]]:
    """Enqueue a job per letter of ``enqueued`` (its group), claim by ``ranking`` (one
    group per letter, limit = its length) where the adapter has ``capability``: the
    leases' groups, and the statements sent."""
    if not getattr(queue.adapter, capability):
        pytest.skip(f"needs capability {capability}")
    for g in enqueued:
        queue.enqueue("t", group=g)
    piped = Recorder()  # statements sent in a pipeline pass no cursor event
    q = readyq.Queue(queue.engine.execution_options(readyq_pipeline_observer=piped))
    with cursor_statements(q.engine) as recorded:
        got = q.claim("w", limit=len(ranking), groups=list(ranking))
    # A pipeline comes first (the first pass); what the adapter adds to it is not counted.
    first = [sql for stmts in piped.statements for sql in stmts if "set_config" not in sql]
    return "".join(lease.group for lease in got), first + [sql for sql, _ in recorded]


def _picks(sent: list[str]) -> list[str]:
    """The locking selects among the statements sent (a claim's picks)."""
    return [sql for sql in sent if "SKIP LOCKED" in sql and not sql.startswith("UPDATE")]


def test_grouped_claim_whose_shares_fit_the_limit_is_one_statement_where_the_adapter_can(
    queue: readyq.Queue,
) -> None:
    """grouped_claim_in_one_statement: the ranked groups' locked windows and the UPDATE
    are one statement, instead of a select per group and then the UPDATE."""
    got, sent = _claim_sending(queue, "grouped_claim_in_one_statement", "abcc", "cabc")
    assert got == "ccab"
    assert len(sent) == 1, sent
    assert "SKIP LOCKED" in sent[0], sent[0]
    assert "UPDATE" in sent[0], sent[0]


def test_grouped_claim_sends_a_second_statement_only_to_fill_unused_slots(
    queue: readyq.Queue,
) -> None:
    """The work-conserving pass costs a statement only when a group came up short."""
    got, sent = _claim_sending(queue, "grouped_claim_in_one_statement", "aaa", "bab")
    assert got == "aaa"
    assert len(sent) == 2, sent


def test_grouped_pick_whose_shares_fit_the_limit_is_one_select_where_the_adapter_can(
    queue: readyq.Queue,
) -> None:
    """grouped_pick_in_one_statement: the ranked groups' locked windows are one select
    (a UNION ALL), in ranked order, instead of a select per group."""
    got, sent = _claim_sending(queue, "grouped_pick_in_one_statement", "abcc", "cabc")
    assert got == "ccab"
    assert len(_picks(sent)) == 1, sent
    assert _picks(sent)[0].count("SKIP LOCKED") == 3, sent


def test_grouped_pick_selects_again_only_to_fill_unused_slots(queue: readyq.Queue) -> None:
    """With one select for the windows, the work-conserving pass costs a second one only
    when a group came up short."""
    got, sent = _claim_sending(queue, "grouped_pick_in_one_statement", "aaa", "bab")
    assert got == "aaa"
    assert len(_picks(sent)) == 2, sent
