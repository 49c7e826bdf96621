"""What the peer drains (``peer_pgqueuer.py``, ``peer_procrastinate.py``) share: a scratch
database of their own, and a drain's rate over several processes. Standard library only,
plus whichever PostgreSQL driver the peer's virtualenv has (psycopg or asyncpg)."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: A peer's worker in one process: ``run(seen, ready)`` calls ``ready()`` once it is
#: connected (the processes then start together), drains the queue, and counts each job
#: it ran in ``seen`` with :func:`mark`.
Run = Callable[[dict[str, float], Callable[[], None]], None]


def mark(seen: dict[str, float]) -> None:
    """Count one job started now (wall clock: comparable across processes)."""
    now = time.time()
    seen["n"] += 1
    seen["first"] = seen["first"] or now
    seen["last"] = now


def finished(seen: dict[str, float]) -> None:
    """Note that the peer's worker returned with every completion it buffered committed
    (PGQueuer writes them in batches, after the handlers ran)."""
    seen["end"] = time.time()


def fresh() -> dict[str, float]:
    return {"n": 0, "first": 0.0, "last": 0.0, "end": 0.0}


def _child(run: Run, barrier: Any, out: Any) -> None:
    seen = fresh()
    run(seen, lambda: barrier.wait(120))
    if not seen["end"]:
        finished(seen)  # a peer that did not say: when it returned
    out.put(seen)


@dataclass(frozen=True)
class Drain:
    """One drain's jobs/s from the first job started: to the last job started
    (``rate``), and to the last worker's completions committed (``committed``: the
    window ``readyq bench`` gives a Worker, first claim to last finalize)."""

    rate: float
    committed: float


def drain_rate(run: Run, procs: int, jobs: int) -> Drain:
    """The drain of ``procs`` processes each running ``run`` (picklable) until the queue
    is empty; every job must have run once."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_child, args=(run, barrier, out)) for _ in range(procs)]
    for w in workers:
        w.start()
    seen = [out.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    return window(seen, jobs)


def window(seen: list[dict[str, float]], jobs: int) -> Drain:
    """The drain's rates from what each process noted (:func:`mark`, :func:`finished`),
    from the first job any of them started; every one of the ``jobs`` must have run."""
    done = sum(int(s["n"]) for s in seen)
    if done != jobs:
        raise SystemExit(f"the peer ran {done} of {jobs} jobs")
    first = min(s["first"] for s in seen if s["n"])
    return Drain(
        done / (max(s["last"] for s in seen) - first), done / (max(s["end"] for s in seen) - first)
    )


def parser(doc: str, jobs: int) -> argparse.ArgumentParser:
    """The options every peer drain takes; the caller adds its own."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--jobs", type=int, default=jobs)
    p.add_argument("--procs", default="1,8", help="process counts (default 1,8)")
    p.add_argument("--repeat", type=int, default=3)
    return p


def measure(label: str, args: argparse.Namespace, fill: Callable[[], None], run: Run) -> None:
    """For each ``--procs`` count: ``fill()`` then a drain, once to warm up and
    ``--repeat`` times measured; prints the median, min and max jobs/s of both windows
    (:class:`Drain`)."""
    for procs in [int(x) for x in args.procs.split(",")]:
        got = []
        for _ in range(args.repeat + 1):  # the first is a warm-up
            fill()
            got.append(drain_rate(run, procs, args.jobs))
        rates = [d.rate for d in got[1:]]
        committed = [d.committed for d in got[1:]]
        print(
            f"{label} x{procs} processes, {args.jobs} jobs: median "
            f"{statistics.median(rates):,.0f} jobs/s (min {min(rates):,.0f}, "
            f"max {max(rates):,.0f}); to the last completion committed: median "
            f"{statistics.median(committed):,.0f} (min {min(committed):,.0f}, "
            f"max {max(committed):,.0f})",
            flush=True,
        )


def _execute(dsn: str, sql: str) -> None:
    try:
        import psycopg
    except ImportError:
        import asyncpg

        async def run() -> None:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        asyncio.run(run())
        return
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql)


@contextmanager
def admin_database(admin_dsn: str, name: str) -> Iterator[str]:
    """A new database ``name`` on ``admin_dsn``'s server (its DSN), dropped afterwards."""
    _execute(admin_dsn, f'CREATE DATABASE "{name}"')  # a generated identifier, not a value
    try:
        yield f"{admin_dsn.rpartition('/')[0]}/{name}"
    finally:
        _execute(admin_dsn, f'DROP DATABASE "{name}" WITH (FORCE)')
