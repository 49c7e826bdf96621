"""Adapter.execute_together and commit_together: statements sent together, run in order.

PostgreSQL sends them in one psycopg pipeline; the other adapters run them one after
another. Either way the results must be those of running them one by one.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

import readyq
from readyq.dialects import plan_once
from readyq.schema import jobs

try:
    from tests.observers import Recorder
except ImportError:  # pragma: no cover - tests/ on sys.path instead
    from observers import Recorder  # type: ignore[no-redef]

pytestmark = pytest.mark.backend

c = jobs.c
SET_PRIORITY = sa.update(jobs).where(c.id == sa.bindparam("job")).values(priority=sa.bindparam("p"))
READ_PRIORITY = sa.select(c.id, c.priority).where(c.id == sa.bindparam("job"))
MISSING_TABLE = sa.text("SELECT x FROM readyq_no_such_table")


def priority(q: readyq.Queue, job: int) -> int:
    with q.engine.connect() as conn:
        return int(conn.execute(READ_PRIORITY, {"job": job}).one().priority)


def autocommit(q: readyq.Queue) -> Any:
    return q.engine.connect().execution_options(isolation_level="AUTOCOMMIT")


def test_each_statement_sees_the_writes_of_the_one_before(queue: readyq.Queue) -> None:
    """Run in order: the select reads the priority the update just wrote."""
    job = queue.enqueue("t")
    with queue.engine.connect() as conn, conn.begin():
        _, (row,) = queue.adapter.execute_together(
            conn, [(SET_PRIORITY, {"job": job, "p": 7}), (READ_PRIORITY, {"job": job})]
        )
    assert (row.id, row[1]) == (job, 7)


def test_a_statement_without_rows_gives_an_empty_list(queue: readyq.Queue) -> None:
    """An UPDATE without RETURNING has no rows: its slot is an empty list."""
    job = queue.enqueue("t")
    with queue.engine.connect() as conn, conn.begin():
        got = queue.adapter.execute_together(
            conn, [(SET_PRIORITY, {"job": job, "p": 1}), (READ_PRIORITY, {"job": job})]
        )
    assert got[0] == []


def test_a_failing_statement_raises_a_dbapi_error_and_its_transaction_rolls_back(
    queue: readyq.Queue,
) -> None:
    """The error is SQLAlchemy's (readyq's retry loop reads it); nothing is committed."""
    job = queue.enqueue("t")
    with pytest.raises(sa.exc.DBAPIError), queue.engine.connect() as conn, conn.begin():
        queue.adapter.execute_together(
            conn, [(SET_PRIORITY, {"job": job, "p": 9}), (MISSING_TABLE, {})]
        )
    assert priority(queue, job) == 0


def test_the_connection_is_usable_after_a_failed_batch(queue: readyq.Queue) -> None:
    """The next transaction on the pooled connection works (the pipeline was left)."""
    job = queue.enqueue("t")
    with pytest.raises(sa.exc.DBAPIError), queue.engine.connect() as conn, conn.begin():
        queue.adapter.execute_together(conn, [(MISSING_TABLE, {}), (READ_PRIORITY, {"job": job})])
    with queue.engine.connect() as conn, conn.begin():
        (_, (row,)) = queue.adapter.execute_together(
            conn, [(SET_PRIORITY, {"job": job, "p": 3}), (READ_PRIORITY, {"job": job})]
        )
    assert row.priority == 3


def needs_commit_together(q: readyq.Queue) -> None:
    if not q.adapter.commit_together_capable:
        pytest.skip("needs capability commit_together_capable")


def test_commit_together_commits_by_itself(queue: readyq.Queue) -> None:
    """On an autocommit connection the statements are one transaction, committed."""
    needs_commit_together(queue)
    job = queue.enqueue("t")
    with autocommit(queue) as conn:
        got = queue.adapter.commit_together(conn, [(SET_PRIORITY, {"job": job, "p": 5})])
    assert (got, priority(queue, job)) == ([[]], 5)


def test_commit_together_is_all_or_nothing(queue: readyq.Queue) -> None:
    """A later statement failing undoes the earlier ones: one transaction, not several."""
    needs_commit_together(queue)
    job = queue.enqueue("t")
    with pytest.raises(sa.exc.DBAPIError), autocommit(queue) as conn, conn.begin():
        queue.adapter.commit_together(
            conn, [(SET_PRIORITY, {"job": job, "p": 9}), (MISSING_TABLE, {})]
        )
    assert priority(queue, job) == 0


def test_commit_together_runs_at_read_committed_whatever_the_server_default(
    backend: Any, queue: readyq.Queue
) -> None:
    """At REPEATABLE READ a statement would not see rows committed while the lock before
    it waited: the transaction says its level instead of taking the session default."""
    needs_commit_together(queue)
    engine = backend.engine(
        connect_args={"options": "-c default_transaction_isolation=repeatable\\ read"}
    )
    with readyq.Queue(engine) as q:
        level = sa.text("SELECT current_setting('transaction_isolation') AS level")
        with autocommit(q) as conn:
            assert conn.execute(level).scalar() == "repeatable read"  # the session default
            got = q.adapter.commit_together(conn, [(level, {}), (level, {})])
    assert got is not None
    assert [rows[0].level for rows in got] == ["read committed", "read committed"]


def test_commit_together_statements_share_one_transaction(queue: readyq.Queue) -> None:
    """Without BEGIN and COMMIT (a READ COMMITTED session default) the statements still
    run in one transaction, at READ COMMITTED: the one the pipeline's Sync commits."""
    needs_commit_together(queue)
    xact = sa.text(
        "SELECT txid_current() AS xid, current_setting('transaction_isolation') AS level"
    )
    rec = Recorder()
    with observed(queue, rec) as conn:
        got = queue.adapter.commit_together(conn, [(xact, {}), (xact, {})])
    assert got is not None
    (first,), (second,) = got
    assert (first.xid, first.level) == (second.xid, "read committed")
    assert rec.seen[0] == ("before", [{}, {}])  # nothing sent but the two statements


def test_commit_together_goes_by_the_level_it_was_told_once_per_session(
    queue: readyq.Queue,
) -> None:
    """The session's default level is asked once and kept with the pooled connection:
    told REPEATABLE READ, the pipeline says BEGIN ISOLATION LEVEL READ COMMITTED and COMMIT."""
    needs_commit_together(queue)
    rec = Recorder()
    with observed(queue, rec) as conn:
        queue.adapter.commit_together(conn, [(READ_PRIORITY, {"job": 0})])  # asks
        assert conn.connection.info["readyq_default_isolation"] == "read committed"
        conn.connection.info["readyq_default_isolation"] = "repeatable read"
        try:
            queue.adapter.commit_together(conn, [(READ_PRIORITY, {"job": 0})])
        finally:
            del conn.connection.info["readyq_default_isolation"]  # asked again next time
    assert [len(params) for kind, params in rec.seen if kind == "before"] == [1, 3]


def test_commit_together_refuses_a_connection_in_a_transaction(queue: readyq.Queue) -> None:
    """Its BEGIN and COMMIT would end the caller's transaction early."""
    needs_commit_together(queue)
    with queue.engine.connect() as conn, conn.begin():
        conn.execute(READ_PRIORITY, {"job": 0})
        with pytest.raises(RuntimeError, match="autocommit"):
            queue.adapter.commit_together(conn, [(READ_PRIORITY, {"job": 0})])


def observed(q: readyq.Queue, observer: Recorder) -> Any:
    return autocommit(q).execution_options(readyq_pipeline_observer=observer)


def test_a_pipeline_observer_sees_the_bound_values_then_the_row_counts(
    queue: readyq.Queue,
) -> None:
    """Statements in a pipeline pass no SQLAlchemy cursor event: the observer sees them."""
    needs_commit_together(queue)
    job = queue.enqueue("t")
    rec = Recorder()
    with observed(queue, rec) as conn:
        queue.adapter.commit_together(conn, [(SET_PRIORITY, {"job": job, "p": 4})])
    assert rec.seen == [("before", [{"job": job, "p": 4}]), ("after", [1])]


def test_an_observer_raising_before_a_pipeline_keeps_it_from_being_sent(
    queue: readyq.Queue,
) -> None:
    """Its exception passes unchanged and nothing reaches the database."""
    needs_commit_together(queue)
    job = queue.enqueue("t")
    with pytest.raises(LookupError), observed(queue, Recorder(refuse=True)) as conn:
        queue.adapter.commit_together(conn, [(SET_PRIORITY, {"job": job, "p": 4})])
    assert priority(queue, job) == 0


def test_a_pipeline_observer_hears_of_a_failed_pipeline(queue: readyq.Queue) -> None:
    """``failed`` instead of ``after``, with the driver's error."""
    needs_commit_together(queue)
    rec = Recorder()
    with pytest.raises(sa.exc.DBAPIError), observed(queue, rec) as conn:
        queue.adapter.commit_together(conn, [(MISSING_TABLE, {})])
    assert [kind for kind, _ in rec.seen] == ["before", "failed"]
    assert rec.seen[1][1] == "UndefinedTable"


#: ``plan_once`` statements: the probe label finds them in ``pg_prepared_statements``.
RANGE = sa.select(c.id.label("plan_probe")).where(c.priority >= sa.bindparam("p"))
RANGE = RANGE.order_by(c.priority).limit(sa.bindparam("n"))
PLANS = sa.text(
    "SELECT sum(generic_plans) AS generic, sum(custom_plans) AS custom "
    "FROM pg_prepared_statements WHERE statement LIKE :probe"
)


def needs_plan_cache(q: readyq.Queue) -> None:
    needs_commit_together(q)
    if q.engine.dialect.name != "postgresql":
        pytest.skip("PostgreSQL's plan cache")


def plans_after_runs(q: readyq.Queue, statements: Any, runs: int = 8) -> Any:
    """Generic and custom plans the server made for ``RANGE`` after ``runs`` pipelines of
    ``statements(k)`` on one session (psycopg prepares a statement on its fifth run)."""
    with autocommit(q) as conn:
        for k in range(runs):
            q.adapter.commit_together(conn, statements(k))
        return conn.execute(PLANS, {"probe": "%plan_probe%"}).one()


def test_a_last_statement_marked_plan_once_keeps_one_plan_for_every_value(
    queue: readyq.Queue,
) -> None:
    """PostgreSQL plans it without its values and keeps that plan: no plan per run."""
    needs_plan_cache(queue)
    got = plans_after_runs(queue, lambda k: [(plan_once(RANGE), {"p": k, "n": k + 1})])
    assert (got.generic > 0, got.custom) == (True, 0)


def test_an_unmarked_statement_is_planned_for_its_values(queue: readyq.Queue) -> None:
    """The same statement without the mark gets a custom plan on its prepared runs (the
    setting above is what changes it)."""
    needs_plan_cache(queue)
    got = plans_after_runs(queue, lambda k: [(RANGE, {"p": k, "n": k + 1})])
    assert got.custom > 0


def test_a_marked_statement_that_is_not_last_is_planned_for_its_values(
    queue: readyq.Queue,
) -> None:
    """The setting would outlive it and reach the statements after it: not applied."""
    needs_plan_cache(queue)
    got = plans_after_runs(
        queue, lambda k: [(plan_once(RANGE), {"p": k, "n": k + 1}), (READ_PRIORITY, {"job": 0})]
    )
    assert got.custom > 0


def test_the_plan_setting_ends_with_the_pipelines_transaction(queue: readyq.Queue) -> None:
    """The next statement on the pooled session plans as the session says."""
    needs_plan_cache(queue)
    with autocommit(queue) as conn:
        before = conn.exec_driver_sql("SHOW plan_cache_mode").scalar()
        got = queue.adapter.commit_together(conn, [(plan_once(RANGE), {"p": 0, "n": 1})])
        after = conn.exec_driver_sql("SHOW plan_cache_mode").scalar()
    assert (got, before, after) == ([[]], "auto", "auto")


def test_a_marked_statement_gives_only_its_own_rows(queue: readyq.Queue) -> None:
    """What the adapter sends for the mark adds no result to the list."""
    needs_commit_together(queue)
    job = queue.enqueue("t")
    with autocommit(queue) as conn:
        got = queue.adapter.commit_together(
            conn, [(SET_PRIORITY, {"job": job, "p": 3}), (plan_once(READ_PRIORITY), {"job": job})]
        )
    assert got is not None
    assert [len(rows) for rows in got] == [0, 1]
    assert (got[1][0].id, got[1][0][1]) == (job, 3)


def test_execute_one_gives_a_statements_rows_in_a_transaction(queue: readyq.Queue) -> None:
    """Inside the caller's transaction it is a plain execute: it sees that transaction's
    uncommitted write."""
    job = queue.enqueue("t")
    with queue.engine.connect() as conn, conn.begin():
        conn.execute(SET_PRIORITY, {"job": job, "p": 6})
        (row,) = queue.adapter.execute_one(conn, plan_once(READ_PRIORITY), {"job": job})
    assert (row.id, row[1]) == (job, 6)


def test_execute_one_alone_keeps_one_plan_for_a_marked_statement(queue: readyq.Queue) -> None:
    """Run alone (autocommit), a ``plan_once`` statement is planned without its values."""
    needs_plan_cache(queue)
    with autocommit(queue) as conn:
        for k in range(8):
            queue.adapter.execute_one(conn, plan_once(RANGE), {"p": k, "n": k + 1})
        got = conn.execute(PLANS, {"probe": "%plan_probe%"}).one()
    assert (got.generic > 0, got.custom) == (True, 0)


def test_every_marked_statement_ending_the_pipeline_keeps_one_plan(queue: readyq.Queue) -> None:
    """The setting goes before the first of the marked statements that end the pipeline
    (a finalize's lock, its update and the claim), and reaches all of them."""
    needs_plan_cache(queue)
    got = plans_after_runs(
        queue,
        lambda k: [
            (plan_once(RANGE), {"p": k, "n": k + 1}),
            (plan_once(READ_PRIORITY), {"job": 0}),
        ],
    )
    assert (got.generic > 0, got.custom) == (True, 0)


def test_marked_statements_after_an_unmarked_one_give_their_own_rows(queue: readyq.Queue) -> None:
    """Each statement's rows in its slot, the setting's row in none."""
    needs_commit_together(queue)
    job = queue.enqueue("t")
    read = (plan_once(READ_PRIORITY), {"job": job})
    with autocommit(queue) as conn:
        got = queue.adapter.commit_together(
            conn, [(SET_PRIORITY, {"job": job, "p": 2}), read, read]
        )
    assert got is not None
    assert [[tuple(r) for r in rows] for rows in got] == [[], [(job, 2)], [(job, 2)]]


PREPARED = sa.text(
    "SELECT count(*) FROM pg_prepared_statements WHERE NOT from_sql AND statement LIKE :probe"
)


def prepared_after_one_run(conn: Any, q: readyq.Queue, stmt: Any) -> int:
    """Statements this session holds prepared for ``RANGE`` after one pipeline of ``stmt``."""
    q.adapter.commit_together(conn, [(stmt, {"p": 0, "n": 1})])
    return int(conn.execute(PREPARED, {"probe": "%plan_probe%"}).scalar())


def test_a_marked_statement_ending_the_pipeline_is_prepared_on_its_first_run(
    queue: readyq.Queue,
) -> None:
    """Its kept plan serves from the first run, not the sixth (psycopg's threshold)."""
    needs_plan_cache(queue)
    with autocommit(queue) as conn:
        assert prepared_after_one_run(conn, queue, plan_once(RANGE)) == 1


def test_a_marked_statement_is_prepared_on_its_first_run_in_an_explicit_transaction(
    queue: readyq.Queue,
) -> None:
    """The same where the pipeline says BEGIN and COMMIT (a session default other than
    READ COMMITTED): the BEGIN does not shift which statement is prepared."""
    needs_plan_cache(queue)
    with autocommit(queue) as conn:
        conn.connection.info["readyq_default_isolation"] = "repeatable read"
        try:
            assert prepared_after_one_run(conn, queue, plan_once(RANGE)) == 1
        finally:
            del conn.connection.info["readyq_default_isolation"]


def test_an_unmarked_statement_waits_for_the_drivers_threshold_to_be_prepared(
    queue: readyq.Queue,
) -> None:
    """Only the statements the plan setting covers are prepared at once."""
    needs_plan_cache(queue)
    with autocommit(queue) as conn:
        assert prepared_after_one_run(conn, queue, RANGE) == 0


def test_a_connection_with_preparing_turned_off_prepares_no_marked_statement(
    queue: readyq.Queue,
) -> None:
    """``prepare_threshold = None`` (a pool such as PgBouncer that cannot keep prepared
    statements) is obeyed: the marked statement still runs, unprepared."""
    needs_plan_cache(queue)
    with autocommit(queue) as conn:
        driver = conn.connection.driver_connection
        threshold, driver.prepare_threshold = driver.prepare_threshold, None
        try:
            assert prepared_after_one_run(conn, queue, plan_once(RANGE)) == 0
        finally:
            driver.prepare_threshold = threshold
