"""Known-bad adapters: the suite must report each of them as failing.

Each is a factory for ``--adapter readyq_conformance.bad_adapters:<name>``: it is called
with readyq's adapter class for the database and returns a broken variant. Two faults an
adapter cannot express (a claim that reads and updates in two transactions, a finalize
without the lease token) are patched into ``readyq._store`` for the whole process: use
them only in a throwaway process, as the suite's own tests do.

``BAD_ADAPTERS`` says where each one applies (``kinds``: sqlite, postgresql, mysql) and
what it breaks, for the report and for ``tests/test_conformance.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from readyq import Queue, _claim, _store
from readyq.dialects import Adapter
from readyq.job import Lease, Outcome
from readyq.schema import jobs

__all__ = ["BAD_ADAPTERS", "BadAdapter"]

c = jobs.c


@dataclass(frozen=True)
class BadAdapter:
    name: str
    kinds: tuple[str, ...]
    breaks: str


def _variant(base: type[Adapter], name: str, **attrs: Any) -> type[Adapter]:
    return type(f"{name}{base.__name__}", (base,), {"__doc__": attrs.pop("doc"), **attrs})


def no_locking(base: type[Adapter]) -> type[Adapter]:
    """No locking at all: claims select without a lock clause, and BEGIN adds nothing."""
    return _variant(
        base,
        "NoLocking",
        doc=no_locking.__doc__,
        lock_claimable=lambda self, stmt: stmt,
        begin_write=lambda self, conn: None,
    )


def ignored_lock_clause(base: type[Adapter]) -> type[Adapter]:
    """A lock clause the database accepts but that does not exclude other claimers.

    SQLite: ``FOR UPDATE SKIP LOCKED``, which SQLAlchemy renders as nothing there, without
    BEGIN IMMEDIATE, declaring skip_locked. Servers: a shared ``FOR SHARE SKIP LOCKED`` /
    ``LOCK IN SHARE MODE SKIP LOCKED``: accepted, and two claimers both hold it.
    """
    if base.serialized_writers:
        return _variant(
            base,
            "IgnoredLock",
            doc=ignored_lock_clause.__doc__,
            skip_locked=True,
            serialized_writers=False,
            lock_claimable=lambda self, stmt: stmt.with_for_update(skip_locked=True),
            begin_write=lambda self, conn: None,
        )
    return _variant(
        base,
        "SharedLock",
        doc=ignored_lock_clause.__doc__,
        lock_claimable=lambda self, stmt: stmt.with_for_update(read=True, skip_locked=True),
    )


def repeatable_read(base: type[Adapter]) -> type[Adapter]:
    """MySQL/MariaDB at InnoDB's default REPEATABLE READ instead of READ COMMITTED."""
    return _variant(
        base, "RepeatableRead", doc=repeatable_read.__doc__, isolation_level="REPEATABLE READ"
    )


def sqlite_deferred(base: type[Adapter]) -> type[Adapter]:
    """SQLite write transactions without BEGIN IMMEDIATE (Python's deferred default)."""
    return _variant(base, "Deferred", doc=sqlite_deferred.__doc__, begin_write=lambda s, c: None)


def first_group_only(base: type[Adapter]) -> type[Adapter]:
    """A ``loose_distinct`` that never steps past its first value: the Worker's scan
    sees one group with ready jobs, and fair share starves every other group."""

    def loose_distinct(
        self: Adapter, key: sa.Column[Any], equal: sa.Column[Any], value: str
    ) -> sa.Select[Any]:
        return sa.select(sa.func.min(key).label("k")).where(equal == value)

    return _variant(base, "FirstGroup", doc=first_group_only.__doc__, loose_distinct=loose_distinct)


def ranked_one_each(base: type[Adapter]) -> type[Adapter]:
    """A ``ranked_groups`` that asks one job of every group, whatever its share: a group
    the ranking names twice gets one slot in the one-statement grouped claim."""

    def ranked_groups(self: Adapter) -> sa.FromClause:
        given = base.ranked_groups(self)
        return sa.select(given.c.g, sa.literal(1).label("n")).subquery("one_each")

    return _variant(base, "RankedOneEach", doc=ranked_one_each.__doc__, ranked_groups=ranked_groups)


def read_then_update(base: type[Adapter]) -> type[Adapter]:
    """The claim reads ready ids in one transaction and updates them by id in another
    (patched into readyq._claim.claim for this process)."""

    def queue_claim(
        self: Queue,
        worker_id: str,
        *,
        ttl: float = 30.0,
        limit: int = 1,
        groups: Any = None,
    ) -> list[Lease]:
        # The seed's shape: the read commits before the write transaction even begins.
        stmt = sa.select(c.id).where(c.state == "ready").order_by(*_claim._ORDER).limit(limit)
        with self.engine.connect() as reader:
            picked = [int(x) for x in reader.execute(stmt).scalars()]
        if not picked:
            return []
        ttl_us = round(ttl * 1e6)
        return self._write(
            lambda conn, ad, now: _update_by_id(conn, picked, worker_id, now, ttl_us)
        )

    def claim_tx(
        conn: Connection,
        ad: Adapter,
        *,
        worker_id: str,
        now: int,
        ttl_us: int,
        limit: int,
        groups: Any,
    ) -> list[Lease]:
        stmt = sa.select(c.id).where(c.state == "ready", c.run_after_us <= now)
        stmt = stmt.order_by(*_claim._ORDER).limit(limit)
        with conn.engine.connect() as reader:
            picked = [int(x) for x in reader.execute(stmt).scalars()]
        return _update_by_id(conn, picked, worker_id, now, ttl_us) if picked else []

    _claim.claim = claim_tx  # type: ignore[assignment]
    Queue.claim = queue_claim  # type: ignore[assignment,method-assign]
    return base


def _update_by_id(
    conn: Connection, picked: list[int], worker_id: str, now: int, ttl_us: int
) -> list[Lease]:
    """UPDATE ... WHERE id IN (picked): no state guard, no lock taken when reading."""
    conn.execute(
        sa.update(jobs)
        .where(c.id.in_(picked))
        .values(
            state="running",
            lease_token=c.lease_token + 1,
            lease_owner=worker_id,
            lease_expires_us=now + ttl_us,
            heartbeat_us=now,
            started_us=now,
            attempts=c.attempts + 1,
        )
    )
    rows = conn.execute(sa.select(jobs).where(c.id.in_(picked)).order_by(c.id)).all()
    return _claim._leases(rows, worker_id, now + ttl_us)


def unfenced_finalize(base: type[Adapter]) -> type[Adapter]:
    """finalize() that updates by job id only, ignoring the lease token (patched into
    readyq._store.finalize, finalize_many and finalize_at_once for this process): a stale
    worker overwrites the new holder."""
    real, real_many, real_at_once = _store.finalize, _store.finalize_many, _store.finalize_at_once

    def adopt(conn: Connection, lease: Lease) -> Lease:
        current = conn.execute(
            sa.select(c.lease_token, c.state).where(c.id == lease.job_id)
        ).first()
        if current is not None and current.state == "running":
            return Lease(**{**lease.__dict__, "token": current.lease_token})
        return lease

    def finalize(conn: Connection, ad: Adapter, lease: Lease, result: str, *, now: int) -> Outcome:
        return real(conn, ad, adopt(conn, lease), result, now=now)

    def finalize_many(conn: Connection, ad: Adapter, items: Any, *, now: int) -> Any:
        return real_many(conn, ad, [(adopt(conn, ls), r) for ls, r in items], now=now)

    def finalize_at_once(conn: Connection, ad: Adapter, items: Any, **kwargs: Any) -> Any:
        with conn.engine.connect() as reader:  # conn is in autocommit: read beside it
            adopted = [(adopt(reader, ls), r) for ls, r in items]
        return real_at_once(conn, ad, adopted, **kwargs)

    _store.finalize = finalize  # type: ignore[assignment]
    _store.finalize_many = finalize_many
    _store.finalize_at_once = finalize_at_once
    return base


BAD_ADAPTERS: dict[str, BadAdapter] = {
    b.name: b
    for b in (
        BadAdapter("no_locking", ("sqlite", "postgresql", "mysql"), "claims take no row lock"),
        BadAdapter(
            "ignored_lock_clause",
            ("sqlite", "postgresql", "mysql"),
            "the claim's lock clause does not exclude other claimers",
        ),
        BadAdapter(
            "read_then_update",
            ("sqlite", "postgresql", "mysql"),
            "the claim reads and updates in two transactions",
        ),
        BadAdapter(
            "first_group_only",
            ("sqlite", "postgresql", "mysql"),
            "the Worker's scan finds only the first group with ready jobs",
        ),
        BadAdapter(
            "ranked_one_each",
            ("postgresql",),
            "the one-statement grouped claim ignores the ranking's shares",
        ),
        BadAdapter("repeatable_read", ("mysql",), "InnoDB gap locks block enqueues"),
        BadAdapter("sqlite_deferred", ("sqlite",), "SQLite transactions start deferred"),
        BadAdapter(
            "unfenced_finalize",
            ("sqlite", "postgresql", "mysql"),
            "stale workers' results overwrite the new holder's",
        ),
    )
}
