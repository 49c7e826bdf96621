"""The claim: READY -> RUNNING for ranked ready jobs, on one connection.

Internal. :func:`claim` runs in the caller's transaction (or, where
:func:`claim_autocommits`, :func:`first_pass` alone and :func:`top_up` after it);
:func:`one_statement` gives the claim's one-statement first pass for a finalize to send
with its results (``readyq._store.finalize_at_once``). Every
UPDATE re-checks the ``claim`` transition's source states; times are bound values from
the caller.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ._guards import guard as _guard
from ._guards import id_binds, id_values
from .dialects import Adapter, plan_once
from .job import TRANSITIONS, JobState, Lease, decode_payload
from .schema import jobs

__all__: list[str] = []

S = JobState
T = TRANSITIONS
c = jobs.c


_ORDER = (c.priority, c.run_after_us, c.id)

#: What a lease is built from (priority and run_after_us put the rows in claim order).
_LEASE_COLS = (
    c.id,
    c.lease_token,
    c.type,
    c.args,
    c.group_key,
    c.attempts,
    c.max_attempts,
    c.deadline_us,
    c.priority,
    c.run_after_us,
)


@functools.lru_cache(maxsize=64)
def _claim_select(ad: Adapter, grouped: bool) -> sa.Select[Any]:
    """The locked ready-set select, built once per adapter (values are bind parameters).

    Only the id: the ready index covers it. A wider select on MariaDB sorts in a filesort,
    and SKIP LOCKED then drops locked rows the LIMIT already counted (a claim gets fewer
    jobs than are ready).
    """
    stmt = sa.select(c.id).where(c.state == S.READY.value, c.run_after_us <= sa.bindparam("now"))
    if grouped:
        stmt = stmt.where(c.group_key == sa.bindparam("group"))
    return ad.lock_claimable(stmt.order_by(*_ORDER).limit(sa.bindparam("n")))


def _claim_values() -> dict[str, Any]:
    now = sa.bindparam("now", type_=sa.BigInteger())
    return {
        "state": T["claim"].target.value,
        "lease_token": c.lease_token + 1,
        "lease_owner": sa.bindparam("owner"),
        "lease_expires_us": sa.bindparam("expires"),
        "heartbeat_us": now,
        "started_us": now,
        "attempts": c.attempts + 1,
        "deadline_us": sa.case((c.timeout_us.is_(None), None), else_=now + c.timeout_us),
    }


@functools.lru_cache(maxsize=256)
def _claim_update(ad: Adapter, guard: Callable[[str], sa.ColumnElement[bool]], n: int) -> Any:
    """READY -> RUNNING for ``n`` picked ids; ``guard`` is part of the key (tests patch it)."""
    picked = c.id.in_(id_binds("id", n))
    # IS TRUE: the re-check must not drive the plan; SQLite without statistics otherwise
    # walked the state index over every ready row (13 ms per claim beside 100,000).
    upd = sa.update(jobs).where(picked, guard("claim").is_(sa.true())).values(_claim_values())
    return upd.returning(*_LEASE_COLS) if ad.update_returning else upd


@functools.lru_cache(maxsize=64)
def _claim_one_statement(
    ad: Adapter, guard: Callable[[str], sa.ColumnElement[bool]], unless_boxed: int = 0
) -> Any:
    """The ungrouped claim as one statement: the locked select is the UPDATE's CTE.

    ``unless_boxed``: it claims nothing if one of the jobs ``id0`` .. is inside a
    container (see :func:`finalize_at_once`).

    MATERIALIZED: the select (and its LIMIT and row locks) runs exactly once; a CTE the
    planner inlined into the IN could be re-evaluated and lock more rows than asked for.
    Found through :meth:`Adapter.among`, not ``id IN (SELECT ...)``: with stale
    statistics PostgreSQL ran the IN as a semi join that walked every ready row per claim.
    """
    select = _claim_select(ad, False)
    if unless_boxed:
        select = select.where(none_boxed(unless_boxed))
    picked = select.cte("picked").prefix_with("MATERIALIZED")
    return plan_once(
        sa.update(jobs)
        # IS TRUE: the re-check must not drive the plan; as an index condition on state
        # the planner (stale statistics) scanned every ready row per claim.
        .where(ad.among(c.id, picked), guard("claim").is_(sa.true()))
        .values(_claim_values())
        .returning(*_LEASE_COLS)
    )


@functools.lru_cache(maxsize=256)
def _claim_read_back(n: int) -> sa.Select[Any]:
    """Read back only what this UPDATE leased: correct even if a lock clause failed."""
    return sa.select(*_LEASE_COLS).where(
        c.id.in_(id_binds("id", n)),
        c.state == S.RUNNING.value,
        c.lease_owner == sa.bindparam("owner"),
        c.started_us == sa.bindparam("now"),
    )


def _pick(conn: Connection, ad: Adapter, now: int, limit: int, groups: Sequence[str]) -> list[int]:
    """Locked ready rows in ranked group order (the claim's first statements)."""
    # Each group's locked window in ranked order; a group whose rows are taken (or gone)
    # falls through to the next. Then a second pass gives unused slots to any group that
    # still had more, so the claim is work-conserving.
    wanted = _wanted(groups)
    if ad.grouped_pick_in_one_statement and len(groups) <= limit:
        picked, full = _pick_windows(conn, ad, now, wanted)
    else:
        picked, full = _pick_each(conn, ad, now, limit, wanted)
    select = _claim_select(ad, True)
    for g in full:
        n = limit - len(picked)
        if n <= 0:
            break
        stmt = select.where(c.id.not_in(picked))
        picked += conn.execute(stmt, {"now": now, "n": n, "group": g}).scalars()
    return picked


def _pick_each(
    conn: Connection, ad: Adapter, now: int, limit: int, wanted: dict[str, int]
) -> tuple[list[int], list[str]]:
    """The first pass, one locked select per group: the ids, and the groups that filled
    their share."""
    picked: list[int] = []
    full: list[str] = []
    select = _claim_select(ad, True)
    for g, asked in wanted.items():
        n = min(asked, limit - len(picked))
        if n <= 0:
            break
        got = list(conn.execute(select, {"now": now, "n": n, "group": g}).scalars())
        picked += got
        if len(got) == n:
            full.append(g)
    return picked, full


#: Groups per statement of :func:`_claim_windows`: a bounded text however many groups.
_ARMS = 32


def _pick_windows(
    conn: Connection, ad: Adapter, now: int, wanted: dict[str, int]
) -> tuple[list[int], list[str]]:
    """:func:`_pick_each` in one statement per 32 groups (their shares fit the limit, so
    no group's LIMIT depends on what the ones before found): the same ids, in the same
    order."""
    names = list(wanted)
    rows: list[Any] = []
    for start in range(0, len(names), _ARMS):
        chunk = names[start : start + _ARMS]
        params: dict[str, Any] = {"now": now}
        for k, g in enumerate(chunk):
            params.update({f"g{k}": g, f"n{k}": wanted[g], f"o{k}": start + k})
        rows += conn.execute(_claim_windows(ad, len(chunk)), params)
    rows.sort(key=_RANKED_ORDER)
    got = dict.fromkeys(names, 0)
    for r in rows:
        got[names[r.ord]] += 1
    return [r.id for r in rows], [g for g in names if got[g] == wanted[g]]


@functools.lru_cache(maxsize=2 * _ARMS)
def _claim_windows(ad: Adapter, arms: int) -> Any:
    """Group ``g{k}``'s first ``n{k}`` ready rows, locked and skipping rows locked by
    others, as arm ``k`` of a UNION ALL; ``ord`` numbers the arm.

    One round trip instead of one per group, for servers without LATERAL (MariaDB).
    Only columns of the claim index: a wider arm sorts in a filesort, and SKIP LOCKED then
    drops locked rows the LIMIT already counted (see :func:`_claim_select`).
    """
    arms_ = []
    for k in range(arms):
        arm = (
            sa.select(c.id, c.priority, c.run_after_us, sa.bindparam(f"o{k}").label("ord"))
            .where(
                c.state == S.READY.value,
                c.group_key == sa.bindparam(f"g{k}"),
                c.run_after_us <= sa.bindparam("now"),
            )
            .order_by(*_ORDER)
            .limit(sa.bindparam(f"n{k}"))
        )
        arms_.append(ad.lock_claimable(arm))
    return arms_[0] if arms == 1 else sa.union_all(*arms_)


@functools.lru_cache(maxsize=64)
def _claim_ranked(
    ad: Adapter, guard: Callable[[str], sa.ColumnElement[bool]], unless_boxed: int = 0
) -> Any:
    """The grouped claim as one statement: each ranked group ``(g, n)`` joins
    LATERAL its first ``n`` ready rows (locked, skipping rows locked by others), and the
    UPDATE leases them all (their groups put the leases in ranked order).

    One text for every ranking, so it is prepared once. (A CTE per group and pass, 20 for
    10 groups, was planned again on every execution: docs/benchmarks.md, session 5.)
    MATERIALIZED, the joined UPDATE and ``unless_boxed``: as in
    :func:`_claim_one_statement`.
    """
    want = ad.ranked_groups()
    ready = sa.select(c.id).where(
        c.state == S.READY.value,
        c.run_after_us <= sa.bindparam("now"),
        c.group_key == want.c.g,
    )
    if unless_boxed:
        ready = ready.where(none_boxed(unless_boxed))
    window = ad.lock_claimable(ready.order_by(*_ORDER).limit(want.c.n)).lateral("window")
    picked = (
        sa.select(window.c.id)
        .select_from(want.join(window, sa.true()))
        # Never cuts (the shares sum to at most n), but it is the planner's estimate: with
        # 10% of the table guessed per window, the UPDATE hash-joined a scan of every job.
        .limit(sa.bindparam("n"))
        .cte("picked")
        .prefix_with("MATERIALIZED")
    )
    return plan_once(
        sa.update(jobs)
        .where(ad.among(c.id, picked), guard("claim").is_(sa.true()))
        .values(_claim_values())
        .returning(*_LEASE_COLS)
    )


def _ranked_params(params: dict[str, Any], wanted: dict[str, int]) -> dict[str, Any]:
    """``want`` (:meth:`Adapter.ranked_groups`): the ranking as JSON ``[[group, n], ...]``."""
    return {**params, "want": _WANT.encode(list(wanted.items()))}


_WANT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _first_pass(
    rows: Sequence[Any], wanted: dict[str, int], limit: int
) -> tuple[list[Any], TopUp | None]:
    """The ranked claim's rows in ranked order, and what its second pass offers: the
    slots left, to the groups that got all they asked for."""
    by_group: dict[str, list[Any]] = {g: [] for g in wanted}
    for r in sorted(rows, key=_CLAIM_ORDER):
        by_group[r.group_key].append(r)
    ordered = [r for got in by_group.values() for r in got]
    full = [g for g, got in by_group.items() if len(got) == wanted[g]]
    left = limit - len(ordered)
    return ordered, (TopUp(full, left) if full and left > 0 else None)


def _top_up_rows(conn: Connection, ad: Adapter, more: TopUp, params: dict[str, Any]) -> list[Any]:
    """The second pass: slots a group could not fill go, in ranked order, to the groups
    that filled theirs. The rows leased before are no longer ready: each claim skips
    them."""
    rows: list[Any] = []
    for g in more.groups:
        n = more.slots - len(rows)
        if n <= 0:
            break
        got = ad.execute_one(conn, _claim_ranked(ad, _guard), _ranked_params(params, {g: n}))
        rows += sorted(got, key=_CLAIM_ORDER)
    return rows


#: Sort keys of claimed rows: claim order, and ranked-group order then claim order (built
#: in C: a Python key function per row cost a tick of ten jobs 20 calls).
_CLAIM_ORDER = operator.attrgetter("priority", "run_after_us", "id")
_RANKED_ORDER = operator.attrgetter("ord", "priority", "run_after_us", "id")


def _wanted(groups: Sequence[str]) -> dict[str, int]:
    """Jobs asked of each group, in ranked order (a group named twice is asked for two)."""
    wanted: dict[str, int] = {}
    for g in groups:
        wanted[g] = wanted.get(g, 0) + 1
    return wanted


def claim_autocommits(ad: Adapter, groups: Sequence[str] | None, limit: int) -> bool:
    """Whether the claim's first pass (:func:`first_pass`) is one statement that may run
    outside a transaction; a ranked claim's second pass then takes one of its own
    (:func:`top_up`), as after a finalize."""
    return ad.claim_autocommit and is_one_statement(ad, groups, limit)


def first_pass(
    conn: Connection,
    ad: Adapter,
    *,
    worker_id: str,
    now: int,
    ttl_us: int,
    limit: int,
    groups: Sequence[str] | None,
) -> tuple[list[Lease], TopUp | None]:
    """The claim's one-statement first pass (see :func:`is_one_statement`): its leases in
    claim order, and what a ranked claim's second pass offers, or None."""
    stmt, sent = one_statement(
        ad, worker_id=worker_id, now=now, ttl_us=ttl_us, limit=limit, groups=groups
    )
    return one_statement_leases(
        ad.execute_one(conn, stmt, sent),
        worker_id=worker_id,
        expires_us=now + ttl_us,
        limit=limit,
        groups=groups,
    )


def claim(
    conn: Connection,
    ad: Adapter,
    *,
    worker_id: str,
    now: int,
    ttl_us: int,
    limit: int,
    groups: Sequence[str] | None,
) -> list[Lease]:
    """READY -> RUNNING for up to ``limit`` jobs, in ranked group order when given."""
    if is_one_statement(ad, groups, limit):
        # The same first pass a finalize sends with its results, and its second pass
        # (the same jobs, in the same order, as :func:`_pick`) in this transaction.
        leases, more = first_pass(
            conn, ad, worker_id=worker_id, now=now, ttl_us=ttl_us, limit=limit, groups=groups
        )
        if more is None:
            return leases
        return leases + top_up(conn, ad, more, worker_id=worker_id, now=now, ttl_us=ttl_us)
    params = _claim_params(worker_id, now, ttl_us, limit)
    if groups is None:
        ids = list(conn.execute(_claim_select(ad, False), {"now": now, "n": limit}).scalars())
    else:
        ids = _pick(conn, ad, now, limit, groups)
    if not ids:
        return []
    params.update(id_values("id", ids))
    upd = _claim_update(ad, _guard, len(ids))
    if ad.update_returning:
        rows = list(conn.execute(upd, params).all())
    else:
        conn.execute(upd, params)
        rows = list(conn.execute(_claim_read_back(len(ids)), params).all())
    order = {job_id: i for i, job_id in enumerate(ids)}
    rows.sort(key=lambda r: order[r.id])
    return _leases(rows, worker_id, now + ttl_us)


def _claim_params(worker_id: str, now: int, ttl_us: int, limit: int) -> dict[str, Any]:
    """The claim statements' bind values."""
    return {"now": now, "owner": worker_id, "expires": now + ttl_us, "n": limit}


def _claimed(rows: list[Any], worker_id: str, expires_us: int) -> list[Lease]:
    """Leases from the one-statement claim's rows (RETURNING has no order): claim order."""
    rows.sort(key=_CLAIM_ORDER)
    return _leases(rows, worker_id, expires_us)


def _leases(rows: Iterable[Any], worker_id: str, expires_us: int) -> list[Lease]:
    return [
        Lease(
            job_id=r.id,
            token=r.lease_token,
            type=r.type,
            args=decode_payload(r.args) or {},
            worker_id=worker_id,
            group=r.group_key,
            attempt=r.attempts,
            max_attempts=r.max_attempts,
            expires_us=expires_us,
            deadline_us=r.deadline_us,
        )
        for r in rows
    ]


def is_one_statement(ad: Adapter, groups: Sequence[str] | None, limit: int) -> bool:
    """Whether this claim's first pass is one self-guarding statement."""
    if groups is None:
        return ad.claim_in_one_statement
    # Shares that fit the limit: no group's LIMIT depends on what the ones before found.
    return ad.grouped_claim_in_one_statement and len(groups) <= limit


@dataclass(frozen=True)
class TopUp:
    """Slots a ranked claim sent with a finalize left free although ranked groups were
    full: :func:`top_up` offers them to those groups, in ranked order."""

    groups: list[str]
    slots: int


def top_up(
    conn: Connection, ad: Adapter, more: TopUp, *, worker_id: str, now: int, ttl_us: int
) -> list[Lease]:
    """A ranked claim's second pass, in :func:`claim`'s transaction or, after
    ``readyq._store.finalize_at_once``, in one of its own (a rerun after a conflict must
    not keep the leases of a first try); in autocommit, where the claim may commit by
    itself (:func:`claim_autocommits`), for one group at a time."""
    params = _claim_params(worker_id, now, ttl_us, more.slots)
    return _leases(_top_up_rows(conn, ad, more, params), worker_id, now + ttl_us)


def none_boxed(n: int) -> sa.ColumnElement[bool]:
    """None of the jobs ``id0`` .. ``id{n-1}`` is inside a container."""
    settling = jobs.alias("settling")
    return ~sa.exists().where(
        settling.c.id.in_(id_binds("id", n)), settling.c.parent_id.is_not(None)
    )


def one_statement(
    ad: Adapter,
    *,
    worker_id: str,
    now: int,
    ttl_us: int,
    limit: int,
    groups: Sequence[str] | None,
    unless_boxed: Sequence[int] = (),
) -> tuple[Any, dict[str, Any]]:
    """The claim's first pass as one statement and its bind values (see
    :func:`is_one_statement`): it claims nothing if one of the jobs ``unless_boxed`` is
    inside a container. Read its rows with :func:`one_statement_leases`."""
    params = _claim_params(worker_id, now, ttl_us, limit)
    params.update(id_values("id", unless_boxed))
    if groups is None:
        return _claim_one_statement(ad, _guard, len(unless_boxed)), params
    stmt = _claim_ranked(ad, _guard, len(unless_boxed))
    return stmt, _ranked_params(params, _wanted(groups))


def one_statement_leases(
    rows: list[Any], *, worker_id: str, expires_us: int, limit: int, groups: Sequence[str] | None
) -> tuple[list[Lease], TopUp | None]:
    """The leases of :func:`one_statement`'s rows, in claim order, and what a ranked
    claim's second pass offers (:func:`top_up`), or None."""
    if groups is None:
        return _claimed(rows, worker_id, expires_us), None
    ordered, more = _first_pass(rows, _wanted(groups), limit)
    return _leases(ordered, worker_id, expires_us), more
