"""PostgreSQL (>= 13): ``FOR NO KEY UPDATE SKIP LOCKED`` claims at READ COMMITTED."""

from __future__ import annotations

from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.exc import DBAPIError

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
    listen_notify = True

    def version_reason(self) -> str:
        return "the oldest release still supported upstream, and the oldest readyq tests"

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

    def lock_terminal(self, stmt: sa.Select[Any]) -> sa.Select[Any]:
        # ... while the plain FOR UPDATE of a finishing job waits for it, so the edge is
        # committed (and visible at READ COMMITTED) before the job looks for dependents.
        return stmt.with_for_update()

    def is_retryable(self, exc: DBAPIError) -> bool:
        # 40P01 deadlock_detected, 40001 serialization_failure.
        return sqlstate(exc) in {"40P01", "40001"}

    def is_missing_table(self, exc: DBAPIError) -> bool:
        return sqlstate(exc) == "42P01"  # undefined_table
