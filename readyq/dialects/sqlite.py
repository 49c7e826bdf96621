"""SQLite (>= 3.35): every write transaction takes the write lock up front, in WAL mode.

SQLite has no row locks, and SQLAlchemy renders ``with_for_update()`` as nothing here, so
mutual exclusion comes from ``BEGIN IMMEDIATE``: one writer at a time, readers beside it.
"""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..errors import UnsupportedDatabase
from ._base import Adapter

__all__ = ["SQLiteAdapter"]

#: Seconds a writer waits for the write lock before "database is locked".
BUSY_TIMEOUT = 30.0


class SQLiteAdapter(Adapter):
    name: ClassVar[str] = "sqlite"
    product: ClassVar[str] = "SQLite"
    minimum_version: ClassVar[tuple[int, ...]] = (3, 35)
    update_returning = True
    claim_in_one_statement = True
    insert_returning = True
    serialized_writers = True

    def version_reason(self) -> str:
        return "RETURNING arrived in 3.35"

    @classmethod
    def engine_options(cls, url: sa.URL) -> dict[str, Any]:
        if url.database in (None, "", ":memory:") or "mode=memory" in str(url):
            raise UnsupportedDatabase(
                "an in-memory SQLite database is private to one connection, but readyq's "
                "claimers, heartbeats and sweeper use several: give a file, e.g. "
                "sqlite:///readyq.db"
            )
        return {**super().engine_options(url), "connect_args": {"timeout": BUSY_TIMEOUT}}

    def after_install(self, engine: Engine) -> None:
        # WAL persists in the file: readers no longer wait for the writer to commit.
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=WAL")

    def begin_write(self, conn: Connection) -> None:
        # Without it the transaction starts deferred: two claimers both read the same
        # ready row and both "win" (NOTES 1), and a read-then-write transaction gets
        # "database is locked" at once instead of waiting for the busy timeout (NOTES 2).
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    # BEGIN IMMEDIATE already excludes every other writer until commit: no lock clause.
    def lock_claimable(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        return stmt

    def lock_skip(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        return stmt

    def lock_update(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        return stmt

    def lock_share(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        return stmt

    def lock_terminal(self, stmt: sa.Select[Any]) -> sa.Select[Any] | None:
        return None

    def is_retryable(self, exc: DBAPIError) -> bool:
        return isinstance(exc, sa.exc.OperationalError) and "database is locked" in str(exc)

    def is_missing_table(self, exc: DBAPIError) -> bool:
        return "no such table" in str(exc)
