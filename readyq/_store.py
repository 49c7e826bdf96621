"""Transitions on one connection, inside a transaction the caller opened.

Internal. Every function is named after a transition of :data:`readyq.job.TRANSITIONS`
and guards its UPDATE with that transition's source states; every write made for a lease
is compare-and-set on ``(id, lease_token, state)``. Times are bound values from the caller.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .dialects import Adapter
from .errors import InvalidJob, LeaseLost, UnknownJob
from .job import MAX_ERROR_CHARS, TERMINAL, TRANSITIONS, JobState, Lease, Outcome, decode_payload
from .schema import deps, jobs

__all__: list[str] = []

S = JobState
T = TRANSITIONS
c = jobs.c

_LEASE_CLEARED: dict[str, Any] = {
    "lease_owner": None,
    "lease_expires_us": None,
    "deadline_us": None,
}


def _guard(name: str) -> sa.ColumnElement[bool]:
    """``state IN (sources of transition name)``."""
    return c.state.in_(sorted(T[name].sources))


def _cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."


@dataclass(frozen=True)
class ReclaimCounts:
    """What one sweep did: leases expired back to ready, hung jobs timed out, jobs failed."""

    expired: int = 0
    timed_out: int = 0
    failed: int = 0

    @property
    def total(self) -> int:
        return self.expired + self.timed_out


# -- claim ----------------------------------------------------------------------------

_ORDER = (c.priority, c.run_after_us, c.id)


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
    picked: list[int] = []
    base = sa.select(c.id).where(c.state == S.READY, c.run_after_us <= now).order_by(*_ORDER)
    if groups is None:
        picked = list(conn.execute(ad.lock_claimable(base.limit(limit))).scalars())
    else:
        # One locked select per group, in ranked order; a group whose rows are taken (or
        # gone) falls through to the next. Then a second pass gives unused slots to any
        # group that still had more, so the claim is work-conserving.
        wanted: dict[str, int] = {}
        for g in groups:
            wanted[g] = wanted.get(g, 0) + 1
        full: list[str] = []
        for g, asked in wanted.items():
            n = min(asked, limit - len(picked))
            if n <= 0:
                break
            got = list(
                conn.execute(ad.lock_claimable(base.where(c.group_key == g).limit(n))).scalars()
            )
            picked += got
            if len(got) == n:
                full.append(g)
        for g in full:
            n = limit - len(picked)
            if n <= 0:
                break
            stmt = base.where(c.group_key == g, c.id.not_in(picked)).limit(n)
            picked += conn.execute(ad.lock_claimable(stmt)).scalars()
    if not picked:
        return []
    deadline = sa.case((c.timeout_us.is_(None), None), else_=now + c.timeout_us)
    values = {
        "state": T["claim"].target,
        "lease_token": c.lease_token + 1,
        "lease_owner": worker_id,
        "lease_expires_us": now + ttl_us,
        "heartbeat_us": now,
        "started_us": now,
        "attempts": c.attempts + 1,
        "deadline_us": deadline,
    }
    cols = (
        c.id,
        c.lease_token,
        c.type,
        c.args,
        c.group_key,
        c.attempts,
        c.max_attempts,
        c.deadline_us,
    )
    upd = sa.update(jobs).where(c.id.in_(picked), _guard("claim")).values(values)
    if ad.update_returning:
        rows = list(conn.execute(upd.returning(*cols)).all())
    else:
        conn.execute(upd)
        # Read back only what this UPDATE leased: correct even if a lock clause failed.
        mine = sa.and_(
            c.id.in_(picked), c.state == S.RUNNING, c.lease_owner == worker_id, c.started_us == now
        )
        rows = list(conn.execute(sa.select(*cols).where(mine)).all())
    order = {job_id: i for i, job_id in enumerate(picked)}
    rows.sort(key=lambda r: order[r.id])
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
            expires_us=now + ttl_us,
            deadline_us=r.deadline_us,
        )
        for r in rows
    ]


@dataclass(frozen=True)
class GroupStats:
    """One group in the ready set: jobs ready now, jobs running, and its weight."""

    group: str
    ready: int
    running: int
    weight: float


def scan(conn: Connection, *, now: int) -> list[GroupStats]:
    """Ready and running jobs per group (the ready set's shape, for fair share).

    A group's weight is the largest weight among its ready and running jobs: independent
    of row order, and a heavy job is never diluted by lighter ones of its group.
    """
    live = sa.or_(c.state == S.RUNNING, sa.and_(c.state == S.READY, c.run_after_us <= now))
    rows = conn.execute(
        sa.select(c.group_key, c.state, sa.func.count(), sa.func.max(c.weight))
        .where(live)
        .group_by(c.group_key, c.state)
        .order_by(c.group_key, c.state)
    ).all()
    acc: dict[str, list[float]] = {}
    for group, state, n, weight in rows:
        ready, running, w = acc.setdefault(group, [0, 0, 0.0])
        acc[group] = [
            ready + (n if state == S.READY else 0),
            running + (n if state == S.RUNNING else 0),
            max(w, weight),
        ]
    return [GroupStats(g, int(r), int(n), w) for g, (r, n, w) in sorted(acc.items())]


# -- lease holder's writes ------------------------------------------------------------


def _fenced(lease: Lease) -> sa.ColumnElement[bool]:
    return sa.and_(c.id == lease.job_id, c.lease_token == lease.token, c.state == S.RUNNING)


def _lost(conn: Connection, lease: Lease, doing: str) -> LeaseLost:
    row = conn.execute(sa.select(c.state, c.lease_token).where(c.id == lease.job_id)).first()
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


def heartbeat(conn: Connection, lease: Lease, *, now: int, ttl_us: int) -> int:
    """Extend a live lease; returns its new expiry."""
    expires = now + ttl_us
    r = conn.execute(
        sa.update(jobs).where(_fenced(lease)).values(lease_expires_us=expires, heartbeat_us=now)
    )
    if r.rowcount != 1:
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


def finalize(conn: Connection, ad: Adapter, lease: Lease, result: str, *, now: int) -> Outcome:
    """RUNNING -> DONE with the result, promoting dependents and rolling up containers."""
    r = conn.execute(
        sa.update(jobs)
        .where(_fenced(lease))
        .values(
            state=T["finalize"].target,
            result=result,
            settled_token=lease.token,
            finished_us=now,
            error=None,
            **_LEASE_CLEARED,
        )
    )
    if r.rowcount != 1:
        replay = _replay(conn, lease, {S.DONE})
        if replay is not None:
            return replay
        raise _lost(conn, lease, "finalize")
    parent = conn.execute(sa.select(c.parent_id).where(c.id == lease.job_id)).scalar()
    after_terminal(conn, ad, [(lease.job_id, S.DONE, parent)], now=now)
    return Outcome(lease.job_id, lease.token, S.DONE)


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


# -- the DAG and containers -----------------------------------------------------------


def after_terminal(
    conn: Connection, ad: Adapter, settled: list[tuple[int, JobState, int | None]], *, now: int
) -> None:
    """Consequences of jobs reaching a terminal state, in the same transaction.

    DONE promotes dependents whose last open dependency this was (an atomic counter
    decrement: the child's row lock serializes parents finishing together, NOTES 9).
    FAILED/CANCELLED cancels dependents, transitively. Either way the parent container's
    open-children counter drops, and the last child rolls the container up.
    """
    work = list(settled)
    while work:
        job_id, state, parent = work.pop()
        conn.execute(ad.lock_terminal(sa.select(c.id).where(c.id == job_id)))
        waiting = sa.select(deps.c.job_id).where(deps.c.depends_on == job_id)
        dependents = sorted(conn.execute(waiting).scalars())
        if dependents and state == S.DONE:
            conn.execute(
                sa.update(jobs).where(c.id.in_(dependents)).values(pending_deps=c.pending_deps - 1)
            )
            conn.execute(
                sa.update(jobs)
                .where(c.id.in_(dependents), _guard("promote"), c.pending_deps == 0)
                .values(state=T["promote"].target)
            )
        elif dependents:
            reason = f"cancelled: dependency {job_id} ended {state.value}"
            work += cancel_rows(conn, ad, dependents, reason=reason, by=job_id, now=now)
        if parent is not None:
            work += _rollup(conn, ad, parent, now=now)


def _rollup(
    conn: Connection, ad: Adapter, container: int, *, now: int
) -> list[tuple[int, JobState, int | None]]:
    r = conn.execute(
        sa.update(jobs)
        .where(c.id == container, c.state == S.WAITING)
        .values(open_children=c.open_children - 1)
    )
    if r.rowcount != 1:
        return []  # the container itself was cancelled meanwhile
    row = conn.execute(sa.select(c.open_children, c.parent_id).where(c.id == container)).one()
    if row.open_children > 0:
        return []
    bad = conn.execute(
        sa.select(sa.func.count(), sa.func.min(c.id)).where(
            c.parent_id == container, c.state != S.DONE
        )
    ).one()
    name = "rollup_failed" if bad[0] else "rollup_done"
    values: dict[str, Any] = {"state": T[name].target, "finished_us": now}
    if bad[0]:
        values["error"] = f"{bad[0]} child job(s) did not succeed (first: job {bad[1]})"
    conn.execute(sa.update(jobs).where(c.id == container, _guard(name)).values(values))
    return [(container, T[name].target, row.parent_id)]


def cancel_rows(
    conn: Connection, ad: Adapter, ids: Sequence[int], *, reason: str, by: int | None, now: int
) -> list[tuple[int, JobState, int | None]]:
    """Cancel the non-terminal jobs among ``ids`` and, for containers, their descendants."""
    out: list[tuple[int, JobState, int | None]] = []
    todo = sorted(set(ids))
    cause: int | sa.ColumnElement[Any] | None = by
    while todo:
        rows = conn.execute(
            ad.lock_update(
                sa.select(c.id, c.parent_id, c.container)
                .where(c.id.in_(todo), _guard("cancel"))
                .order_by(c.id)
            )
        ).all()
        if not rows:
            break
        hit = [r.id for r in rows]
        conn.execute(
            sa.update(jobs)
            .where(c.id.in_(hit), _guard("cancel"))
            .values(
                state=T["cancel"].target,
                error=_cut(reason),
                cancelled_by=cause,
                finished_us=now,
                **_LEASE_CLEARED,
            )
        )
        # Children of a cancelled container go with it; their roll-up into it is moot.
        out += [(r.id, S.CANCELLED, r.parent_id) for r in rows]
        boxes = [r.id for r in rows if r.container]
        todo = []
        if boxes:
            todo = sorted(conn.execute(sa.select(c.id).where(c.parent_id.in_(boxes))).scalars())
            reason = "cancelled with its container"
            cause = c.parent_id  # retrying the container revives them
    return out


def cancel(conn: Connection, ad: Adapter, job_id: int, *, now: int) -> bool:
    """Cancel a job (a container with everything inside it); False if already terminal."""
    if conn.execute(sa.select(c.id).where(c.id == job_id)).first() is None:
        raise UnknownJob(f"job {job_id} does not exist", job_id)
    done = cancel_rows(conn, ad, [job_id], reason="cancelled by request", by=None, now=now)
    after_terminal(conn, ad, done, now=now)
    return bool(done)


def retry(conn: Connection, ad: Adapter, job_id: int, *, now: int) -> bool:
    """FAILED/CANCELLED -> READY (or BLOCKED/WAITING), with what its failure cancelled.

    Revives the job, every job cancelled because of it (dependents, transitively, and a
    container's contents), a container's failed children, and reopens failed containers
    above it. Returns False when the job is not failed or cancelled.
    """
    row = conn.execute(ad.lock_update(sa.select(c.state).where(c.id == job_id))).first()
    if row is None:
        raise UnknownJob(f"job {job_id} does not exist", job_id)
    if row.state not in T["retry"].sources:
        return False
    revive: dict[int, Any] = {}
    reopen: dict[int, int] = {}  # container id -> children coming back into it
    todo = [job_id]
    while todo:
        x = todo.pop()
        if x in revive:
            continue
        r = conn.execute(
            ad.lock_update(
                sa.select(c.id, c.state, c.parent_id, c.container, c.pending_deps).where(c.id == x)
            )
        ).one()
        if r.state not in T["retry"].sources:
            continue
        revive[x] = r
        todo += conn.execute(
            sa.select(c.id).where(c.cancelled_by == x, c.state == S.CANCELLED)
        ).scalars()
        if r.container:
            todo += conn.execute(
                sa.select(c.id).where(c.parent_id == x, c.state == S.FAILED)
            ).scalars()
        parent = r.parent_id
        while parent is not None and parent not in revive:
            p = conn.execute(
                ad.lock_update(sa.select(c.state, c.parent_id).where(c.id == parent))
            ).one()
            if p.state == S.CANCELLED:
                raise InvalidJob(
                    f"job {x} is inside container {parent}, which is cancelled: "
                    f"retry container {parent} instead"
                )
            first = parent not in reopen
            reopen[parent] = reopen.get(parent, 0) + 1
            if p.state != S.FAILED or not first:
                break
            # A failed container reopens, and so do the jobs its failure cancelled.
            todo += conn.execute(
                sa.select(c.id).where(c.cancelled_by == parent, c.state == S.CANCELLED)
            ).scalars()
            parent = p.parent_id
    for x in sorted(revive):
        r = revive[x]
        if r.container:
            name = "retry_container"
        elif r.pending_deps > 0:
            name = "retry_blocked"
        else:
            name = "retry"
        conn.execute(
            sa.update(jobs)
            .where(c.id == x, _guard(name))
            .values(
                state=T[name].target,
                attempts=0,
                error=None,
                cancelled_by=None,
                result=None,
                finished_us=None,
                run_after_us=now,
                **_LEASE_CLEARED,
            )
        )
        if r.container:
            back = sum(1 for y in revive.values() if y.parent_id == x)
            conn.execute(sa.update(jobs).where(c.id == x).values(open_children=back))
    for box, n in sorted(reopen.items()):
        if box in revive:
            continue
        conn.execute(
            sa.update(jobs)
            .where(c.id == box)
            .values(
                state=S.WAITING, open_children=c.open_children + n, error=None, finished_us=None
            )
        )
    # A revived job may still wait on another failed or cancelled job: cancel it again,
    # so that nothing is left blocked forever.
    stuck = conn.execute(
        sa.select(deps.c.job_id, sa.func.min(deps.c.depends_on))
        .join(jobs, jobs.c.id == deps.c.depends_on)
        .where(deps.c.job_id.in_(sorted(revive)), c.state.in_([S.FAILED, S.CANCELLED]))
        .group_by(deps.c.job_id)
    ).all()
    for dependent, blocker in stuck:
        again = cancel_rows(
            conn,
            ad,
            [dependent],
            reason=f"cancelled: dependency {blocker} is not done",
            by=blocker,
            now=now,
        )
        after_terminal(conn, ad, again, now=now)
    return True


def prune(conn: Connection, *, before: int, batch: int, after_id: int) -> tuple[int, int | None]:
    """Delete finished jobs that finished before ``before`` and nothing still needs.

    Looks at up to ``batch`` candidates with ids above ``after_id``; returns how many were
    deleted and the last id looked at (None when there are no more candidates).
    """
    finished = sorted(TERMINAL)
    ids = list(
        conn.execute(
            sa.select(c.id)
            .where(c.state.in_(finished), c.finished_us < before, c.id > after_id)
            .order_by(c.id)
            .limit(batch)
        ).scalars()
    )
    if not ids:
        return 0, None
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
        return 0, ids[-1]
    conn.execute(
        sa.delete(deps).where(sa.or_(deps.c.job_id.in_(gone), deps.c.depends_on.in_(gone)))
    )
    conn.execute(sa.update(jobs).where(c.parent_id.in_(gone)).values(parent_id=None))
    conn.execute(sa.delete(jobs).where(c.id.in_(gone)))
    return len(gone), ids[-1]
