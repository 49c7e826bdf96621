"""MySQL (>= 8.0.1) and MariaDB (>= 10.6): InnoDB ``FOR UPDATE SKIP LOCKED`` at READ COMMITTED.

The two servers share this module, and their differences are spelled out as two classes
rather than hidden in conditionals.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ._base import Adapter, errno

__all__ = ["MariaDBAdapter", "MySQLAdapter"]

_DEADLOCK, _LOCK_WAIT_TIMEOUT, _NO_SUCH_TABLE = 1213, 1205, 1146


class MySQLAdapter(Adapter):
    name: ClassVar[str] = "mysql"
    product: ClassVar[str] = "MySQL"
    minimum_version: ClassVar[tuple[int, ...]] = (8, 0, 1)
    # At the default REPEATABLE READ, InnoDB gap locks of an open claim block enqueue
    # INSERTs into the gap before the locked row (NOTES 5); READ COMMITTED takes none.
    isolation_level: ClassVar[str | None] = "READ COMMITTED"
    skip_locked = True
    # No UPDATE ... RETURNING: claims read their rows back in the same transaction.
    update_returning = False
    #: Lowest ``innodb_lock_wait_timeout`` the server accepts (the simulator uses it to
    #: detect a statement that would block). MySQL 8 documents 1 second as its minimum.
    min_lock_wait_timeout: ClassVar[int] = 1

    #: First release that plans a single-table UPDATE's ``IN (SELECT ...)`` as a semi-join.
    semijoin_update_since: ClassVar[tuple[int, ...]] = (8, 0, 21)

    def version_reason(self) -> str:
        return "SKIP LOCKED arrived in 8.0.1"

    def __init__(self, server_version: tuple[int, ...]) -> None:
        super().__init__(server_version)
        self._set_per_transaction = False
        self.update_semijoin = server_version >= self.semijoin_update_since

    def prepare_engine(self, engine: Engine, *, owned: bool = False) -> Engine:
        prepared = super().prepare_engine(engine, owned=owned)
        if prepared is engine:
            return engine
        # SQLAlchemy's per-checkout switch costs five round trips per transaction here
        # (SET SESSION, COMMIT, and on return ROLLBACK, SET SESSION, COMMIT); one
        # SET TRANSACTION before each write transaction does the same job.
        self._set_per_transaction = True
        return engine

    def begin_write(self, conn: Connection) -> None:
        if self._set_per_transaction:
            conn.exec_driver_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")

    def lock_claimable(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        # Exclusive FOR UPDATE, never read=True: SQLAlchemy renders read+skip_locked as
        # LOCK IN SHARE MODE SKIP LOCKED, which MySQL 8 rejects (NOTES 3).
        return stmt.with_for_update(skip_locked=True)

    def lock_skip(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        return stmt.with_for_update(skip_locked=True)

    def lock_update(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        return stmt.with_for_update()

    def lock_share(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        # Renders LOCK IN SHARE MODE, accepted by MySQL 8 and MariaDB alike. InnoDB has no
        # key-share mode: claimers skip the row until the enqueue commits (NOTES 8).
        return stmt.with_for_update(read=True)

    def lock_terminal(self, stmt: sa.Select[Any]) -> sa.Select[Any] | None:
        # The state UPDATE's exclusive lock already waits for LOCK IN SHARE MODE holders.
        return None

    def loose_distinct(
        self, key: sa.Column[Any], equal: sa.Column[Any], value: str
    ) -> sa.Select[Any]:
        # A loose index scan ("Using index for group-by"). InnoDB cannot range over a
        # correlated bound, so the recursive CTE reads every matching row there; and with
        # ``equal = value`` MariaDB 10.11 plans a ref scan of every matching row instead:
        # BETWEEN is the same condition, planned as the loose scan (checked in tests).
        return (
            sa.select(key)
            .where(equal.between(value, value))
            .group_by(equal, key)
            .order_by(equal, key)
        )

    def is_retryable(self, exc: DBAPIError) -> bool:
        return errno(exc) in {_DEADLOCK, _LOCK_WAIT_TIMEOUT}

    def is_missing_table(self, exc: DBAPIError) -> bool:
        return errno(exc) == _NO_SUCH_TABLE


class MariaDBAdapter(MySQLAdapter):
    """MariaDB differs from MySQL 8 where it matters to readyq in these ways."""

    name: ClassVar[str] = "mariadb"
    product: ClassVar[str] = "MariaDB"
    # SKIP LOCKED arrived in MariaDB 10.6 (older servers raise a syntax error).
    minimum_version: ClassVar[tuple[int, ...]] = (10, 6)
    # MariaDB has INSERT ... RETURNING (10.5+); MySQL 8 has none.
    insert_returning = True
    # MariaDB accepts innodb_lock_wait_timeout = 0 and fails a blocked statement at once.
    min_lock_wait_timeout: ClassVar[int] = 0
    # MDEV-7487: semi-joins in single-table UPDATE and DELETE arrived in MariaDB 11.1.
    semijoin_update_since: ClassVar[tuple[int, ...]] = (11, 1)
    # A locking arm of a UNION ALL locks and skips as a select alone does (raced in the
    # conformance suite). MySQL 8 documents parenthesized query expressions only from
    # 8.0.22, and no MySQL server runs where readyq is tested: it keeps a select per group.
    grouped_pick_in_one_statement = True

    def version_reason(self) -> str:
        return "SKIP LOCKED arrived in 10.6"
