"""Deliberately broken variants of readyq's behaviour, for proving the simulator catches bugs.

They live in test code only. Each is a ``Hooks`` for ``readyq_sim.run.run`` and/or a patch
of a ``readyq._store`` (or ``readyq._claim``) function, applied by the test through
pytest's ``monkeypatch``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from readyq_conformance.bad_adapters import _update_by_id as update_by_id
from readyq_sim.world import Hooks
from sqlalchemy.engine import Connection, Engine

import readyq
from readyq import _claim, _store, dialects
from readyq.job import Lease
from readyq.schema import jobs

c = jobs.c


def _with_adapter(engine: Engine, clock: Any, **overrides: Any) -> readyq.Queue:
    """A Queue whose adapter is a subclass of the real one with ``overrides`` methods."""
    q = readyq.Queue(engine, clock)
    real = dialects.for_engine(engine)
    broken = type(f"Broken{type(real).__name__}", (type(real),), overrides)(real.server_version)
    q._adapter = broken
    q._engine = broken.prepare_engine(engine)
    return q


def no_locking() -> Hooks:
    """Claims without row locks (FOR UPDATE SKIP LOCKED dropped; no BEGIN IMMEDIATE).

    A grouped claim keeps its select per group and its UPDATE apart: the simulator runs one
    statement at a time, so two one-statement claims never overlap in it. (That race needs
    statements running at once: the conformance suite's racing claimers.)
    """

    def make(engine: Engine, clock: Any) -> readyq.Queue:
        return _with_adapter(
            engine,
            clock,
            lock_claimable=lambda self, stmt: stmt,
            begin_write=lambda self, conn: None,
            grouped_claim_in_one_statement=False,
        )

    return Hooks(make_queue=make)


def unguarded_claim(monkeypatch: Any) -> Hooks:
    """No row locks and no ``state = 'ready'`` re-check in the claim UPDATE."""
    _unguard_claim(monkeypatch)
    return no_locking()


def unguarded_claim_in_this_process() -> Hooks:
    """:func:`unguarded_claim` for a spawned stress child: patches for good (the process is
    the run's), so it takes no monkeypatch; name it as ``setup="sim_broken:<this>"``."""
    real_guard = _claim._guard
    _claim._guard = lambda name: sa.true() if name == "claim" else real_guard(name)
    return no_locking()


def sqlite_deferred() -> Hooks:
    """SQLite write transactions without BEGIN IMMEDIATE: Python's sqlite3 then begins a
    deferred transaction only at the first INSERT/UPDATE/DELETE, so the claim's SELECT runs
    outside it (NOTES 1)."""

    def make(engine: Engine, clock: Any) -> readyq.Queue:
        return _with_adapter(engine, clock, begin_write=lambda self, conn: None)

    return Hooks(make_queue=make)


def _unguard_claim(monkeypatch: Any) -> None:
    real_guard = _claim._guard
    monkeypatch.setattr(
        _claim, "_guard", lambda name: sa.true() if name == "claim" else real_guard(name)
    )


def sqlite_deferred_unguarded(monkeypatch: Any) -> Hooks:
    """:func:`sqlite_deferred` with no ``state = 'ready'`` re-check in the claim UPDATE."""
    _unguard_claim(monkeypatch)
    return sqlite_deferred()


def sqlite_begin_deferred_unguarded(monkeypatch: Any) -> Hooks:
    """A real deferred transaction (``BEGIN DEFERRED``: the claim's SELECT inside it, the
    write lock taken only at its UPDATE) and no state re-check in the claim UPDATE."""
    _unguard_claim(monkeypatch)

    def make(engine: Engine, clock: Any) -> readyq.Queue:
        return _with_adapter(
            engine, clock, begin_write=lambda self, conn: conn.exec_driver_sql("BEGIN DEFERRED")
        )

    return Hooks(make_queue=make)


class _TwoTransactionClaim(readyq.Queue):
    """The seed's claim: pick ready ids in one transaction, update them by id in another."""

    def claim(
        self,
        worker_id: str,
        *,
        ttl: float = 30.0,
        limit: int = 1,
        groups: Sequence[str] | None = None,
    ) -> list[Lease]:
        def pick(conn: Connection, ad: Any, now: int) -> list[int]:
            stmt = (
                sa.select(c.id)
                .where(c.state == "ready", c.run_after_us <= now)
                .order_by(c.priority, c.run_after_us, c.id)
                .limit(limit)
            )
            return list(conn.execute(stmt).scalars())

        picked = self._write(pick)
        if not picked:
            return []
        ttl_us = round(ttl * 1e6)

        def take(conn: Connection, ad: Any, now: int) -> list[Lease]:
            return update_by_id(conn, picked, worker_id, now, ttl_us)

        return self._write(take)


def two_transaction_claim() -> Hooks:
    return Hooks(make_queue=_TwoTransactionClaim)


def unfenced_finalize(monkeypatch: Any) -> Hooks:
    """finalize() that updates by job id only: it adopts whatever token the row has now."""
    real = _store.finalize_many

    def adopt(conn: Connection, lease: Lease) -> Lease:
        current = conn.execute(
            sa.select(c.lease_token, c.state).where(c.id == lease.job_id)
        ).first()
        if current is not None and current.state == "running":
            lease = dataclasses.replace(lease, token=current.lease_token)
        return lease

    real_at_once = _store.finalize_at_once

    def finalize_many(conn: Connection, ad: Any, items: Any, *, now: int) -> Any:
        return real(conn, ad, [(adopt(conn, lease), r) for lease, r in items], now=now)

    def finalize_at_once(conn: Connection, ad: Any, items: Any, **kw: Any) -> Any:
        return real_at_once(conn, ad, [(adopt(conn, lease), r) for lease, r in items], **kw)

    # Queue.finalize reaches the rows through one of these (the second: PostgreSQL's
    # pipeline, which the simulator schedules as one step).
    monkeypatch.setattr(_store, "finalize_many", finalize_many)
    monkeypatch.setattr(_store, "finalize_at_once", finalize_at_once)
    return Hooks()


def reclaim_live_leases(monkeypatch: Any, ahead: float = 15.0) -> Hooks:
    """A sweeper that thinks it is ``ahead`` seconds later: it reclaims leases still live."""
    real = _store.reclaim

    def reclaim(conn: Connection, ad: Any, *, now: int, batch: int) -> Any:
        return real(conn, ad, now=now + round(ahead * 1e6), batch=batch)

    monkeypatch.setattr(_store, "reclaim", reclaim)
    return Hooks()


def seed_fair_share() -> Hooks:
    """The seed's fair_share: max(1, round(free * w / W)) slots per group, then truncated."""
    from readyq.fairshare import GroupDemand

    def fair_share(groups: Sequence[Any], free: int) -> list[str]:
        live = [g for g in groups if g.ready > 0]
        total = sum(g.weight for g in live)
        out: list[str] = []
        for g in live:
            out += [g.name] * max(1, round(free * g.weight / total))
        return out[:free]

    return Hooks(fair_share=fair_share, group_demand=GroupDemand)
