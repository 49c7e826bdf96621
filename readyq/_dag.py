"""Consequences of jobs finishing: DAG promotion, failure cascade, container roll-up,
cancel and retry. Internal; runs inside the caller's write transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ._guards import LEASE_CLEARED as _LEASE_CLEARED
from ._guards import cut as _cut
from ._guards import guard as _guard
from ._guards import id_binds, id_values, in_states
from .dialects import Adapter
from .errors import InvalidJob, UnknownJob
from .job import TRANSITIONS, JobState
from .schema import deps, jobs

__all__: list[str] = []

S = JobState
T = TRANSITIONS
c = jobs.c


@functools.lru_cache(maxsize=64)
def _terminal_lock(ad: Adapter) -> sa.Select[Any] | None:
    return ad.lock_terminal(sa.select(c.id).where(c.id == sa.bindparam("job_id")))


@functools.lru_cache(maxsize=256)
def promote_done(k: int) -> sa.Update:
    """``k`` parents done (their ids bound as ``done0`` ..): each child loses one count
    per finished parent, and the child whose last count this was becomes ready."""
    return _promote(lambda col: col.in_(id_binds("done", k)), counted=k > 1)


def promote_from(ad: Adapter, k: int, done: sa.CTE) -> sa.Update:
    """:func:`promote_done` for those of the ``k`` parents bound as ``id0`` .. that the
    CTE ``done`` holds (its column ``id``: e.g. a finalize's RETURNING)."""
    # The bound ids too, not the CTE alone: with only the CTE, PostgreSQL planned the edge
    # lookup as a scan of every edge (254 ms per finalize with 100k edges).
    ids = id_binds("id", k)
    # The children found through Adapter.among, not IN: a plan made without the ids'
    # values (PostgreSQL's kept generic plan) prices a parent's edges at the column's
    # average, and beside one parent with 100k dependents it hashed every edge and job
    # for each finalize, and JIT-compiled that plan: 220 ms (docs/benchmarks.md, session 21).
    kids = (
        sa.select(deps.c.job_id.label("id"))
        .where(deps.c.depends_on.in_(ids), ad.among(deps.c.depends_on, done))
        .cte("kids")
    )
    return _promote(
        lambda col: sa.and_(col.in_(ids), col.in_(sa.select(done.c.id))),
        counted=True,
        children=ad.among(c.id, kids),
    )


@functools.lru_cache(maxsize=256)
def _dependents(k: int) -> sa.Select[Any]:
    """The children of the ``k`` parents bound as ``done0`` .., by the deps index."""
    return (
        sa.select(deps.c.job_id)
        .where(deps.c.depends_on.in_(id_binds("done", k)))
        .distinct()
        .order_by(deps.c.job_id)
    )


@functools.lru_cache(maxsize=256)
def _promote_children(k: int, m: int) -> sa.Update:
    """:func:`promote_done` for ``k`` parents, on the ``m`` children bound as ``child0`` .."""
    return _promote(
        lambda col: col.in_(id_binds("done", k)),
        counted=k > 1,
        children=c.id.in_(id_binds("child", m)),
    )


def run_promote_done(conn: Connection, ad: Adapter, done: Sequence[int]) -> int:
    """Run :func:`promote_done` for ``done``; returns the children it touched.

    Where the server cannot run the UPDATE's subquery as a join, the children are looked
    up first and updated by key: one more round trip, and only when there are children.
    """
    params = id_values("done", done)
    if ad.update_semijoin:
        return conn.execute(promote_done(len(done)), params).rowcount
    children = list(conn.execute(_dependents(len(done)), params).scalars())
    if not children:
        return 0
    params.update(id_values("child", children))
    return conn.execute(_promote_children(len(done), len(children)), params).rowcount


def _promote(
    is_done: Callable[[Any], sa.ColumnElement[bool]],
    *,
    counted: bool,
    children: sa.ColumnElement[bool] | None = None,
) -> sa.Update:
    """One statement: state is assigned first, from the count before the decrement (MySQL
    evaluates SET left to right, the other databases from the old row). ``counted``: a
    child may wait on several of the parents, so it loses one count per finished parent.
    ``children``: the children, when the caller looked them up (else a subquery finds them).
    """
    edges = sa.select(deps.c.job_id).where(is_done(deps.c.depends_on))
    n: Any = 1
    if counted:
        n = (
            sa.select(sa.func.count())
            .where(deps.c.job_id == c.id, is_done(deps.c.depends_on))
            .scalar_subquery()
        )
    last = sa.and_(in_states(T["promote"].sources), c.pending_deps == n)
    return (
        sa.update(jobs)
        .where(c.id.in_(edges) if children is None else children)
        .ordered_values(
            (c.state, sa.case((last, T["promote"].target.value), else_=c.state)),
            (c.pending_deps, c.pending_deps - n),
        )
    )


def after_terminal(
    conn: Connection,
    ad: Adapter,
    settled: list[tuple[int, JobState, int | None]],
    *,
    now: int,
    locked: bool = False,
    promoted: int | None = None,
) -> dict[int, int]:
    """Consequences of jobs reaching a terminal state, in the same transaction.

    DONE promotes dependents whose last open dependency this was (an atomic counter
    decrement: the child's row lock serializes parents finishing together, NOTES 9).
    FAILED/CANCELLED cancels dependents, transitively. Either way the parent container's
    open-children counter drops, and the last child rolls the container up. Returns, per
    settled job, how many dependents were touched (decremented, cancelled, rolled up).

    ``locked``: the caller already took the terminal lock on the settled jobs' rows.
    ``promoted``: the caller already ran :func:`promote_done` for the DONE jobs, which
    touched this many rows. Dependents of several DONE jobs are promoted in one
    statement (their total only).
    """
    touched = {job_id: 0 for job_id, _, _ in settled}
    lock = _terminal_lock(ad)
    if not locked and lock is not None:
        for job_id, _, _ in settled:
            conn.execute(lock, {"job_id": job_id})
    done = [job_id for job_id, state, _ in settled if state == S.DONE]
    if done:
        if promoted is None:
            promoted = run_promote_done(conn, ad, done)
        touched[done[0]] += promoted
    for job_id, state, parent in settled:
        work = [(job_id, state, parent)]
        first = True
        while work:
            jid, st, par = work.pop()
            if not first:
                if lock is not None:
                    conn.execute(lock, {"job_id": jid})
                if st == S.DONE:
                    touched[job_id] += run_promote_done(conn, ad, [jid])
            if st != S.DONE:
                waiting = sa.select(deps.c.job_id).where(deps.c.depends_on == jid)
                dependents = sorted(conn.execute(waiting).scalars())
                if dependents:
                    reason = f"cancelled: dependency {jid} ended {st.value}"
                    cancelled = cancel_rows(conn, ad, dependents, reason=reason, by=jid, now=now)
                    touched[job_id] += len(cancelled)
                    work += cancelled
            first = False
            if par is not None:
                rolled = _rollup(conn, ad, par, now=now)
                touched[job_id] += len(rolled)
                work += rolled
    return touched


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
