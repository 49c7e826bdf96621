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
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .dialects import Adapter, plan_once
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


@dataclass
class RecentScan:
    """A Worker's last capped scan, kept current with the Worker's own claims and ends,
    and reused by its ticks for up to ``max_age`` seconds (0: never reused).

    A scan costs a round trip and about as much server time as a claim of ten jobs
    (docs/benchmarks.md, sessions 11 and 18). What a reuse cannot know is what *other*
    workers did since, and jobs that became ready since (both at most ``max_age`` old):
    so it is only offered while the view still shows a ready job, a group whose claim
    came back short of its ranking shows none until the next scan (:meth:`ran_out`: no
    unlocked ready row was left), and the Worker forgets the scan (:meth:`forget`)
    when a sweep made jobs ready again or a claim failed.

    Bookkeeping: ``running`` is the scan's count plus this worker's claims since, minus
    its runs that ended since (each ended run was counted once: in the scan, or by
    :meth:`claimed`). ``ready`` is the scan's count minus the claims since, except for a
    group whose count reached the scan's cap: it may hold any number more, so it keeps
    its count until a claim finds fewer (:meth:`ran_out`).

    Internal; not thread-safe: the Worker calls it under its lock.
    """

    max_age: float
    _stats: list[GroupStats] | None = None
    _cap: int = 0
    _at: float = 0.0
    _claimed: dict[str, int] = field(default_factory=dict)
    _ended: dict[str, int] = field(default_factory=dict)
    _out: set[str] = field(default_factory=set)

    def view(self, free: int, now: float) -> list[GroupStats] | None:
        """The last scan as it stands now, or None when a fresh scan is due."""
        if self._stats is None or free > self._cap or now - self._at >= self.max_age:
            return None
        out = []
        for s in self._stats:
            taken = self._claimed.get(s.group, 0)
            if s.group in self._out:
                ready = 0
            elif s.ready >= self._cap:
                ready = s.ready
            else:
                ready = max(0, s.ready - taken)
            running = max(0, s.running + taken - self._ended.get(s.group, 0))
            out.append(GroupStats(s.group, ready, running, s.weight))
        return out if any(s.ready for s in out) else None

    def took(self, stats: list[GroupStats], cap: int, now: float) -> None:
        """Keep a fresh scan, capped at ``cap`` ready jobs per group, taken at ``now``."""
        self._stats, self._cap, self._at = stats, cap, now
        self._claimed.clear()
        self._ended.clear()
        self._out.clear()

    def claimed(self, group: str) -> None:
        if self._stats is not None:
            self._claimed[group] = self._claimed.get(group, 0) + 1

    def ended(self, group: str) -> None:
        if self._stats is not None:
            self._ended[group] = self._ended.get(group, 0) + 1

    def ran_out(self, group: str) -> None:
        """A claim found fewer of ``group``'s ready jobs than the view showed: other
        workers took the rest (or the view was reused). Until the next scan it shows
        none; the other groups' counts stay good."""
        if self._stats is not None:
            self._out.add(group)

    def forget(self) -> None:
        self._stats = None


def scan(conn: Connection, ad: Adapter, *, now: int, limit: int | None = None) -> list[GroupStats]:
    """Ready and running jobs per group, sorted by group; ``limit`` caps each ready count."""
    if limit is None:
        return _exact(conn, now)
    acc: dict[str, list[float]] = {}
    if ad.lateral_join:
        _fold(acc, ad.execute_one(conn, _capped_lateral(ad), {"now": now, "cap": limit}))
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
        # Implied (a claim sets the expiry; nothing else makes a job running), and it lets
        # a plan made without the state's value use the index of running rows, not a
        # sequential scan of every job (PostgreSQL's generic plan: docs/benchmarks.md).
        .where(c.state == S.RUNNING, c.lease_expires_us.is_not(None))
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
    # Planned once: each group's window walks the claim index whatever the cap, and the
    # running jobs are found by their index (see _running).
    return plan_once(sa.union_all(_running(), ready))


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
