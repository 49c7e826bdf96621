"""The claim's plan reads about ``limit`` rows, whatever else the table holds.

The scaling promise (a claim does not slow down with finished or blocked jobs) checked by
counting the rows the server actually reads (PostgreSQL ``EXPLAIN (ANALYZE, FORMAT
JSON)``, MariaDB ``ANALYZE FORMAT=JSON``), not by timing: exact, and the same on a loaded
machine. Session 3 found a PostgreSQL plan that walked every ready row on every claim
after statistics were taken while few jobs were ready; the third test keeps it found.
The statement checked is the one that reads the ready set: the one-statement claim where
the adapter has it, else the locked select (the UPDATE then goes by primary key). The
Worker's capped scan is held to the same standard (about ``LIMIT`` rows per group), and
so is a finalize's DAG promotion (about the children's rows).
SQLite reports no row counts (its claim UPDATE's plan shape is checked instead), and MySQL
8's EXPLAIN ANALYZE is a text tree: not covered.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from readyq_bench.db import fill_jobs

import readyq
from readyq import _claim, _dag, _guards, _scan, _store
from readyq.dialects import plans_once, postgresql
from readyq.schema import deps, jobs

try:
    from tests.observers import cursor_statements
except ImportError:  # pragma: no cover - tests/ on sys.path instead
    from observers import cursor_statements  # type: ignore[no-redef]

pytestmark = pytest.mark.backend

FILLER = 3000
LIMIT = 10
SCAN_GROUPS = 10
#: Rows a claim of LIMIT may read: the picked index entries, the rows it updates by key,
#: and slack for a row skipped as locked or re-checked. Far below FILLER.
BOUND = 6 * LIMIT


def _server(q: readyq.Queue) -> str:
    return "mariadb" if getattr(q.engine.dialect, "is_mariadb", False) else q.engine.dialect.name


@pytest.fixture
def explained(queue: readyq.Queue) -> readyq.Queue:
    """The queue, on a server whose plans report the rows read."""
    if _server(queue) not in _EXPLAIN:
        pytest.skip(f"{_server(queue)} reports no rows read per table in a JSON plan")
    return queue


def _ready(q: readyq.Queue, n: int, group: str = "default") -> None:
    with q.graph() as g:
        for i in range(n):
            g.add("t", {"i": i}, group=group)


def _analyze(q: readyq.Queue) -> None:
    sql = f"ANALYZE TABLE {jobs.name}" if _server(q) == "mariadb" else f"ANALYZE {jobs.name}"
    with q.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        result = conn.exec_driver_sql(sql)
        if result.returns_rows:  # MariaDB answers with a status table
            result.all()


def _rows_read(q: readyq.Queue, stmt: Any, params: dict[str, Any]) -> int:
    """Rows the server read from readyq_jobs running ``stmt`` (rolled back)."""
    compiled = stmt.compile(dialect=q.engine.dialect)
    return _sql_rows_read(q, compiled.string, compiled.construct_params(params))


def _sql_rows_read(q: readyq.Queue, sql: str, params: Any) -> int:
    """:func:`_rows_read` of driver-level SQL and parameters."""
    prefix, count, _ = _EXPLAIN[_server(q)]
    with q.engine.connect() as conn, conn.begin() as tx:
        got = conn.exec_driver_sql(prefix + sql, params).scalar_one()
        tx.rollback()
    if isinstance(got, str):
        got = json.loads(got)
    return int(count(got[0] if isinstance(got, list) else got))


def _pg_rows(node: dict[str, Any], tables: tuple[str, ...] = (jobs.name,)) -> int:
    own = 0
    if node.get("Relation Name") in tables and "Scan" in node["Node Type"]:
        own = node["Actual Rows"] * node["Actual Loops"]
        own += node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
    return own + sum(_pg_rows(child, tables) for child in node.get("Plans", []))


def _mariadb_rows(node: Any) -> float:
    """Sum of r_rows x r_loops over every access to readyq_jobs in the plan."""
    if isinstance(node, list):
        return sum(_mariadb_rows(n) for n in node)
    if not isinstance(node, dict):
        return 0
    own = 0.0
    if node.get("table_name") == jobs.name and node.get("r_rows") is not None:  # None: not run
        own = float(node["r_rows"]) * float(node.get("r_loops", 1))
    return own + sum(_mariadb_rows(v) for v in node.values())


#: Per server: how to have a statement run and counted, how to count its JSON plan, and
#: how to keep the statistics as they are (no automatic ANALYZE).
_EXPLAIN = {
    "postgresql": (
        "EXPLAIN (ANALYZE, FORMAT JSON) ",
        lambda plan: _pg_rows(plan["Plan"]),
        f"ALTER TABLE {jobs.name} SET (autovacuum_enabled = false)",
    ),
    "mariadb": (
        "ANALYZE FORMAT=JSON ",
        _mariadb_rows,
        f"ALTER TABLE {jobs.name} STATS_AUTO_RECALC = 0",
    ),
}


def _claim_reads(q: readyq.Queue) -> int:
    params = _claim._claim_params("plan", q.clock.now_us(), 10**7, LIMIT)
    if q.adapter.claim_in_one_statement:
        return _rows_read(q, _claim._claim_one_statement(q.adapter, _guards.guard), params)
    return _rows_read(q, _claim._claim_select(q.adapter, False), params)


def test_claim_reads_about_limit_rows_beside_many_finished_jobs(explained: readyq.Queue) -> None:
    _ready(explained, 3 * LIMIT)
    fill_jobs(explained.engine, FILLER, state="done", now=explained.clock.now_us())
    assert _claim_reads(explained) <= BOUND


def test_claim_reads_about_limit_rows_beside_many_blocked_jobs(explained: readyq.Queue) -> None:
    _ready(explained, 3 * LIMIT)
    fill_jobs(explained.engine, FILLER, state="blocked", now=explained.clock.now_us())
    assert _claim_reads(explained) <= BOUND


def test_claim_reads_about_limit_rows_when_statistics_predate_the_backlog(
    explained: readyq.Queue,
) -> None:
    """Statistics from a quiet spell (thousands of finished jobs, two ready), then a
    backlog of thousands, before autovacuum analyzes again. (With statistics from a
    table of a row or two, any plan may scan it: docs/databases.md.)"""
    with explained.engine.begin() as conn:
        conn.exec_driver_sql(_EXPLAIN[_server(explained)][2])
    fill_jobs(explained.engine, FILLER, state="done", now=explained.clock.now_us())
    _ready(explained, 2)
    _analyze(explained)
    _ready(explained, FILLER)
    assert _claim_reads(explained) <= BOUND


def test_grouped_claim_reads_about_its_shares_beside_other_groups(
    explained: readyq.Queue,
) -> None:
    """A claim by ranked groups (the statements it really sends: one; or the locked
    windows, as one UNION ALL or a select per group, then the UPDATE) skips the other
    groups' ready rows by the claim index."""
    for g in ("mine", "also"):
        _ready(explained, 3 * LIMIT, group=g)
    _ready(explained, FILLER, group="others")
    _analyze(explained)
    ad, now = explained.adapter, explained.clock.now_us()
    ranking = ["mine", "also"] * (LIMIT // 2)

    def claim(conn: Any) -> None:
        _claim.claim(conn, ad, worker_id="w", now=now, ttl_us=10**7, limit=LIMIT, groups=ranking)

    sent = _statements_of(explained, claim)
    assert any("UPDATE" in sql for sql, _ in sent), sent
    assert sum(_sql_rows_read(explained, sql, params) for sql, params in sent) <= BOUND


def _generic_rows_read(q: readyq.Queue, stmt: Any, params: dict[str, Any]) -> int:
    """:func:`_rows_read` of the plan PostgreSQL makes for ``stmt`` without its values (a
    generic plan, what ``plan_cache_mode`` keeps), checked to be that plan."""
    return _pg_rows(_generic_plan(q, stmt, params)["Plan"])


def _generic_plan(
    q: readyq.Queue, stmt: Any, params: dict[str, Any], first: tuple[str, ...] = ()
) -> dict[str, Any]:
    """``EXPLAIN (ANALYZE, FORMAT JSON)`` of ``stmt`` run with its generic plan, under the
    plan setting the adapter sends before such statements (after ``first``; rolled back)."""
    compiled = stmt.compile(dialect=q.engine.dialect.__class__(paramstyle="numeric_dollar"))
    values = compiled.construct_params(params)
    positional = tuple(values[name] for name in compiled.positiontup or ())
    with q.engine.connect() as conn:
        try:
            with conn.begin() as tx:
                for sql in first:
                    conn.exec_driver_sql(sql)
                conn.execute(*postgresql._GENERIC_PLAN)
                # Typed as psycopg types them (an untyped CASE value would be text).
                typed = ", ".join(_pg_type(v) for v in positional)
                conn.exec_driver_sql(f"PREPARE readyq_generic ({typed}) AS {compiled.string}")
                types = conn.exec_driver_sql(_PREPARED_TYPES).scalar_one()
                # EXECUTE's arguments cannot be bound server-side (a utility statement's
                # parameters have no type): psycopg's client-side binding quotes them.
                cur = pytest.importorskip("psycopg").ClientCursor(conn.connection.driver_connection)
                marks = ", ".join(f"%s::{t}" for t in types)  # types the server inferred
                cur.execute(f"{_EXPLAIN_GENERIC}({marks})", positional)
                ((plan,),) = cur.fetchall()
                plans = conn.exec_driver_sql(_PREPARED_PLANS).one()
                tx.rollback()
        finally:
            conn.exec_driver_sql("DEALLOCATE ALL")  # not transactional: gone either way
    assert tuple(plans) == (1, 0), "not the generic plan"
    return dict(plan[0])


def _pg_type(value: Any) -> str:
    """PREPARE's type for a parameter (``unknown``: inferred from its context)."""
    for kind, name in ((bool, "boolean"), (int, "bigint"), (float, "float8"), (str, "text")):
        if isinstance(value, kind):  # bool before int; a str enum (JobState) is text
            return name
    return "unknown"


_EXPLAIN_GENERIC = "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE readyq_generic"
_PREPARED_TYPES = (
    "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'readyq_generic'"
)
_PREPARED_PLANS = (
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'readyq_generic'"
)


def _planned_once(q: readyq.Queue) -> list[tuple[str, Any, dict[str, Any]]]:
    """Every claim statement marked ``plan_once``, with values for a claim of LIMIT."""
    ad, now = q.adapter, q.clock.now_us()
    params = _claim._claim_params("plan", q.clock.now_us(), 10**7, LIMIT)
    boxed = {**params, **_guards.id_values("id", [1, 2, 3])}
    ranked = _claim.one_statement(
        ad, worker_id="plan", now=now, ttl_us=10**7, limit=LIMIT, groups=["mine", "also"] * 5
    )
    got = [
        ("claim", _claim._claim_one_statement(ad, _guards.guard), params),
        ("claim unless boxed", _claim._claim_one_statement(ad, _guards.guard, 3), boxed),
        ("ranked claim", *ranked),
    ]
    assert all(plans_once(stmt) for _, stmt, _ in got)
    return got


def _statistics_of_a_quiet_spell_on_postgresql(q: readyq.Queue) -> None:
    """Kept statistics (no autovacuum) of thousands of finished jobs and two ready ones."""
    if _server(q) != "postgresql":
        pytest.skip("a PostgreSQL generic plan")
    with q.engine.begin() as conn:
        conn.exec_driver_sql(_EXPLAIN["postgresql"][2])
    fill_jobs(q.engine, FILLER, state="done", now=q.clock.now_us())
    _ready(q, 2)
    _analyze(q)


def test_claims_planned_once_read_about_limit_rows_when_statistics_predate_the_backlog(
    queue: readyq.Queue,
) -> None:
    """PostgreSQL keeps one plan for the claims marked ``plan_once``: made without their
    values (how many jobs, which groups), it must still walk the claim's index in order
    and update the picked rows by primary key, even on the statistics of a quiet spell."""
    _statistics_of_a_quiet_spell_on_postgresql(queue)
    for g in ("mine", "also", "others"):
        _ready(queue, FILLER // 3, group=g)
    read = {name: _generic_rows_read(queue, stmt, p) for name, stmt, p in _planned_once(queue)}
    assert all(n <= BOUND for n in read.values()), read


def test_finalize_planned_once_reads_about_its_rows_beside_running_jobs(
    queue: readyq.Queue,
) -> None:
    """A finalize's terminal lock and its update + promotion are planned once too: made
    without their values, they must still find the jobs by primary key (not by walking
    the running ones) and their dependents by the edges' index."""
    _statistics_of_a_quiet_spell_on_postgresql(queue)
    _ready(queue, FILLER)
    leases = queue.claim("w", limit=FILLER)
    items = [(lease, "{}") for lease in leases[:LIMIT]]
    sent = _store._settle_sent(queue.adapter, items, queue.clock.now_us(), unless_boxed=True)
    assert len(sent) == 2
    assert all(plans_once(stmt) for stmt, _ in sent)
    read = [_generic_rows_read(queue, stmt, params) for stmt, params in sent]
    assert all(n <= BOUND for n in read), read


#: Blocked jobs waiting on one root. Beside a few thousand edges, a scan of them all costs
#: about what the index does (a third of a millisecond), and PostgreSQL may take it.
MANY_DEPENDENTS = 20_000


def _finalize_beside_a_parent_with_many_dependents(q: readyq.Queue) -> list[Any]:
    """A finalize's statements for LIMIT claimed jobs with a dependent each, beside
    MANY_DEPENDENTS blocked jobs that all wait on one root: the edges' statistics then say
    every parent has as many."""
    if _server(q) != "postgresql":
        pytest.skip("a PostgreSQL generic plan")
    with q.graph() as g:
        for i in range(LIMIT):
            g.add("t", {"i": i}, after=[g.add("t", {"i": i})])
    fill_jobs(q.engine, MANY_DEPENDENTS, state="blocked", now=q.clock.now_us())  # ANALYZEs
    items = [(lease, "{}") for lease in q.claim("w", limit=LIMIT)]
    return _store._settle_sent(q.adapter, items, q.clock.now_us(), unless_boxed=True)


def test_finalize_planned_once_finds_dependents_by_index_beside_a_parent_with_many(
    queue: readyq.Queue,
) -> None:
    """Made without the finishing jobs' ids, the plan must still look up their dependents
    in the edges' index, not hash every edge and job (220 ms a finalize beside 100,000
    blocked jobs: docs/benchmarks.md, session 21)."""
    _, (stmt, params) = _finalize_beside_a_parent_with_many_dependents(queue)
    plan = _generic_plan(queue, stmt, params)
    assert _pg_rows(plan["Plan"], (jobs.name, deps.name)) <= BOUND


def test_statements_planned_once_run_without_jit(queue: readyq.Queue) -> None:
    """JIT compiles on every run of a plan estimated above ``jit_above_cost`` (on, and 0
    here, so that any plan would be): a generic plan's estimate can be far off, and
    compiling took most of a 220 ms finalize."""
    if _server(queue) != "postgresql":
        pytest.skip("a PostgreSQL generic plan")
    with queue.engine.connect() as conn:
        if not conn.exec_driver_sql("SELECT pg_jit_available()").scalar_one():
            pytest.skip("this PostgreSQL server has no JIT")
    _ready(queue, LIMIT)
    items = [(lease, "{}") for lease in queue.claim("w", limit=LIMIT)]
    sent = _store._settle_sent(queue.adapter, items, queue.clock.now_us(), unless_boxed=True)
    _, (stmt, params) = sent
    jit_on = ("SET LOCAL jit = on", "SET LOCAL jit_above_cost = 0")
    plan = _generic_plan(queue, stmt, params, first=jit_on)
    assert "JIT" not in plan


def test_capped_scan_planned_once_reads_about_limit_rows_per_group(queue: readyq.Queue) -> None:
    """The Worker's scan is planned once too: without the states' values it must still
    count the running jobs by their index (not a sequential scan of the finished ones)
    and walk each group's window down the claim index."""
    if _server(queue) != "postgresql":
        pytest.skip("a PostgreSQL generic plan")
    for i in range(SCAN_GROUPS):
        _ready(queue, FILLER // SCAN_GROUPS, group=f"g{i}")
    queue.claim("w", limit=LIMIT)
    fill_jobs(queue.engine, FILLER, state="done", now=queue.clock.now_us())
    _analyze(queue)
    stmt = _scan._capped_lateral(queue.adapter)
    assert plans_once(stmt)
    params = {"now": queue.clock.now_us(), "cap": LIMIT}
    assert _generic_rows_read(queue, stmt, params) <= SCAN_GROUPS * BOUND // 3


def _picked_update(q: readyq.Queue) -> tuple[Any, dict[str, Any]]:
    """The claim's UPDATE of LIMIT picked ready jobs (a grouped claim's second step)."""
    with q.engine.connect() as conn:
        ids = list(conn.execute(sa.select(jobs.c.id).order_by(jobs.c.id).limit(LIMIT)).scalars())
    params = _claim._claim_params("plan", q.clock.now_us(), 10**7, LIMIT)
    params.update(_guards.id_values("id", ids))
    return _claim._claim_update(q.adapter, _guards.guard, LIMIT), params


def test_claim_update_reads_only_the_picked_rows_beside_a_ready_backlog(
    explained: readyq.Queue,
) -> None:
    _ready(explained, FILLER)
    _analyze(explained)
    assert _rows_read(explained, *_picked_update(explained)) <= BOUND


def test_sqlite_claim_update_reaches_the_picked_rows_by_primary_key(queue: readyq.Queue) -> None:
    """Without statistics SQLite took the state index for ``state IN ('ready')`` and
    walked every ready row (13 ms per claim beside 100,000)."""
    if queue.engine.dialect.name != "sqlite":
        pytest.skip("a SQLite plan")
    _ready(queue, 2 * LIMIT)
    stmt, params = _picked_update(queue)
    with queue.engine.connect() as conn:
        compiled = stmt.compile(dialect=conn.dialect)
        values = compiled.construct_params(params)
        positional = tuple(values[name] for name in compiled.positiontup or ())
        plan = conn.exec_driver_sql("EXPLAIN QUERY PLAN " + compiled.string, positional).all()
    details = [row[-1] for row in plan]
    assert any("PRIMARY KEY" in d for d in details), details
    assert not any("INDEX" in d for d in details), details


def _statements_of(q: readyq.Queue, run: Any) -> list[tuple[str, Any]]:
    """The statements ``run(conn)`` sends, as the driver got them (then rolled back)."""
    with q.engine.connect() as conn, conn.begin() as tx:
        with cursor_statements(conn) as sent:
            run(conn)
        tx.rollback()
    return sent


def test_capped_scan_reads_about_limit_rows_per_group_beside_a_long_backlog(
    explained: readyq.Queue,
) -> None:
    """A Worker's scan (groups found by skipping through the index, then each group's first
    LIMIT ready rows) reads about LIMIT rows per group, not the backlog."""
    for i in range(SCAN_GROUPS):
        _ready(explained, FILLER // SCAN_GROUPS, group=f"g{i}")
    _analyze(explained)
    ad, now = explained.adapter, explained.clock.now_us()
    sent = _statements_of(explained, lambda conn: _scan.scan(conn, ad, now=now, limit=LIMIT))
    assert sum(_sql_rows_read(explained, sql, params) for sql, params in sent) <= (
        SCAN_GROUPS * BOUND // 3
    )


def test_promoting_dependents_reads_about_their_rows_beside_many_finished_jobs(
    explained: readyq.Queue,
) -> None:
    """A finalize's DAG promotion finds the children by the deps index and updates them by
    key; MariaDB before 11.1 ran the UPDATE's IN (SELECT ...) against every job."""
    parent = explained.enqueue("parent")
    for _ in range(3):
        explained.enqueue("child", after=[parent])
    fill_jobs(explained.engine, FILLER, state="done", now=explained.clock.now_us())
    _analyze(explained)
    ad = explained.adapter
    sent = _statements_of(explained, lambda conn: _dag.run_promote_done(conn, ad, [parent]))
    assert any(sql.lstrip().upper().startswith("UPDATE") for sql, _ in sent), sent
    assert sum(_sql_rows_read(explained, sql, params) for sql, params in sent) <= BOUND


def test_finalize_reads_about_its_rows_beside_running_jobs_statistics_never_saw(
    explained: readyq.Queue,
) -> None:
    """A finalize's update finds its jobs by primary key. With its state re-check as an
    index condition, statistics from before a burst of claims made the planner walk every
    running job in the claim index to find ten of them."""
    with explained.engine.begin() as conn:
        conn.exec_driver_sql(_EXPLAIN[_server(explained)][2])
    _ready(explained, FILLER)
    _analyze(explained)
    leases = explained.claim("w", limit=FILLER)
    items = [(lease, "{}") for lease in leases[:LIMIT]]
    sent = _store._settle_sent(explained.adapter, items, explained.clock.now_us())
    assert sum(_rows_read(explained, stmt, params) for stmt, params in sent) <= BOUND


def test_sweep_reads_about_its_expired_rows_beside_many_finished_jobs(
    explained: readyq.Queue,
) -> None:
    """The sweeper finds expired leases and passed deadlines by the index of running rows
    (partial on PostgreSQL: its bound ``state`` must still match the index predicate)."""
    _ready(explained, 3)
    explained.claim("crashed", ttl=1, limit=3)
    fill_jobs(explained.engine, FILLER, state="done", now=explained.clock.now_us())
    _analyze(explained)
    ad, later = explained.adapter, explained.clock.now_us() + 10**7
    sent = _statements_of(explained, lambda conn: _store.reclaim(conn, ad, now=later, batch=LIMIT))
    assert [sql.lstrip()[:6].upper() for sql, _ in sent].count("UPDATE") == 3
    assert sum(_sql_rows_read(explained, sql, params) for sql, params in sent) <= BOUND


def test_prune_reads_about_its_batch_beside_many_ready_jobs(explained: readyq.Queue) -> None:
    """Retention finds finished rows by the index of finished rows, not by walking the
    backlog (MariaDB paged by id alone walked the primary key on some runs)."""
    fill_jobs(explained.engine, FILLER, state="ready", now=explained.clock.now_us())
    _ready(explained, 3)
    for lease in explained.claim("w", limit=3):
        explained.finalize(lease)
    _analyze(explained)
    later = explained.clock.now_us() + 10**7
    sent = _statements_of(
        explained,
        lambda conn: _store.prune(
            conn, state=readyq.JobState.DONE, before=later, batch=LIMIT, after=(-1, 0)
        ),
    )
    assert sum(_sql_rows_read(explained, sql, params) for sql, params in sent) <= BOUND


def test_a_key_lookup_reads_only_keyed_jobs(explained: readyq.Queue) -> None:
    """Enqueue's "does this key exist?" reads by the key index, never the keyless jobs
    around it (on PostgreSQL an index of the keyed jobs alone)."""
    fill_jobs(explained.engine, FILLER, state="ready", now=explained.clock.now_us())
    keys = [f"k{i}" for i in range(3)]
    for key in keys:
        explained.enqueue("t", key=key)
    _analyze(explained)
    c = jobs.c
    asked = [*keys, "missing"]
    stmt = sa.select(c.key, c.id).where(c.key.in_([sa.bindparam(f"k{i}") for i in range(4)]))
    assert _rows_read(explained, stmt, {f"k{i}": k for i, k in enumerate(asked)}) <= BOUND


def test_postgresql_indexes_leave_out_the_rows_they_never_serve(queue: readyq.Queue) -> None:
    """A state change rewrites the row into every index whose predicate it meets: the
    sweeper, retention and lookup indexes hold only rows whose column is set."""
    if _server(queue) != "postgresql":
        pytest.skip("partial indexes are created on PostgreSQL only")
    with queue.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = :t"),
            {"t": jobs.name},
        ).all()
    where = {name: d.partition(" WHERE ")[2] for name, d in rows}
    assert where == {
        "pk_readyq_jobs": "",
        "uq_readyq_jobs_key": "(key IS NOT NULL)",
        "ix_readyq_jobs_claim": "",
        "ix_readyq_jobs_global": "",
        "ix_readyq_jobs_expiry": "(lease_expires_us IS NOT NULL)",
        "ix_readyq_jobs_deadline": "(deadline_us IS NOT NULL)",
        "ix_readyq_jobs_finished": "(finished_us IS NOT NULL)",
        "ix_readyq_jobs_parent": "(parent_id IS NOT NULL)",
        "ix_readyq_jobs_cancelled_by": "(cancelled_by IS NOT NULL)",
    }


def test_rows_read_counts_a_full_scan(explained: readyq.Queue) -> None:
    """The counter itself: a filter on an unindexed column reads every row."""
    _ready(explained, 50)
    stmt = sa.select(jobs.c.id).where(jobs.c.type == sa.bindparam("t"))
    assert _rows_read(explained, stmt, {"t": "t"}) >= 50
