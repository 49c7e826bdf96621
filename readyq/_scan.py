"""The ready set's shape per group, for fair share: exact, or capped at the free slots.

Internal. :func:`scan` without ``limit`` counts every ready row (one GROUP BY: its cost
grows with the backlog). With ``limit`` it reads at most ``limit`` ready rows per group,
through the claim index, so a Worker's tick costs the same beside 1,000 or 100,000 ready
jobs. :func:`readyq.fairshare.fair_share` ranks the same slots either way when ``limit`` is
the number of free slots (proved in its module docstring).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .dialects import Adapter
from .job import JobState
from .schema import jobs

__all__: list[str] = []

S = JobState
c = jobs.c

#: Groups per capped statement: a bounded statement however many groups have ready jobs.
_ARMS = 32


@dataclass(frozen=True)
class GroupStats:
    """One group in the ready set: jobs ready now, jobs running, and its weight.

    From a capped scan, ``ready`` stops at the cap and ``weight`` is the largest weight
    among the group's running jobs and the ready jobs it read (its first ``cap`` in claim
    order).
    """

    group: str
    ready: int
    running: int
    weight: float


def scan(conn: Connection, ad: Adapter, *, now: int, limit: int | None = None) -> list[GroupStats]:
    """Ready and running jobs per group, sorted by group; ``limit`` caps each ready count."""
    if limit is None:
        return _exact(conn, now)
    acc: dict[str, list[float]] = {}
    if ad.lateral_join:
        _fold(acc, conn.execute(_capped_lateral(ad), {"now": now, "cap": limit}))
        return _stats(acc)
    groups = list(conn.execute(_ready_groups(ad)).scalars())
    for start in range(0, max(len(groups), 1), _ARMS):
        chunk = groups[start : start + _ARMS]
        params: dict[str, Any] = {f"g{k}": g for k, g in enumerate(chunk)}
        params.update(now=now, cap=limit)
        _fold(acc, conn.execute(_capped(len(chunk), start == 0), params))
    return _stats(acc)


def _fold(acc: dict[str, list[float]], rows: Iterable[Any]) -> None:
    """Add ``(kind, group, count, max weight)`` rows into ``acc``: group -> counts, weight."""
    for kind, group, n, weight in rows:
        if group is None or not n:
            continue  # a group whose ready jobs are all deferred past now
        ready, running, w = acc.setdefault(group, [0, 0, 0.0])
        ready, running = (ready + n, running) if kind == "ready" else (ready, running + n)
        acc[group] = [ready, running, max(w, weight)]


def _exact(conn: Connection, now: int) -> list[GroupStats]:
    """Every ready and running row, counted by one GROUP BY.

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
    return _stats(acc)


def _stats(acc: dict[str, list[float]]) -> list[GroupStats]:
    return [GroupStats(g, int(r), int(n), w) for g, (r, n, w) in sorted(acc.items())]


@functools.lru_cache(maxsize=8)
def _ready_groups(ad: Adapter) -> sa.Select[Any]:
    """Group keys with a READY job (some may be deferred past now): one probe per group."""
    return ad.loose_distinct(c.group_key, c.state, S.READY.value)


def _running() -> sa.Select[Any]:
    """``(kind, group, count, max weight)`` of running jobs, which concurrency keeps few."""
    return (
        sa.select(
            sa.literal("running").label("kind"),
            c.group_key,
            sa.func.count().label("n"),
            sa.func.max(c.weight).label("weight"),
        )
        .where(c.state == S.RUNNING)
        .group_by(c.group_key)
    )


def _window(group: Any) -> sa.Select[Any]:
    """A group's first ``cap`` ready rows, down the claim index (state, group_key,
    priority, run_after_us, id)."""
    return (
        sa.select(c.group_key, c.weight)
        .where(c.state == S.READY, c.group_key == group, c.run_after_us <= sa.bindparam("now"))
        .order_by(c.priority, c.run_after_us, c.id)
        .limit(sa.bindparam("cap"))
    )


@functools.lru_cache(maxsize=8)
def _capped_lateral(ad: Adapter) -> sa.Executable:
    """The capped scan as one statement: each group the index walk finds joins its own
    window. One round trip, planned in about 0.3 ms; the union of one arm per group took
    1.1 ms to plan on PostgreSQL, every time."""
    groups = ad.loose_distinct(c.group_key, c.state, S.READY.value).subquery("groups")
    window = _window(groups.c.k).lateral("w")
    ready = (
        sa.select(
            sa.literal("ready").label("kind"),
            groups.c.k.label("group_key"),
            sa.func.count().label("n"),
            sa.func.max(window.c.weight).label("weight"),
        )
        .select_from(groups.join(window, sa.true()))
        .group_by(groups.c.k)
    )
    return sa.union_all(_running(), ready)


@functools.lru_cache(maxsize=2 * _ARMS + 2)
def _capped(arms: int, with_running: bool) -> sa.Executable:
    """One row per group: ``(kind, group, count, max weight)``.

    Each ready arm reads the group's first ``cap`` ready rows down the claim index
    ``(state, group_key, priority, run_after_us, id)``; the running arm (first statement
    only) counts running jobs, which the concurrency limit keeps few.
    """
    selects: list[Any] = [_running()] if with_running else []  # four columns each
    for k in range(arms):
        window = _window(sa.bindparam(f"g{k}")).subquery(f"w{k}")
        selects.append(
            sa.select(
                sa.literal("ready").label("kind"),
                # max(): the group key of a window of one group, NULL when it is empty.
                sa.func.max(window.c.group_key).label("group_key"),
                sa.func.count().label("n"),
                sa.func.max(window.c.weight).label("weight"),
            )
        )
    return selects[0] if len(selects) == 1 else sa.union_all(*selects)
