"""Enqueueing: validation of job specs, and the all-or-nothing insert of a DAG.

``Queue.enqueue`` is a graph of one job, so both paths share this code.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from .clock import to_us
from .dialects import Adapter
from .errors import CycleError, InvalidJob, UnknownJob
from .job import JobState, check_text, encode_payload
from .schema import deps, jobs

if TYPE_CHECKING:
    from .queue import Queue

__all__ = ["DEFAULT_MAX_ATTEMPTS", "Graph", "JobHandle"]

#: Attempts a job gets unless ``max_attempts`` says otherwise (claims count, reclaims too).
DEFAULT_MAX_ATTEMPTS = 3
_MAX_NAME = 200
_INT32 = 2**31 - 1
c = jobs.c


class JobHandle:
    """A job added to a :class:`Graph`; usable in ``after=``/``parent=`` of the same graph.

    ``id`` is known once the graph has committed.
    """

    __slots__ = ("_graph", "_id", "index")

    def __init__(self, graph: Graph, index: int) -> None:
        self._graph = graph
        self.index = index
        self._id: int | None = None

    @property
    def id(self) -> int:
        if self._id is None:
            raise InvalidJob("this job's id is known only after its graph has committed")
        return self._id

    def __repr__(self) -> str:
        return f"<JobHandle #{self.index} id={self._id}>"


Ref = int | JobHandle


@dataclass
class _Spec:
    type: str
    args: str
    group: str
    weight: float
    priority: int
    after: list[Ref]
    parent: Ref | None
    run_after: _dt.datetime | _dt.timedelta | None
    key: str | None
    max_attempts: int
    timeout_us: int | None
    container: bool
    handle: JobHandle = field(repr=False, default=None)  # type: ignore[assignment]  # set by Graph.add right after


def _name(value: object, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidJob(f"{what} must be a non-empty string, not {value!r:.60}")
    if len(value) > _MAX_NAME:
        raise InvalidJob(f"{what} is longer than {_MAX_NAME} characters")
    check_text(value, what)
    if "\x00" in value:
        raise InvalidJob(f"{what} contains a NUL character, which PostgreSQL cannot store")
    return value


def _int(value: object, what: str, low: int, high: int = _INT32) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(f"{what} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidJob(f"{what} must be between {low} and {high}, not {value}")
    return value


def _seconds(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidJob(f"{what} must be a number of seconds, not {type(value).__name__}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidJob(f"{what} must be a positive, finite number of seconds, not {value}")
    return float(value)


class Graph:
    """Collects jobs and their edges; inserts all of them in one transaction, or none.

    Use as ``with queue.graph() as g:``. Leaving the block with an exception writes nothing.
    """

    def __init__(self, queue: Queue) -> None:
        self._queue = queue
        self._specs: list[_Spec] = []
        self._committed = False

    def __enter__(self) -> Graph:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.commit()

    @property
    def handles(self) -> list[JobHandle]:
        return [s.handle for s in self._specs]

    def add(
        self,
        type: str,
        args: dict[str, Any] | None = None,
        *,
        group: str = "default",
        weight: float = 1,
        priority: int = 0,
        after: Iterable[Ref] = (),
        parent: Ref | None = None,
        run_after: _dt.datetime | _dt.timedelta | None = None,
        key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        container: bool = False,
    ) -> JobHandle:
        """Add one job; same arguments as :meth:`Queue.enqueue`."""
        if self._committed:
            raise InvalidJob("this graph has already committed; start a new queue.graph()")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise InvalidJob(f"weight must be a number, not {weight.__class__.__name__}")
        if not math.isfinite(weight) or weight <= 0:
            raise InvalidJob(f"weight must be a positive, finite number, not {weight}")
        if run_after is not None:
            if isinstance(run_after, _dt.datetime):
                if run_after.tzinfo is None:
                    raise InvalidJob("run_after must be timezone-aware (e.g. tz=datetime.UTC)")
            elif not isinstance(run_after, _dt.timedelta):
                raise InvalidJob("run_after must be an aware datetime or a timedelta")
        if key is not None and (not isinstance(key, str) or not key or len(key) > 255):
            raise InvalidJob("key must be a non-empty string of at most 255 characters")
        if key is not None:
            check_text(key, "key")
            if "\x00" in key:
                raise InvalidJob("key contains a NUL character, which PostgreSQL cannot store")
        if not isinstance(container, bool):
            raise InvalidJob("container must be True or False")
        if isinstance(after, (str, bytes)) or not isinstance(after, Iterable):
            raise InvalidJob("after must be an iterable of job ids or handles")
        refs = list(dict.fromkeys(self._ref(a, "after") for a in after))
        if container and refs:
            raise InvalidJob(
                "a container cannot have dependencies (after=); put them on its children"
            )
        spec = _Spec(
            type=_name(type, "type"),
            args=encode_payload({} if args is None else args, "args"),
            group=_name(group, "group"),
            weight=float(weight),
            priority=_int(priority, "priority", -_INT32),
            after=refs,
            parent=None if parent is None else self._ref(parent, "parent"),
            run_after=run_after,
            key=key,
            max_attempts=_int(max_attempts, "max_attempts", 1, 1000),
            timeout_us=None if timeout is None else round(_seconds(timeout, "timeout") * 1e6),
            container=container,
        )
        spec.handle = JobHandle(self, len(self._specs))
        self._specs.append(spec)
        return spec.handle

    def depends(self, job: JobHandle, *on: Ref) -> None:
        """Add edges after the fact: ``job`` waits for each of ``on``."""
        spec = self._spec(job)
        if spec.container:
            raise InvalidJob("a container cannot have dependencies; put them on its children")
        for ref in on:
            r = self._ref(ref, "depends")
            if r not in spec.after:
                spec.after.append(r)

    def _spec(self, handle: JobHandle) -> _Spec:
        if not isinstance(handle, JobHandle) or handle._graph is not self:
            raise InvalidJob("expected a handle returned by this graph's add()")
        return self._specs[handle.index]

    def _ref(self, value: object, what: str) -> Ref:
        if isinstance(value, JobHandle):
            if value._graph is self:
                return value
            return value.id  # a handle of a committed graph
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InvalidJob(f"{what} must contain job ids (positive ints) or handles")
        return value

    def _order(self) -> list[_Spec]:
        """Specs with dependencies and parents first; CycleError if some job could never run.

        A job cannot run before what it waits for: its dependencies, and (for a container)
        its children. A cycle in that wait-for graph is refused.
        """
        n = len(self._specs)
        waits: list[set[int]] = [set() for _ in range(n)]
        for i, spec in enumerate(self._specs):
            waits[i].update(r.index for r in spec.after if isinstance(r, JobHandle))
            if isinstance(spec.parent, JobHandle):
                waits[spec.parent.index].add(i)
        mark = [0] * n  # 0 unseen, 1 on the current path, 2 finished

        def visit(i: int, path: list[int]) -> None:
            mark[i] = 1
            for j in sorted(waits[i]):
                if mark[j] == 1:
                    loop = [*path[path.index(j) :], j] if j in path else [i, j]
                    names = tuple(f"#{k} {self._specs[k].type}" for k in loop)
                    raise CycleError("these jobs wait for each other: " + " -> ".join(names), names)
                if mark[j] == 0:
                    visit(j, [*path, j])
            mark[i] = 2

        for i in range(n):
            if mark[i] == 0:
                visit(i, [i])
        # Insertion order: dependencies and parents before the jobs that refer to them.
        placed: list[int] = []
        seen: set[int] = set()

        def place(i: int) -> None:
            if i in seen:
                return
            seen.add(i)
            spec = self._specs[i]
            for r in spec.after:
                if isinstance(r, JobHandle):
                    place(r.index)
            if isinstance(spec.parent, JobHandle):
                place(spec.parent.index)
            placed.append(i)

        for i in range(n):
            place(i)
        return [self._specs[i] for i in placed]

    def commit(self) -> list[int]:
        """Insert everything now (``with`` does this on a clean exit); returns the ids."""
        if self._committed:
            raise InvalidJob("this graph has already committed")
        order = self._order()
        ids = self._queue._write(lambda conn, ad, now: _insert(conn, ad, order, now), notify=True)
        for spec, job_id in zip(order, ids, strict=True):
            spec.handle._id = job_id
        self._committed = True
        return [s.handle.id for s in self._specs]


def _insert(conn: Connection, ad: Adapter, order: Sequence[_Spec], now: int) -> list[int]:
    """The insert transaction: lock what the new jobs depend on, then write them."""
    keys = sorted({s.key for s in order if s.key is not None})
    existing: dict[str, int] = {}
    if keys:
        existing = {
            r.key: r.id for r in conn.execute(sa.select(c.key, c.id).where(c.key.in_(keys)))
        }
    # A spec whose key exists is that existing job: references to it become its id.
    known: dict[int, int] = {
        s.handle.index: existing[s.key] for s in order if s.key is not None and s.key in existing
    }

    def ref(r: Ref) -> Ref:
        return known.get(r.index, r) if isinstance(r, JobHandle) else r

    def ref_opt(r: Ref | None) -> Ref | None:
        return None if r is None else ref(r)

    by_index = {s.handle.index: s for s in order}

    new = [s for s in order if s.handle.index not in known]
    outside_deps = sorted({d for s in new for d in map(ref, s.after) if isinstance(d, int)})
    parents = sorted({p for s in new if isinstance(p := ref_opt(s.parent), int)})
    dep_state = _lock_dependencies(conn, ad, outside_deps)
    ancestors = _lock_parents(conn, ad, parents)
    for s in new:
        top = s
        while isinstance(top.parent, JobHandle) and top.parent.index not in known:
            top = by_index[top.parent.index]
        outer = ref_opt(top.parent)
        if isinstance(outer, int):
            bad = [d for d in map(ref, s.after) if d in ancestors[outer]]
            if bad:
                raise CycleError(
                    f"a job inside container {outer} cannot wait for job {bad[0]}, "
                    "which contains it"
                )
    # Containers that get no unfinished child are done at once (bottom-up).
    done_now: set[int] = set()
    for s in reversed(new):
        if s.container and not any(
            ch.handle.index not in done_now
            for ch in new
            if isinstance(ch.parent, JobHandle) and ch.parent.index == s.handle.index
        ):
            done_now.add(s.handle.index)
    ids: dict[int, int] = dict(known)
    open_children: dict[int, int] = {}
    for ch in new:
        if isinstance(ch.parent, JobHandle) and ch.handle.index not in done_now:
            open_children[ch.parent.index] = open_children.get(ch.parent.index, 0) + 1
    # Waves: a job goes in the first wave after everything it refers to, so each wave is
    # one multi-row INSERT (ids come back in order where INSERT ... RETURNING exists).
    wave: dict[int, int] = {}
    for sp in new:
        refs = [r for r in (*map(ref, sp.after), ref_opt(sp.parent)) if isinstance(r, JobHandle)]
        wave[sp.handle.index] = 1 + max((wave[r.index] for r in refs), default=-1)
    bumps: dict[int, int] = {}
    for level in sorted(set(wave.values())):
        batch = [sp for sp in new if wave[sp.handle.index] == level]
        rows = [
            _row(
                sp,
                ref,
                ids=ids,
                dep_state=dep_state,
                done_now=done_now,
                open_children=open_children,
                now=now,
            )
            for sp in batch
        ]
        for job_id, sp in zip(_insert_rows(conn, ad, rows), batch, strict=True):
            ids[sp.handle.index] = job_id
        edges = [
            {
                "job_id": ids[sp.handle.index],
                "depends_on": d if isinstance(d, int) else ids[d.index],
            }
            for sp in batch
            for d in map(ref, sp.after)
        ]
        if edges:
            conn.execute(sa.insert(deps), edges)
        for sp, row in zip(batch, rows, strict=True):
            parent = ref_opt(sp.parent)
            if isinstance(parent, int) and row["state"] != JobState.DONE:
                bumps[parent] = bumps.get(parent, 0) + 1
    for p, n in sorted(bumps.items()):
        conn.execute(sa.update(jobs).where(c.id == p).values(open_children=c.open_children + n))
    return [ids[sp.handle.index] for sp in order]


def _row(
    s: _Spec,
    ref: Any,
    *,
    ids: dict[int, int],
    dep_state: dict[int, str],
    done_now: set[int],
    open_children: dict[int, int],
    now: int,
) -> dict[str, Any]:
    """The column values of one new job (its references already have ids)."""
    i = s.handle.index
    after = [ref(r) for r in s.after]
    pending = sum(
        1
        for d in after
        if (dep_state[d] != JobState.DONE if isinstance(d, int) else d.index not in done_now)
    )
    if s.container:
        state = JobState.DONE if i in done_now else JobState.WAITING
    else:
        state = JobState.BLOCKED if pending else JobState.READY
    parent = None if s.parent is None else ref(s.parent)
    if isinstance(s.run_after, _dt.datetime):
        run_after = to_us(s.run_after)
    elif isinstance(s.run_after, _dt.timedelta):
        run_after = now + round(s.run_after.total_seconds() * 1e6)
    else:
        run_after = now
    return {
        "type": s.type,
        "args": s.args,
        "state": state,
        "container": s.container,
        "parent_id": ids[parent.index] if isinstance(parent, JobHandle) else parent,
        "group_key": s.group,
        "weight": s.weight,
        "priority": s.priority,
        "key": s.key,
        "pending_deps": pending,
        "open_children": open_children.get(i, 0),
        "attempts": 0,
        "max_attempts": s.max_attempts,
        "timeout_us": s.timeout_us,
        "lease_token": 0,
        "run_after_us": run_after,
        "created_us": now,
        "finished_us": now if state == JobState.DONE else None,
    }


def _insert_rows(conn: Connection, ad: Adapter, rows: list[dict[str, Any]]) -> list[int]:
    """Insert rows, returning their ids in order."""
    if ad.insert_returning and len(rows) > 1:
        stmt = sa.insert(jobs).returning(c.id, sort_by_parameter_order=True)
        return [int(r.id) for r in conn.execute(stmt, rows)]
    out = []
    for row in rows:
        inserted = conn.execute(sa.insert(jobs).values(row)).inserted_primary_key
        assert inserted is not None
        out.append(int(inserted[0]))
    return out


def _lock_dependencies(conn: Connection, ad: Adapter, ids: list[int]) -> dict[int, str]:
    """States of existing dependencies, share-locked until commit; refuses bad ones."""
    if not ids:
        return {}
    # Shared locks: a dependency cannot finish between our read of its state and the
    # commit of the edge that waits on it (else the new job would wait forever).
    conn.execute(ad.lock_share(sa.select(c.id).where(c.id.in_(ids)).order_by(c.id)))
    # Read the states in a second statement, after the lock is ours: PostgreSQL's
    # FOR KEY SHARE does not conflict with a finalize's non-key UPDATE, and may return the
    # row as it was before that finalize committed; a new statement (READ COMMITTED) sees
    # the commit, so the new job never waits on a dependency that is already done.
    rows = conn.execute(sa.select(c.id, c.state).where(c.id.in_(ids))).all()
    states = {r.id: r.state for r in rows}
    for d in ids:
        if d not in states:
            raise UnknownJob(f"dependency {d} does not exist; enqueue it first or drop it", d)
        if states[d] in (JobState.FAILED, JobState.CANCELLED):
            raise InvalidJob(
                f"dependency {d} is {states[d]}, so this job could never run; "
                f"retry job {d} first or drop the dependency"
            )
    return states


def _lock_parents(conn: Connection, ad: Adapter, ids: list[int]) -> dict[int, set[int]]:
    """Existing containers receiving children, locked; returns each one's ancestors."""
    if not ids:
        return {}
    rows = conn.execute(
        ad.lock_update(
            sa.select(c.id, c.state, c.container, c.parent_id).where(c.id.in_(ids)).order_by(c.id)
        )
    ).all()
    found = {r.id: r for r in rows}
    out: dict[int, set[int]] = {}
    for p in ids:
        if p not in found:
            raise UnknownJob(f"parent {p} does not exist", p)
        if not found[p].container:
            raise InvalidJob(f"parent {p} is not a container; enqueue it with container=True")
        if found[p].state != JobState.WAITING:
            raise InvalidJob(
                f"container {p} is already {found[p].state}: add children in the same "
                "graph() as their container, or while it still has unfinished children"
            )
        chain = {p}
        up = found[p].parent_id
        while up is not None and up not in chain:
            chain.add(up)
            up = conn.execute(sa.select(c.parent_id).where(c.id == up)).scalar()
        out[p] = chain
    return out
