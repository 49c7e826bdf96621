"""PostgreSQL (>= 13): ``FOR NO KEY UPDATE SKIP LOCKED`` claims at READ COMMITTED."""

from __future__ import annotations

import collections
import functools
import re
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..errors import UnsupportedDatabase
from ._base import Adapter, pipeline_allowed, pipeline_observer, plans_once, sqlstate

__all__ = ["PostgreSQLAdapter"]


class PostgreSQLAdapter(Adapter):
    name: ClassVar[str] = "postgresql"
    product: ClassVar[str] = "PostgreSQL"
    minimum_version: ClassVar[tuple[int, ...]] = (13,)
    # Each statement sees rows committed before it: the atomic counter decrement of DAG
    # promotion and the re-checked WHERE of a CAS update rely on it.
    isolation_level: ClassVar[str | None] = "READ COMMITTED"
    skip_locked = True
    key_share_lock = True
    update_returning = True
    claim_in_one_statement = True
    claim_autocommit = True
    update_in_cte = True
    commit_together_capable = True
    insert_returning = True
    listen_notify = True
    # psycopg sends BEGIN before a read and the pool a ROLLBACK after it: a Worker's scan
    # took 2.9 ms in a transaction and 1.2 ms without. (PyMySQL would instead send two
    # SET autocommit; SQLite has no round trips to save.)
    read_autocommit = True
    # (MySQL has LATERAL from 8.0.14 and MariaDB has none; not measured there, so off.)
    lateral_join = True
    # 10 groups: one statement instead of 10 pipelined selects and the UPDATE; such a
    # claim took 3.0-3.6 ms instead of 5.2-5.6 (docs/benchmarks.md, session 7).
    grouped_claim_in_one_statement = True

    def version_reason(self) -> str:
        return "the oldest release still supported upstream, and the oldest readyq tests"

    def execute_together(
        self, conn: Connection, statements: Sequence[tuple[sa.Executable, Mapping[str, Any]]]
    ) -> list[list[Any]]:
        # psycopg's pipeline mode: the statements leave in one round trip (the server still
        # runs them one by one, each with its own snapshot). psycopg sends its own BEGIN
        # before them and waits for it: one more round trip.
        got = _pipelined(conn, statements) if len(statements) > 1 else None
        return super().execute_together(conn, statements) if got is None else got

    def execute_one(
        self, conn: Connection, stmt: sa.Executable, params: Mapping[str, Any]
    ) -> list[Any]:
        driver: Any = conn.connection.driver_connection
        if plans_once(stmt) and driver.autocommit:
            got = self.commit_together(conn, [(stmt, params)])
            if got is not None:
                return got[0]
        return super().execute_one(conn, stmt, params)

    def commit_together(
        self, conn: Connection, statements: Sequence[tuple[sa.Executable, Mapping[str, Any]]]
    ) -> list[list[Any]] | None:
        driver: Any = conn.connection.driver_connection
        if not driver.autocommit:
            raise RuntimeError("commit_together needs a connection in autocommit")
        if not _can_pipeline(conn):
            return None  # before asking its level: an async driver's answer is awaited
        sent = list(statements)
        first = len(sent)  # of the marked statements that end the pipeline
        while first and plans_once(sent[first - 1][0]):
            first -= 1
        if first < len(sent):
            # Else PostgreSQL plans these anew on every execution: 0.3 ms of a 0.7 ms
            # claim (its generic plan, LIMIT unknown, looks costlier than it runs).
            sent.insert(first, _GENERIC_PLAN)
        if _reads_committed_by_default(conn):
            # No BEGIN or COMMIT: a pipeline's statements up to its one Sync are one
            # implicit transaction at the session's default level, here READ COMMITTED.
            # Two statements fewer cost a Worker's tick 7 % less client CPU.
            got = _pipelined(conn, sent, can=True, prepare=range(first, len(sent)))
        else:
            # Said explicitly, else the implicit transaction takes the session's default,
            # and at REPEATABLE READ a statement would not see rows committed while the one
            # before it waited for a lock.
            kept = range(first + 1, len(sent) + 1)  # past the BEGIN
            got = _pipelined(conn, [_BEGIN, *sent, _COMMIT], can=True, prepare=kept)
            got = None if got is None else got[1:-1]
        if got is not None and first < len(statements):
            del got[first]  # the setting's row
        return got

    def notify(self, conn: Connection, channel: str) -> None:
        # pg_notify() takes the channel as a bound value (NOTIFY itself cannot), and is
        # delivered only if and when the transaction commits.
        conn.execute(sa.select(sa.func.pg_notify(channel, "")))

    def listen(
        self, engine: Engine, channel: str, wake: Callable[[], None], stop: threading.Event
    ) -> None:
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", channel):
            raise UnsupportedDatabase(f"channel {channel!r} is not a plain identifier")
        raw = engine.raw_connection()
        try:
            driver: Any = raw.driver_connection
            if not hasattr(driver, "notifies"):
                raise UnsupportedDatabase(
                    f"the {engine.dialect.driver} driver cannot LISTEN; use psycopg 3"
                )
            driver.autocommit = True
            # LISTEN takes no bound parameters; the channel was checked to be an identifier.
            driver.execute(f'LISTEN "{channel}"')  # identifier, not a value: checked above
            while not stop.is_set():
                for _ in driver.notifies(timeout=0.5, stop_after=1):
                    wake()
        except sa.exc.DBAPIError as exc:
            raise UnsupportedDatabase(f"cannot LISTEN (a transaction pooler?): {exc}") from exc
        except Exception as exc:
            if type(exc).__module__.startswith("psycopg"):
                raise UnsupportedDatabase(
                    f"cannot LISTEN (behind a transaction pooler?): {exc}"
                ) from exc
            raise
        finally:
            raw.invalidate()  # its session state (autocommit, LISTEN) must not be reused

    def among(self, column: sa.ColumnElement[Any], ids: sa.CTE) -> sa.ColumnElement[bool]:
        # By the column's index whatever the estimate of ``ids``: joined, a plan that does
        # not know the LIMIT (a generic plan) expects a tenth of the table and hashes a
        # sequential scan of every job (2.7 ms instead of 0.16; docs/benchmarks.md).
        return column == sa.any_(sa.func.array(sa.select(ids.c.id).scalar_subquery()))

    def ranked_groups(self) -> sa.FromClause:
        # One JSON text bind, not two arrays: psycopg dumps a list item by item in Python,
        # and two 10-item arrays cost a claim 22 microseconds more than a string.
        pairs = (
            sa.func.json_array_elements(sa.bindparam("want", type_=_Cast("JSON")))
            .table_valued("pair")
            .render_derived()
        )
        pair = pairs.c.pair
        return sa.select(
            pair.op("->>")(sa.literal_column("0")).label("g"),
            sa.cast(pair.op("->>")(sa.literal_column("1")), sa.Integer).label("n"),
        ).subquery("want")

    def lock_claimable(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        # NO KEY: a plain FOR UPDATE conflicts with the key-share lock an open transaction
        # takes on a job it inserts a dependency on, and SKIP LOCKED would hide that ready
        # job from every claimer until the enqueue commits (NOTES 8).
        return stmt.with_for_update(skip_locked=True, key_share=True)

    def lock_skip(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        # SKIP LOCKED: a sweeper must not queue behind a heartbeat's row lock (NOTES 11).
        return stmt.with_for_update(skip_locked=True, key_share=True)

    def lock_update(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        return stmt.with_for_update(key_share=True)

    def lock_share(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        # KEY SHARE, the lock the foreign-key check takes anyway: claimers' NO KEY UPDATE
        # SKIP LOCKED still see the row (FOR SHARE would hide it, NOTES 8) ...
        return stmt.with_for_update(read=True, key_share=True)

    def lock_terminal(self, stmt: sa.Select[Any]) -> sa.Select[Any] | None:
        # ... while the plain FOR UPDATE of a finishing job waits for it, so the edge is
        # committed (and visible at READ COMMITTED) before the job looks for dependents.
        return stmt.with_for_update()

    def is_retryable(self, exc: DBAPIError) -> bool:
        # 40P01 deadlock_detected, 40001 serialization_failure.
        return sqlstate(exc) in {"40P01", "40001"}

    def is_missing_table(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) == "42P01"  # undefined_table


_BEGIN: tuple[sa.Executable, Mapping[str, Any]] = (
    sa.text("BEGIN ISOLATION LEVEL READ COMMITTED"),
    {},
)
_COMMIT: tuple[sa.Executable, Mapping[str, Any]] = (sa.text("COMMIT"), {})
#: For the rest of the transaction (``true``: SET LOCAL), plan statements without their
#: values and keep the plan: every statement after it is marked ``plan_once``. And no JIT:
#: it compiles on every run of a plan estimated above ``jit_above_cost``, and a generic
#: plan's estimate can be far off (a finalize took 220 ms, most of it JIT: session 21).
_GENERIC_PLAN: tuple[sa.Executable, Mapping[str, Any]] = (
    sa.select(
        sa.func.set_config("plan_cache_mode", "force_generic_plan", sa.true()),
        sa.func.set_config("jit", "off", sa.true()),
    ),
    {},
)


#: Key of :func:`_reads_committed_by_default`'s answer in the pooled connection's ``info``.
_DEFAULT_LEVEL = "readyq_default_isolation"


def _reads_committed_by_default(conn: Connection) -> bool:
    """Whether this session's transactions default to READ COMMITTED: asked once per
    connection (the server's, database's or role's setting; one a caller SETs on a
    pooled session later is not seen: docs/databases.md)."""
    info = conn.connection.info
    level = info.get(_DEFAULT_LEVEL)
    if level is None:
        driver: Any = conn.connection.driver_connection  # in autocommit: no transaction
        row = driver.execute("SHOW default_transaction_isolation").fetchone()
        level = info[_DEFAULT_LEVEL] = row[0]
    return bool(level == "read committed")


def _pipelined(
    conn: Connection,
    statements: Sequence[tuple[sa.Executable, Mapping[str, Any]]],
    *,
    can: bool = False,
    prepare: range = range(0),
) -> list[list[Any]] | None:
    """The statements sent in one psycopg pipeline; None if this connection cannot
    (``can``: the caller already asked :func:`_can_pipeline`). Those at the indexes in
    ``prepare`` (the plan setting and the statements it covers) are prepared on their
    first run."""
    driver: Any = conn.connection.driver_connection
    if not (can or _can_pipeline(conn)):
        return None
    sent = [(_compiled(stmt, conn.dialect), params) for stmt, params in statements]
    if any(compiled is None for compiled, _ in sent):
        return None
    texts = [compiled.string for compiled, _ in sent]
    values = [compiled.construct_params(params) for compiled, params in sent]
    observer = pipeline_observer(conn)
    if observer is not None:
        observer.before(conn, texts, values)
    # Else psycopg sends a statement unnamed until its fifth run, planned anew each time
    # (0.4-0.9 ms for the claim or the scan), and a Worker runs its scan every few ticks:
    # a third of a short-lived Worker's scans. Off where the connection's owner turned
    # preparing off (prepare_threshold None, as behind PgBouncer): psycopg obeys that.
    cursors: list[Any] = []
    try:
        with driver.pipeline():
            for k, (text, value) in enumerate(zip(texts, values, strict=True)):
                cursors.append(driver.cursor())
                cursors[-1].execute(text, value, prepare=True if k in prepare else None)
        encoding = driver.info.encoding
        rows = [_rows(cur, encoding) for cur in cursors]
        counts = [cur.rowcount for cur in cursors]
    except conn.dialect.loaded_dbapi.Error as exc:
        # What SQLAlchemy does for its own statements: a DBAPIError (the retry loop
        # and error mapping expect one), and a dead connection is not pooled again.
        gone = conn.dialect.is_disconnect(exc, conn.connection.dbapi_connection, None)
        if gone:
            conn.invalidate(exc)
        if observer is not None:
            observer.failed(conn, texts, exc)
        raise sa.exc.DBAPIError.instance(
            ";\n".join(texts),
            None,
            exc,
            conn.dialect.loaded_dbapi.Error,
            connection_invalidated=gone,
        ) from exc
    finally:
        for cur in cursors:
            cur.close()
    if observer is not None:
        observer.after(conn, texts, counts)
    return rows


def _can_pipeline(conn: Connection) -> bool:
    """psycopg 3 on libpq >= 14 has a pipeline mode; psycopg2 and others have none. An
    async driver's pipeline is awaited: the greenlet-bridged core cannot enter it."""
    if conn.dialect.is_async or not pipeline_allowed(conn):
        return False
    driver = conn.connection.driver_connection
    if getattr(type(driver), "pipeline", None) is None:
        return False
    package = sys.modules.get(type(driver).__module__.partition(".")[0])
    pipeline = getattr(package, "Pipeline", None)
    return pipeline is not None and bool(pipeline.is_supported())


@functools.lru_cache(maxsize=256)
class _Cast(sa.types.UserDefinedType[Any]):
    """A value bound as it is and cast in the SQL (``%(x)s::JSON``). Unlike ``sa.JSON`` it
    has no bind processor, so its statement may travel in a pipeline."""

    cache_ok = True
    render_bind_cast = True

    def __init__(self, spec: str) -> None:
        self.spec = spec

    def get_col_spec(self, **kw: Any) -> str:
        return self.spec


@functools.lru_cache(maxsize=256)
def _compiled(stmt: sa.Executable, dialect: sa.Dialect) -> Any:
    """The statement compiled for sending without SQLAlchemy's execution, or None when it
    binds a value through a bind processor (the raw value would reach the server).

    Cached by identity (readyq builds each statement once): compiling the ranked claim
    on every tick cost a Worker more client CPU than the round trips it saved."""
    compiled = stmt.compile(dialect=dialect)  # type: ignore[attr-defined]  # a ClauseElement
    return None if compiled._bind_processors else compiled  # no public accessor


def _rows(cur: Any, encoding: str) -> list[Any]:
    # The names straight from the result: ``cur.description`` builds a Column object per
    # column, anew on every access (a tenth of the Python calls of a Worker's tick).
    res = cur.pgresult
    if res is None or res.status != _TUPLES_OK:
        return []
    row = _row_type(tuple(res.fname(i).decode(encoding) for i in range(res.nfields)))
    return [row(*r) for r in cur.fetchall()]


_TUPLES_OK = 2  # libpq's PGRES_TUPLES_OK (psycopg.pq.ExecStatus.TUPLES_OK)


@functools.lru_cache(maxsize=256)
def _row_type(names: tuple[str, ...]) -> Any:
    return collections.namedtuple("Row", names, rename=True)
