"""The adapter interface: everything that differs between databases, and nothing else.

Internal seam, public for dialect authors: third parties may subclass :class:`Adapter`
and register it (``readyq.dialects.register``); the conformance suite proves an adapter
keeps readyq's guarantees. The interface may still change in a 0.x release.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..errors import UnsupportedDatabase

__all__ = ["Adapter", "PipelineObserver"]


class Adapter:
    """Per-database behaviour behind identical method names.

    Capability flags are decided once, from the server version, when the adapter is
    created; business logic reads flags, never database names.
    """

    #: Registry name (``postgresql``, ``mysql``, ``mariadb``, ``sqlite``).
    name: ClassVar[str] = "base"
    #: Human name and minimum server version, for the refusal message.
    product: ClassVar[str] = "database"
    minimum_version: ClassVar[tuple[int, ...]] = ()
    isolation_level: ClassVar[str | None] = None

    #: ``FOR UPDATE SKIP LOCKED``: concurrent claimers take disjoint rows without waiting.
    skip_locked: ClassVar[bool] = False
    #: A lock that does not conflict with foreign-key share locks (PostgreSQL).
    key_share_lock: ClassVar[bool] = False
    #: ``UPDATE ... RETURNING``.
    update_returning: ClassVar[bool] = False
    #: One-statement claim: ``WITH picked AS MATERIALIZED (locked select) UPDATE ...
    #: RETURNING`` on the same table (needs ``update_returning``; MySQL refuses an UPDATE
    #: reading its own table, error 1093).
    claim_in_one_statement: ClassVar[bool] = False
    #: The one-statement claim commits by itself (autocommit): atomic as one statement,
    #: and BEGIN and COMMIT would be two more round trips per claim. Not on SQLite,
    #: where only ``BEGIN IMMEDIATE`` makes a writer wait for the lock (NOTES 2).
    claim_autocommit: ClassVar[bool] = False
    #: ``WITH u AS (UPDATE ... RETURNING ...) SELECT ...``: a data-modifying CTE, so a
    #: finalize updates the jobs and promotes their dependents in one statement.
    update_in_cte: ClassVar[bool] = False
    #: :meth:`commit_together`: statements sent as one transaction in one round trip, on
    #: a connection in autocommit (PostgreSQL's pipeline mode, psycopg 3).
    commit_together_capable: ClassVar[bool] = False
    #: ``INSERT ... RETURNING`` over many rows, ids in parameter order.
    insert_returning: ClassVar[bool] = False
    #: Only one write transaction at a time (SQLite).
    serialized_writers: ClassVar[bool] = False
    #: ``LISTEN/NOTIFY`` wake-ups.
    listen_notify: ClassVar[bool] = False
    #: ``JOIN LATERAL``: a subquery evaluated per row of the join's left side.
    lateral_join: ClassVar[bool] = False
    #: The grouped claim is one statement: :meth:`ranked_groups` joined LATERAL to each
    #: group's locked window, under the UPDATE (needs ``claim_in_one_statement`` and
    #: ``lateral_join``). Else one locked select per group, then the UPDATE.
    grouped_claim_in_one_statement: ClassVar[bool] = False
    #: Without that, the grouped claim's first pass is still one statement: each group's
    #: locked window, ``(SELECT ... ORDER BY ... LIMIT ... FOR UPDATE SKIP LOCKED)``, as
    #: an arm of a UNION ALL. Else one locked select per group.
    grouped_pick_in_one_statement: ClassVar[bool] = False
    #: Reads run in autocommit: no BEGIN and ROLLBACK around them. Each statement takes
    #: its own snapshot at READ COMMITTED anyway, so only where that saves round trips.
    read_autocommit: ClassVar[bool] = False
    #: ``UPDATE t ... WHERE id IN (SELECT ...)`` runs as a join, by index. Without it the
    #: server evaluates the subquery against every row of ``t`` (a finalize promoting
    #: dependents read all 30,000 jobs: 40 ms), so readyq looks the ids up first.
    update_semijoin: bool = True

    def __init__(self, server_version: tuple[int, ...]) -> None:
        self.server_version = server_version
        if server_version < self.minimum_version:
            raise UnsupportedDatabase(
                f"{self.product} {_dotted(server_version)} is too old for readyq: "
                f"it needs {self.product} >= {_dotted(self.minimum_version)} "
                f"({self.version_reason()}). Upgrade the server."
            )

    def version_reason(self) -> str:
        """Why the minimum version is what it is."""
        return "required features"

    # -- engine and transactions ------------------------------------------------------

    @classmethod
    def engine_options(cls, url: sa.URL) -> dict[str, Any]:
        """Keyword arguments for ``create_engine`` when readyq creates the engine.

        The isolation level is set once per new connection, not per checkout.
        """
        return {} if cls.isolation_level is None else {"isolation_level": cls.isolation_level}

    def prepare_engine(self, engine: Engine, *, owned: bool = False) -> Engine:
        """The engine readyq uses (a user's engine is never reconfigured in place).

        ``owned``: readyq created it with :meth:`engine_options`, so it is ready as is.
        """
        if self.isolation_level is None or owned:
            return engine
        if engine.dialect.default_isolation_level == self.isolation_level:
            return engine
        # A per-checkout isolation switch: correct for any engine, but it costs round
        # trips on every transaction; adapters override it with something cheaper.
        return engine.execution_options(isolation_level=self.isolation_level)

    def begin_write(self, conn: Connection) -> None:
        """First statement(s) of every write transaction; default: nothing."""

    def after_install(self, engine: Engine) -> None:
        """Database settings that persist with the schema; default: nothing."""

    def execute_together(
        self, conn: Connection, statements: Sequence[tuple[sa.Executable, Mapping[str, Any]]]
    ) -> list[list[Any]]:
        """Run ``statements`` in order on ``conn``, in its transaction; each one's rows.

        Each statement runs after the one before it finished, with a fresh snapshot where
        the isolation level takes one per statement; none may depend on an earlier one's
        rows. Rows read by name and by position. Default: one after another; an adapter
        may send them in one round trip (PostgreSQL's pipeline mode).
        """
        results = [conn.execute(stmt, dict(params)) for stmt, params in statements]
        return [list(r) if r.returns_rows else [] for r in results]

    def execute_one(
        self, conn: Connection, stmt: sa.Executable, params: Mapping[str, Any]
    ) -> list[Any]:
        """Run ``stmt`` on ``conn`` (in its transaction, or alone in autocommit); its rows,
        read by name and by position. A statement marked :func:`plan_once` run alone may
        get a plan made once (PostgreSQL: as the last of a :meth:`commit_together`)."""
        return list(conn.execute(stmt, dict(params)))

    def commit_together(
        self, conn: Connection, statements: Sequence[tuple[sa.Executable, Mapping[str, Any]]]
    ) -> list[list[Any]] | None:
        """Run ``statements`` as one transaction of their own, committed at the end, sent in
        one round trip; ``conn`` is in autocommit. Each one's rows, as
        :meth:`execute_together`. None when this connection cannot (nothing was sent):
        the caller runs them in a transaction instead. Only where
        ``commit_together_capable``.

        The statements marked with :func:`plan_once` that end the list may be run with
        plans made once for all their values (the transaction ends with them, so a
        setting made for them reaches no other statement).
        """
        raise NotImplementedError

    # -- wake-ups ---------------------------------------------------------------------

    def notify(self, conn: Connection, channel: str) -> None:
        """Inside a write transaction: wake listeners when it commits; default: nothing."""

    def listen(
        self, engine: Engine, channel: str, wake: Callable[[], None], stop: threading.Event
    ) -> None:
        """Block until ``stop`` is set, calling ``wake()`` per notification on ``channel``.

        Raises UnsupportedDatabase when this database (or driver, or pooler) cannot.
        """
        raise UnsupportedDatabase(f"{self.product} has no LISTEN/NOTIFY; workers poll")

    # -- lock clauses -----------------------------------------------------------------

    def lock_claimable(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        """Rows a claim takes: locked for update, rows locked by others skipped."""
        raise NotImplementedError

    def lock_skip(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        """Rows the sweeper takes: never wait behind a heartbeat's open transaction."""
        raise NotImplementedError

    def lock_update(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        """Rows about to be changed, whose current state decides the change."""
        raise NotImplementedError

    def lock_share(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        """Dependencies of a new job: their state must not become terminal until commit."""
        raise NotImplementedError

    def lock_terminal(self, stmt: sa.Select[Any]) -> sa.Select[Any] | None:
        """A job reaching a terminal state: waits for every ``lock_share`` holder, so that
        the dependents it then promotes or cancels include those being added right now.

        None when the lock its state UPDATE already took conflicts with ``lock_share``.
        """
        raise NotImplementedError

    # -- reads ------------------------------------------------------------------------

    def loose_distinct(
        self, key: sa.Column[Any], equal: sa.Column[Any], value: str
    ) -> sa.Select[Any]:
        """The distinct values of ``key`` among rows where ``equal = value``, in order.

        The table has an index on ``(equal, key, ...)``; the select must skip through it,
        one probe per distinct value, rather than read every row that matches (a scan
        over a backlog of 100,000 ready jobs finds 10 groups). Default: a recursive CTE
        that asks for the next larger key, for servers that plan ``min()`` over a
        correlated range as one index probe (PostgreSQL, SQLite).
        """
        inner = key.table.alias("nxt")
        first = (
            sa.select(sa.func.min(key).label("k"))
            .where(equal == value)
            .cte("loose", recursive=True)
        )
        step = sa.select(
            sa.select(sa.func.min(inner.c[key.name]))
            .where(inner.c[equal.name] == value, inner.c[key.name] > first.c.k)
            .scalar_subquery()
        ).where(first.c.k.is_not(None))
        walk = first.union_all(step)
        return sa.select(walk.c.k).where(walk.c.k.is_not(None)).order_by(walk.c.k)

    def among(self, column: sa.ColumnElement[Any], ids: sa.CTE) -> sa.ColumnElement[bool]:
        """``column`` is one of the ids ``ids`` selected (the CTE's column is ``id``): a
        one-statement claim's UPDATE condition, and a finalize's search for dependents.
        Default: a join (``UPDATE ... FROM ids``)."""
        return column == ids.c.id

    def ranked_groups(self) -> sa.FromClause:
        """A grouped claim's ranking as a relation ``(g, n)``: the groups and the jobs
        asked of each, bound as ``want``, a JSON array of ``[group, n]`` pairs. One
        statement text for every ranking, so the server can keep its plan. Only used
        with ``grouped_claim_in_one_statement``."""
        raise NotImplementedError

    # -- errors -----------------------------------------------------------------------

    def is_retryable(self, exc: DBAPIError) -> bool:
        """A deadlock, serialization failure or busy database: rerun the transaction."""
        return False

    def is_missing_table(self, exc: DBAPIError) -> bool:
        """The statement failed because readyq's tables do not exist."""
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.product} {_dotted(self.server_version)}>"


def pipeline_allowed(conn: Connection | Engine) -> bool:
    """False where the engine says ``execution_options(readyq_pipeline=False)``: every
    statement then passes SQLAlchemy's cursor events (tracing hooked there)."""
    return bool(conn.get_execution_options().get("readyq_pipeline", True))


class PipelineObserver(Protocol):
    """Sees each group of statements an adapter sends at once (a PostgreSQL pipeline),
    which passes no SQLAlchemy cursor event. Set it with
    ``engine.execution_options(readyq_pipeline_observer=observer)``.

    ``before`` runs before anything is sent (an exception there sends nothing); then
    exactly one of ``after`` (with each statement's row count) or ``failed``. A pipeline
    on a connection in autocommit is one transaction that commits at its end, whether or
    not ``BEGIN`` and ``COMMIT`` are among its statements.
    """

    def before(
        self, conn: Connection, statements: Sequence[str], params: Sequence[Mapping[str, Any]]
    ) -> None: ...

    def after(self, conn: Connection, statements: Sequence[str], rowcounts: list[int]) -> None: ...

    def failed(self, conn: Connection, statements: Sequence[str], exc: BaseException) -> None: ...


S = TypeVar("S", bound=sa.Executable)

#: Execution option of a statement whose best plan is the same for every bound value.
_PLAN_ONCE = "readyq_plan_once"


def plan_once(stmt: S) -> S:
    """``stmt``, marked as one whose best plan does not depend on its bound values (a
    walk of an index in its order up to a small LIMIT, rows found by primary key): an
    adapter may plan it once and keep the plan (:meth:`Adapter.commit_together`).
    ``tests/test_claim_plan.py`` checks each marked statement's value-blind plan."""
    return stmt.execution_options(**{_PLAN_ONCE: True})


def plans_once(stmt: sa.Executable) -> bool:
    """Whether ``stmt`` was marked with :func:`plan_once`."""
    return bool(stmt.get_execution_options().get(_PLAN_ONCE))


def pipeline_observer(conn: Connection) -> PipelineObserver | None:
    """The ``readyq_pipeline_observer`` execution option, if set."""
    observer: PipelineObserver | None = conn.get_execution_options().get("readyq_pipeline_observer")
    return observer


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(str(v) for v in version) or "?"


def sqlstate(exc: DBAPIError) -> str | None:
    """The SQLSTATE a driver reports (psycopg's ``sqlstate``), if any."""
    code = getattr(exc.orig, "sqlstate", None)
    return code if isinstance(code, str) else None


def errno(exc: DBAPIError) -> int | None:
    """The server's numeric error code (PyMySQL puts it first in ``args``), if any."""
    args = getattr(exc.orig, "args", ())
    return args[0] if args and isinstance(args[0], int) else None
