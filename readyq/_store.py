"""Transitions on one connection, inside a transaction the caller opened.

Internal. Every function is named after a transition of :data:`readyq.job.TRANSITIONS`
and guards its UPDATE with that transition's source states; every write made for a lease
is compare-and-set on ``(id, lease_token, state)``. Times are bound values from the caller.
The claim lives in :mod:`readyq._claim`; this module sends it with a finalize.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import _claim
from ._claim import none_boxed
from ._dag import after_terminal, promote_from
from ._guards import LEASE_CLEARED as _LEASE_CLEARED
from ._guards import cut as _cut
from ._guards import guard as _guard
from ._guards import id_binds, id_values
from .dialects import Adapter, plan_once
from .dialects._base import pipeline_allowed
from .errors import LeaseLost, UnsupportedDatabase
from .job import TERMINAL, TRANSITIONS, JobState, Lease, Outcome
from .schema import deps, jobs

__all__: list[str] = []

S = JobState
T = TRANSITIONS
c = jobs.c


@dataclass(frozen=True)
class ReclaimCounts:
    """What one sweep did: leases expired back to ready, hung jobs timed out, jobs failed."""

    expired: int = 0
    timed_out: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return self.expired + self.timed_out


# -- lease holder's writes ------------------------------------------------------------


def _fenced(lease: Lease) -> sa.ColumnElement[bool]:
    return sa.and_(c.id == lease.job_id, c.lease_token == lease.token, c.state == S.RUNNING)


def _lost(conn: Connection, lease: Lease, doing: str) -> LeaseLost:
    row = conn.execute(sa.select(c.state, c.lease_token).where(c.id == lease.job_id)).first()
    return _lost_from(row, lease, doing)


def _lost_from(row: Any, lease: Lease, doing: str) -> LeaseLost:
    if row is None:
        now_is = "the job no longer exists"
    else:
        now_is = f"it is {row.state} with token {row.lease_token}"
    return LeaseLost(
        f"cannot {doing} job {lease.job_id}: lease token {lease.token} is no longer current "
        f"({now_is}); nothing was changed, stop working on it",
        lease.job_id,
        lease.token,
    )


_HEARTBEAT = (
    sa.update(jobs)
    .where(
        c.id == sa.bindparam("job_id"),
        c.lease_token == sa.bindparam("token"),
        c.state == S.RUNNING.value,
    )
    .values(lease_expires_us=sa.bindparam("expires"), heartbeat_us=sa.bindparam("now"))
)


def heartbeat(conn: Connection, lease: Lease, *, now: int, ttl_us: int) -> int:
    """Extend a live lease; returns its new expiry."""
    expires = now + ttl_us
    params = {"job_id": lease.job_id, "token": lease.token, "expires": expires, "now": now}
    if conn.execute(_HEARTBEAT, params).rowcount != 1:
        raise _lost(conn, lease, "heartbeat")
    return expires


def _replay(conn: Connection, lease: Lease, expect: Iterable[JobState]) -> Outcome | None:
    """The recorded outcome if this very lease already settled the job (a retried call)."""
    row = conn.execute(
        sa.select(c.state, c.settled_token, c.lease_token).where(c.id == lease.job_id)
    ).first()
    if row is None or row.settled_token != lease.token:
        return None
    state = S(row.state) if row.lease_token == lease.token else S.READY
    if state not in expect:
        return None
    return Outcome(lease.job_id, lease.token, state, replayed=True)


@functools.lru_cache(maxsize=256)
def _settle_lock(ad: Adapter, n: int) -> sa.Select[Any]:
    """The rows of ``n`` jobs about to finish, locked: the lock a job reaching a terminal
    state takes (it waits for open transactions adding dependents, see
    Adapter.lock_terminal)."""
    stmt = sa.select(c.id, c.state, c.lease_token, c.settled_token, c.parent_id).where(
        c.id.in_(id_binds("id", n))
    )
    stmt = stmt.order_by(c.id)  # one lock order for every finalizer: no deadlock among them
    locked = ad.lock_terminal(stmt)
    return plan_once(ad.lock_update(stmt) if locked is None else locked)  # by primary key


@functools.lru_cache(maxsize=128)
def _finalize_update(n: int) -> Any:
    """RUNNING -> DONE for ``n`` jobs, each with its own result (``r{k}``), compare-and-set
    on its lease token (``t{k}``): self-guarding, so it may leave before the lock's rows
    are read (a stale lease's row is simply not changed)."""
    ids = id_binds("id", n)
    result: Any
    token: Any
    if n == 1:
        result, token = sa.bindparam("r0"), sa.bindparam("t0")
    else:
        result = sa.case({i: sa.bindparam(f"r{k}") for k, i in enumerate(ids)}, value=c.id)
        token = sa.case({i: sa.bindparam(f"t{k}") for k, i in enumerate(ids)}, value=c.id)
    return (
        sa.update(jobs)
        # IS TRUE: the state re-check must not be an index condition; on statistics from
        # before a burst of claims PostgreSQL walked every running job in the claim index
        # to find these (3,010 rows for 10: tests/test_claim_plan.py).
        .where(c.id.in_(ids), c.lease_token == token, _guard("finalize").is_(sa.true()))
        .values(
            state=T["finalize"].target.value,
            result=result,
            settled_token=c.lease_token,
            finished_us=sa.bindparam("now"),
            error=None,
            **_LEASE_CLEARED,
        )
    )


@functools.lru_cache(maxsize=128)
def _finalize_and_promote(ad: Adapter, n: int, unless_boxed: bool = False) -> sa.Select[Any]:
    """:func:`_finalize_update` and the promotion of the finished jobs' dependents as one
    statement (data-modifying CTEs), returning both row counts. It must run after the
    terminal lock, as a statement of its own: its snapshot then sees every dependency
    edge committed while that lock waited (inside the locking statement, such an edge
    would be invisible and its dependent would stay blocked).
    """
    update = _finalize_update(n)
    if unless_boxed:  # a container's roll-up takes more statements: see finalize_at_once
        update = update.where(none_boxed(n))
    fin = update.returning(c.id).cte("fin")
    promo = promote_from(ad, n, fin).returning(c.id).cte("promo")
    # Planned once: the jobs by primary key, their dependents by the edges' index.
    return plan_once(
        sa.select(
            sa.select(sa.func.count()).select_from(fin).scalar_subquery(),
            sa.select(sa.func.count()).select_from(promo).scalar_subquery(),
        )
    )


Sent = tuple[Any, dict[str, Any]]


def _settle_sent(
    ad: Adapter, items: Sequence[tuple[Lease, str]], now: int, *, unless_boxed: bool = False
) -> list[Sent]:
    """The statements of a finalize that may leave together: the terminal lock, then (with
    ``update_in_cte``) the self-guarding update and promotion."""
    ids = id_values("id", [lease.job_id for lease, _ in items])
    sent: list[Sent] = [(_settle_lock(ad, len(items)), ids)]
    if ad.update_in_cte:
        params: dict[str, Any] = {"now": now, **ids}
        for k, (lease, result) in enumerate(items):
            params[f"t{k}"], params[f"r{k}"] = lease.token, result
        sent.append((_finalize_and_promote(ad, len(items), unless_boxed), params))
    return sent


def _verdicts(
    items: Sequence[tuple[Lease, str]], rows: dict[int, Any]
) -> tuple[list[Outcome | LeaseLost], list[tuple[Lease, str]]]:
    """Each lease against its locked row: finalized now, replayed, or lost; and the live."""
    out: list[Outcome | LeaseLost] = []
    live: list[tuple[Lease, str]] = []
    for lease, result in items:
        row = rows.get(lease.job_id)
        if row is not None and row.state == S.RUNNING and row.lease_token == lease.token:
            live.append((lease, result))
            out.append(Outcome(lease.job_id, lease.token, S.DONE))
        elif row is not None and row.state == S.DONE and row.settled_token == lease.token:
            out.append(Outcome(lease.job_id, lease.token, S.DONE, replayed=True))
        else:
            out.append(_lost_from(row, lease, "finalize"))
    return out, live


def _settle(
    conn: Connection,
    ad: Adapter,
    items: Sequence[tuple[Lease, str]],
    results: list[list[Any]],
    *,
    now: int,
) -> list[Outcome | LeaseLost]:
    """A finalize's verdicts and consequences, from the results of :func:`_settle_sent`."""
    rows = {r.id: r for r in results[0]}
    out, live = _verdicts(items, rows)
    promoted: int | None = None
    if ad.update_in_cte:
        ((changed, promoted),) = results[1]
    elif live:
        params: dict[str, Any] = {"now": now}
        for k, (lease, result) in enumerate(live):
            params.update({f"id{k}": lease.job_id, f"t{k}": lease.token, f"r{k}": result})
        changed = conn.execute(_finalize_update(len(live)), params).rowcount
    else:
        return out
    if changed != len(live):  # locked and verified: the adapter's lock did not hold
        raise UnsupportedDatabase(
            f"finalize changed {changed} of {len(live)} rows it had locked: the adapter's "
            "lock_terminal/lock_update does not lock (run the conformance suite)"
        )
    if not live:
        return out
    settled = [(lease.job_id, S.DONE, rows[lease.job_id].parent_id) for lease, _ in live]
    touched = after_terminal(conn, ad, settled, now=now, locked=True, promoted=promoted)
    return [
        Outcome(o.job_id, o.token, o.state, dependents=touched[o.job_id])
        if isinstance(o, Outcome) and not o.replayed
        else o
        for o in out
    ]


def finalize_many(
    conn: Connection, ad: Adapter, items: Sequence[tuple[Lease, str]], *, now: int
) -> list[Outcome | LeaseLost]:
    """RUNNING -> DONE for each (lease, result), promoting dependents, rolling up containers.

    Each job is all-or-nothing and independent of the others: a stale lease gets its
    LeaseLost in its slot (nothing of it changes), the live ones are finalized. Job ids
    must be distinct.
    """
    results = ad.execute_together(conn, _settle_sent(ad, items, now))
    return _settle(conn, ad, items, results, now=now)


def finalize_and_claim(
    conn: Connection,
    ad: Adapter,
    items: Sequence[tuple[Lease, str]],
    *,
    worker_id: str,
    now: int,
    ttl_us: int,
    limit: int,
    groups: Sequence[str] | None,
) -> tuple[list[Outcome | LeaseLost], list[Lease]]:
    """:func:`finalize_many` then :func:`claim` in the caller's transaction.

    The claim sees what the finalize promoted. Where both are self-guarding single
    statements, they leave together with the finalize's lock (one round trip).
    """
    if not (items and ad.update_in_cte and groups is None and ad.claim_in_one_statement):
        out = finalize_many(conn, ad, items, now=now) if items else []
        return out, _claim.claim(
            conn, ad, worker_id=worker_id, now=now, ttl_us=ttl_us, limit=limit, groups=groups
        )
    sent = _claim.one_statement(
        ad, worker_id=worker_id, now=now, ttl_us=ttl_us, limit=limit, groups=None
    )
    *done, got = ad.execute_together(conn, [*_settle_sent(ad, items, now), sent])
    out = _settle(conn, ad, items, done, now=now)
    leases, _ = _claim.one_statement_leases(
        got, worker_id=worker_id, expires_us=now + ttl_us, limit=limit, groups=None
    )
    return out, leases


def commits_at_once(
    ad: Adapter, engine: sa.Engine, *, claims: bool, groups: Sequence[str] | None, limit: int = 1
) -> bool:
    """Whether :func:`finalize_at_once` may do this finalize (and claim)."""
    return (
        ad.commit_together_capable
        and ad.update_in_cte
        and pipeline_allowed(engine)
        and (not claims or _claim.is_one_statement(ad, groups, limit))
    )


def finalize_at_once(
    conn: Connection,
    ad: Adapter,
    items: Sequence[tuple[Lease, str]],
    *,
    now: int,
    claim: tuple[str, int, int, Sequence[str] | None] | None = None,
) -> tuple[list[Outcome | LeaseLost], list[Lease], _claim.TopUp | None] | None:
    """:func:`finalize_many` and, with ``claim`` = (worker_id, ttl_us, limit, groups), the
    claim's one-statement first pass, as one transaction of their own that commits in the
    same round trip (:meth:`Adapter.commit_together`; ``conn`` is in autocommit).

    A ranked claim's second pass cannot ride along (it depends on the first one's rows):
    what it would offer comes back as a :class:`readyq._claim.TopUp`, or None.

    None, having changed nothing, when one of the jobs is inside a container (its
    roll-up takes statements that depend on this one's rows) or the connection cannot:
    run :func:`finalize_and_claim` in a transaction then.
    """
    sent = _settle_sent(ad, items, now, unless_boxed=True)
    if claim is not None:
        worker_id, ttl_us, limit, groups = claim
        sent.append(
            _claim.one_statement(
                ad,
                worker_id=worker_id,
                now=now,
                ttl_us=ttl_us,
                limit=limit,
                groups=groups,
                unless_boxed=[lease.job_id for lease, _ in items],
            )
        )
    results = ad.commit_together(conn, sent)
    if results is None:
        return None
    if any(r.parent_id is not None for r in results[0]):
        ((changed, _),) = results[1]
        if changed or (claim is not None and results[2]):  # pragma: no cover - guarded
            raise UnsupportedDatabase("finalize_at_once wrote jobs inside a container")
        return None
    out = _settle(conn, ad, items, results[:2], now=now)  # no container: no more statements
    if claim is None:
        return out, [], None
    leases, more = _claim.one_statement_leases(
        results[2], worker_id=claim[0], expires_us=now + claim[1], limit=claim[2], groups=claim[3]
    )
    return out, leases, more


def finalize(conn: Connection, ad: Adapter, lease: Lease, result: str, *, now: int) -> Outcome:
    """RUNNING -> DONE with the result; LeaseLost if the lease is stale (see finalize_many)."""
    (outcome,) = finalize_many(conn, ad, [(lease, result)], now=now)
    if isinstance(outcome, LeaseLost):
        raise outcome
    return outcome


def fail(
    conn: Connection,
    ad: Adapter,
    lease: Lease,
    error: str,
    *,
    now: int,
    retry_at: int | None,
) -> Outcome:
    """RUNNING -> READY at ``retry_at`` (a retry), or RUNNING -> FAILED when it is None."""
    name = "fail" if retry_at is None else "retry_later"
    values: dict[str, Any] = {
        "state": T[name].target,
        "error": _cut(error),
        "settled_token": lease.token,
        **_LEASE_CLEARED,
    }
    if retry_at is None:
        values["finished_us"] = now
    else:
        values["run_after_us"] = retry_at
    r = conn.execute(sa.update(jobs).where(_fenced(lease)).values(values))
    if r.rowcount != 1:
        replay = _replay(conn, lease, {S.FAILED, S.READY})
        if replay is not None:
            return replay
        raise _lost(conn, lease, "fail")
    if retry_at is None:
        parent = conn.execute(sa.select(c.parent_id).where(c.id == lease.job_id)).scalar()
        after_terminal(conn, ad, [(lease.job_id, S.FAILED, parent)], now=now)
    return Outcome(lease.job_id, lease.token, T[name].target)


def release(conn: Connection, lease: Lease, *, now: int) -> Outcome:
    """RUNNING -> READY at once, the attempt not counted: a graceful hand-back."""
    r = conn.execute(
        sa.update(jobs)
        .where(_fenced(lease))
        .values(
            state=T["release"].target, attempts=c.attempts - 1, run_after_us=now, **_LEASE_CLEARED
        )
    )
    if r.rowcount != 1:
        raise _lost(conn, lease, "release")
    return Outcome(lease.job_id, lease.token, S.READY)


# -- sweeper --------------------------------------------------------------------------


def reclaim(conn: Connection, ad: Adapter, *, now: int, batch: int) -> ReclaimCounts:
    """Expired leases and passed hang deadlines: back to READY, or FAILED at the cap."""
    cols = (
        c.id,
        c.lease_token,
        c.attempts,
        c.max_attempts,
        c.parent_id,
        c.lease_owner,
        c.timeout_us,
    )
    hung = ad.lock_skip(
        sa.select(*cols)
        .where(c.state == S.RUNNING, c.deadline_us < now)
        .order_by(c.id)
        .limit(batch)
    )
    expired = ad.lock_skip(
        sa.select(*cols)
        .where(c.state == S.RUNNING, c.lease_expires_us < now)
        .order_by(c.id)
        .limit(batch)
    )
    counts = {"expired": 0, "timed_out": 0, "failed": 0}
    seen: set[int] = set()
    for kind, stmt in (("timed_out", hung), ("expired", expired)):
        for row in conn.execute(stmt).all():
            if row.id in seen:
                continue
            seen.add(row.id)
            if kind == "timed_out":
                why = f"timed out after {row.timeout_us / 1e6:g}s (hang timeout)"
            else:
                why = f"lease of worker {row.lease_owner!r} expired without a heartbeat"
            exhausted = row.attempts >= row.max_attempts
            name = "reclaim_exhausted" if exhausted else "reclaim"
            if exhausted:
                why += f"; attempts exhausted ({row.attempts} of {row.max_attempts})"
            values: dict[str, Any] = {"state": T[name].target, "error": _cut(why), **_LEASE_CLEARED}
            if exhausted:
                values["finished_us"] = now
            else:
                values["run_after_us"] = now
            # Re-check under the lock: a heartbeat or finalize may have committed since.
            recheck = c.deadline_us < now if kind == "timed_out" else c.lease_expires_us < now
            r = conn.execute(
                sa.update(jobs)
                .where(c.id == row.id, c.lease_token == row.lease_token, _guard(name), recheck)
                .values(values)
            )
            if r.rowcount != 1:
                continue
            counts[kind] += 1
            if exhausted:
                counts["failed"] += 1
                after_terminal(conn, ad, [(row.id, S.FAILED, row.parent_id)], now=now)
    return ReclaimCounts(**counts)


#: Where a prune of one state resumes: after this (finished_us, id).
PruneCursor = tuple[int, int]


def prune(
    conn: Connection, *, state: JobState, before: int, batch: int, after: PruneCursor
) -> tuple[int, PruneCursor | None]:
    """Delete jobs in ``state`` (a terminal one) that finished before ``before`` and
    nothing still needs.

    Looks at up to ``batch`` candidates after ``after`` in (finished_us, id) order;
    returns how many were deleted and the last candidate looked at (None when there are
    no more). The order is the retention index's own (state, finished_us, id): MariaDB
    paged by id alone walked the primary key through every ready job on some runs.
    """
    finished = sorted(TERMINAL)
    rows = conn.execute(
        sa.select(c.id, c.finished_us)
        .where(
            c.state == state,
            c.finished_us < before,
            # The row comparison is PostgreSQL's index condition; MariaDB and MySQL filter
            # with it and take their range from the plain bound.
            c.finished_us >= after[0],
            sa.tuple_(c.finished_us, c.id) > sa.tuple_(*after),
        )
        .order_by(c.finished_us, c.id)
        .limit(batch)
    ).all()
    if not rows:
        return 0, None
    ids = [r.id for r in rows]
    last: PruneCursor = (rows[-1].finished_us, rows[-1].id)
    child = jobs.alias("child")
    keep = set(
        conn.execute(
            sa.select(child.c.parent_id).where(
                child.c.parent_id.in_(ids),
                sa.or_(child.c.state.not_in(finished), child.c.finished_us >= before),
            )
        ).scalars()
    )
    keep |= set(
        conn.execute(
            sa.select(deps.c.depends_on)
            .join(jobs, jobs.c.id == deps.c.job_id)
            .where(deps.c.depends_on.in_(ids), c.state.not_in(finished))
        ).scalars()
    )
    gone = [i for i in ids if i not in keep]
    if not gone:
        return 0, last
    conn.execute(
        sa.delete(deps).where(sa.or_(deps.c.job_id.in_(gone), deps.c.depends_on.in_(gone)))
    )
    conn.execute(sa.update(jobs).where(c.parent_id.in_(gone)).values(parent_id=None))
    conn.execute(sa.delete(jobs).where(c.id.in_(gone)))
    return len(gone), last
