"""The measured loops, one per client: run in threads or in spawned processes alike.

Every loop connects first, then waits at a barrier with its siblings, so connection set-up
and process start-up are never timed. Each returns a plain dict (picklable) with how many
units it did and the wall-clock (``time.time``, comparable across processes) of its first
and last unit; the caller takes the union of the windows.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import sqlalchemy as sa

import readyq
from readyq import dialects

from .db import REF_ROWS, REF_TABLE

__all__ = ["drain_loop", "reference_loop", "warm_imports", "worker_loop", "worker_stages"]

Result = dict[str, Any]


class Barrier(Protocol):
    def wait(self, timeout: float | None = None) -> int: ...


def _guard(fn: Callable[[], Result]) -> Result:
    try:
        return fn()
    except Exception:  # reported to the parent, which fails the measurement loudly
        return {"error": traceback.format_exc()}


def warm_imports() -> int:
    """A no-op task that makes a fresh process import everything the loops need."""
    return 0


def reference_engine(url: str) -> tuple[sa.Engine, dialects.Adapter]:
    """An engine with readyq's connection settings, the isolation level set per connection.

    Same driver, connect arguments (SQLite's busy timeout) and isolation level as readyq's
    engine, but the level is set once when the connection opens: the reference is the
    cheapest durable write on these settings, not a copy of readyq's per-checkout costs.
    """
    parsed = sa.make_url(url)
    cls = dialects.adapter_class(
        "mariadb"
        if parsed.get_backend_name() in ("mysql", "mariadb")
        else parsed.get_backend_name()
    )
    options = cls.engine_options(parsed)
    if cls.isolation_level is not None:
        options["isolation_level"] = cls.isolation_level
    engine = sa.create_engine(parsed, **options)
    return engine, dialects.for_engine(engine)


def reference_loop(url: str, client: int, clients: int, seconds: float, barrier: Barrier) -> Result:
    """The simplest durable write: one-row ``UPDATE ... WHERE id = :id`` and a commit.

    One connection per client, held for the whole run; the first statement of each
    transaction is readyq's (``BEGIN IMMEDIATE`` on SQLite); each client its own rows.
    """

    def run() -> Result:
        engine, ad = reference_engine(url)
        stmt = sa.text(f"UPDATE {REF_TABLE} SET n = n + 1 WHERE id = :id")
        ids = list(range(client, REF_ROWS, clients))
        try:
            with engine.connect() as conn:
                conn.rollback()  # connected before the clock starts
                barrier.wait(120)
                first = time.time()
                deadline = first + seconds
                n = 0
                while True:
                    with conn.begin():
                        ad.begin_write(conn)
                        conn.execute(stmt, {"id": ids[n % len(ids)]})
                    n += 1
                    last = time.time()
                    if last >= deadline:
                        break
        finally:
            engine.dispose()
        return {"count": n, "first": first, "last": last}

    return _guard(run)


def drain_loop(url: str, worker_id: str, limit: int, finish: str, barrier: Barrier) -> Result:
    """The raw drain (see :func:`drain`) on a queue of its own, timed."""

    def run() -> Result:
        q = readyq.Queue(url)
        try:
            q.counts()  # connects and resolves the adapter before the clock starts
            barrier.wait(120)
            return drain(q, worker_id, limit, finish)
        finally:
            q.close()

    return _guard(run)


def drain(q: readyq.Queue, worker_id: str, limit: int, finish: str) -> Result:
    """``claim(limit)`` and finish the leases until a claim comes back empty. ``finish``:
    ``each`` (one ``finalize`` per lease), ``batch`` (one ``finalize_many``), or
    ``fused`` (``finalize_and_claim``: the results commit with the next claim)."""
    first: float | None = None
    last = 0.0
    n = claims = 0
    t = time.time()
    leases = q.claim(worker_id, ttl=120, limit=limit)
    while True:
        claims += 1
        if not leases:
            break
        if first is None:
            first = t
        results: list[tuple[readyq.Lease, None]] = [(lease, None) for lease in leases]
        if finish == "fused":
            outcomes, nxt = q.finalize_and_claim(results, worker_id, ttl=120, limit=limit)
        else:
            if finish == "batch":
                outcomes = q.finalize_many(results)
            else:
                outcomes = [q.finalize(lease, None) for lease in leases]
            last = time.time()  # the next claim is not part of this round's finish
            nxt = q.claim(worker_id, ttl=120, limit=limit)
        lost = [o for o in outcomes if isinstance(o, readyq.LeaseLost)]
        if lost:
            raise lost[0]
        n += len(leases)
        if finish == "fused":
            last = time.time()
        leases = nxt
    return {"count": n, "first": first, "last": last, "claims": claims}


def _noop(ctx: readyq.JobContext, args: dict[str, Any]) -> None:
    return None


def worker_loop(  # noqa: PLR0917  # the runner calls fn(*args, barrier)
    url: str,
    worker_id: str,
    slots: int,
    poll: float,
    scan_max_age: float | None,
    executor: str,
    barrier: Barrier,
) -> Result:
    """``readyq.Worker`` (scan, fair-share ranking, claim, run handlers on ``executor``,
    persist); ``scan_max_age`` None: the Worker's default.

    The window is taken where the tick's stages return, once per tick: an event hook
    would make the Worker build and deliver two events per job, which a Worker without
    hooks never does (a few percent of a no-op job's cost).
    """

    def run() -> Result:
        q = readyq.Queue(url)
        window: dict[str, float] = {}
        done = [0]
        try:
            q.counts()
            worker = readyq.Worker(
                q,
                {"noop": _noop},
                worker_id=worker_id,
                limits=[readyq.Concurrency(slots)],
                poll_interval=poll,
                executor=executor,
                **_scan_option(scan_max_age),
            )
            _time_window(worker, window, done)
            barrier.wait(120)
            worker.run(until_idle=True)
        finally:
            q.close()
        return {"count": done[0], "first": window.get("first"), "last": window.get("last", 0.0)}

    return _guard(run)


def _time_window(worker: readyq.Worker, window: dict[str, float], done: list[int]) -> None:
    """Note in ``window`` when ``worker``'s first claim and last finalize returned, and
    count its finished jobs in ``done[0]``, by wrapping the two stages that claim and
    finalize (``persist_and_lease``) or finalize (``collect``); ``persist`` calls both."""
    lease = worker.persist_and_lease

    def persist_and_lease(ranking: Any) -> Any:
        got = lease(ranking)
        now = time.time()
        if got[2]:
            window.setdefault("first", now)
        noted(got[0], now)
        return got

    def noted(finished: int, now: float) -> None:
        if finished:
            window["last"] = now
            done[0] += finished

    settle = worker.collect

    def collect() -> Any:
        got = settle()
        noted(got[0], time.time())
        return got

    # The instance's attributes: tick() and run() look the stages up on the instance.
    worker.persist_and_lease = persist_and_lease  # type: ignore[method-assign]
    worker.collect = collect  # type: ignore[method-assign]


#: The Worker's tick stages :func:`worker_stages` times (readyq/worker.py's tick).
STAGES = ("collect", "reclaim_due", "scan", "rank", "persist_and_lease", "dispatch")


def _scan_option(scan_max_age: float | None) -> dict[str, Any]:
    return {} if scan_max_age is None else {"scan_max_age": scan_max_age}


def drain_by(q: readyq.Queue, runner: str, worker_id: str, **options: Any) -> None:
    """Drain ``q``'s no-op jobs in this thread, untimed, as the tools that watch a drain
    from outside do (serverlog, instructions): ``runner`` ``"raw"`` is :func:`drain`'s
    batched ``finalize_and_claim`` loop, else a fair-share ``readyq.Worker`` with that
    executor and ``Concurrency(10)``, given ``options`` (None values: its defaults)."""
    if runner == "raw":
        drain(q, worker_id, 10, "fused")
        return
    readyq.Worker(
        q,
        {"noop": _noop},
        worker_id=worker_id,
        limits=[readyq.Concurrency(10)],
        executor=runner,
        **{k: v for k, v in options.items() if v is not None},
    ).run(until_idle=True)


def worker_stages(
    url: str,
    slots: int,
    poll: float,
    stop_after: int | None = None,
    scan_max_age: float | None = None,
    *,
    executor: str = "thread",
) -> Result:
    """One ``readyq.Worker`` draining the queue, each tick stage timed (wall seconds).

    ``stop_after``: stop once that many jobs are finished (else when the queue is idle);
    ``done`` is then the jobs this worker finished. ``scans`` counts the ticks that
    scanned the ready set (the others reused a recent scan: ``Worker(scan_max_age=...)``);
    ``claimed`` the leases its ticks took. One untimed scan comes first: a fresh Queue's
    first one compiles and plans the statement (about 5 ms on PostgreSQL against 0.5),
    and with a scan reused for 0.2 s a short drain makes only one or two.
    """
    spent = dict.fromkeys(STAGES, 0.0)
    calls = dict.fromkeys(STAGES, 0)
    finished = 0
    claimed = 0
    q = readyq.Queue(url)
    try:
        q.counts()
        worker = readyq.Worker(
            q,
            {"noop": _noop},
            worker_id="stages",
            limits=[readyq.Concurrency(slots)],
            poll_interval=poll,
            executor=executor,
            **_scan_option(scan_max_age),
        )
        worker.scan()  # untimed, uncounted: see above
        for name in STAGES:
            real = getattr(worker, name)

            def timed(*args: Any, _real: Any = real, _name: str = name) -> Any:
                nonlocal finished, claimed
                t = time.perf_counter()
                try:
                    got = _real(*args)
                finally:
                    spent[_name] += time.perf_counter() - t
                    calls[_name] += 1
                if _name == "persist_and_lease":
                    claimed += len(got[2])
                if _name in ("collect", "persist_and_lease"):
                    finished += got[0]
                    if stop_after is not None and finished >= stop_after:
                        worker.stop()
                return got

            setattr(worker, name, timed)  # the instance's attribute: tick() calls it
        ticks = [0]
        real_tick = worker.tick

        def counted() -> Any:
            ticks[0] += 1
            return real_tick()

        worker.tick = counted  # type: ignore[method-assign]  # run() calls the instance's
        t = time.perf_counter()
        worker.run(until_idle=stop_after is None)
        wall = time.perf_counter() - t
        done = q.counts()["done"] if stop_after is None else finished
    finally:
        q.close()
    return {
        "wall_s": wall,
        "done": done,
        "ticks": ticks[0],
        "scans": calls["scan"],
        "claimed": claimed,
        "stages_s": spent,
    }
