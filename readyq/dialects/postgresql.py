"""PostgreSQL (>= 13): ``FOR NO KEY UPDATE SKIP LOCKED`` claims at READ COMMITTED."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from ..errors import UnsupportedDatabase
from ._base import Adapter, sqlstate

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
    insert_returning = True
    listen_notify = True

    def version_reason(self) -> str:
        return "the oldest release still supported upstream, and the oldest readyq tests"

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
