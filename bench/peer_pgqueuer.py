"""PGQueuer's drain on the same server, for a ratio measured in the same session.

Issue 6 states its PostgreSQL target as PGQueuer's rate "measured on this machine", but
this machine's speed varies by 2x from one day to the next. This script drains N no-op
jobs with PGQueuer (asyncpg, ``batch_size=10``, no concurrency limit, ``drain`` mode), in
one or more processes, so that ``readyq bench`` and PGQueuer can be run one after the
other and compared as a ratio. It is a manual tool, not part of the suite, and it does
not import readyq: run it from a virtualenv that has PGQueuer::

    python3 -m venv /tmp/pgq && /tmp/pgq/bin/pip install 'pgqueuer==1.6.0' asyncpg
    /tmp/pgq/bin/python bench/peer_pgqueuer.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

It creates its own database ``readyq_bench_pgq_<hex>`` on that server and drops it at the
end. jobs/s counts from the first handler start to the last (PGQueuer buffers the
completions), median of ``--repeat`` runs after a warm-up; ``--analyze`` runs ANALYZE
after each fill, as ``readyq bench`` does by default.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

try:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.domain.types import QueueExecutionMode
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
except ImportError as exc:  # a manual tool: say how to get what it needs
    raise SystemExit(f"needs PGQueuer 1.6 and asyncpg ({exc}): see this file's docstring") from None


async def _drain(dsn: str, barrier: Any, out: Any) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    seen = {"n": 0, "first": 0.0, "last": 0.0}

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        now = time.time()
        seen["first"] = seen["first"] or now
        seen["last"] = now
        seen["n"] += 1

    barrier.wait()
    await qm.run(batch_size=10, mode=QueueExecutionMode.drain)
    await conn.close()
    out.put(seen)


def _process(dsn: str, barrier: Any, out: Any) -> None:
    asyncio.run(_drain(dsn, barrier, out))


async def _fill(dsn: str, jobs: int, analyze: bool) -> None:
    conn = await asyncpg.connect(dsn)
    queries = Queries(AsyncpgDriver(conn))
    await conn.execute("TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics")
    for start in range(0, jobs, 1000):
        n = min(1000, jobs - start)
        await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
    if analyze:
        await conn.execute("ANALYZE pgqueuer")
    await conn.close()


async def _admin(dsn: str, sql: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def _rate(dsn: str, jobs: int, procs: int, analyze: bool) -> float:
    asyncio.run(_fill(dsn, jobs, analyze))
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=_process, args=(dsn, barrier, out)) for _ in range(procs)]
    for w in workers:
        w.start()
    seen = [out.get(timeout=600) for _ in workers]
    for w in workers:
        w.join()
    done = sum(s["n"] for s in seen)
    if done != jobs:
        raise SystemExit(f"PGQueuer ran {done} of {jobs} jobs")
    first = min(s["first"] for s in seen if s["n"])
    return done / (max(s["last"] for s in seen) - first)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--procs", default="1,8", help="process counts (default 1,8)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--analyze", action="store_true", help="ANALYZE after each fill")
    args = p.parse_args()
    name = f"readyq_bench_pgq_{uuid.uuid4().hex[:12]}"
    base, _, _ = args.dsn.rpartition("/")
    dsn = f"{base}/{name}"
    asyncio.run(_admin(args.dsn, f'CREATE DATABASE "{name}"'))  # a generated identifier
    try:
        cmd = [sys.executable, "-m", "pgqueuer", "--pg-dsn", dsn, "install"]
        subprocess.run(cmd, check=True, capture_output=True)  # noqa: S603 -- this interpreter, fixed arguments
        for procs in [int(x) for x in args.procs.split(",")]:
            _rate(dsn, args.jobs, procs, args.analyze)  # warm-up, discarded
            rates = [_rate(dsn, args.jobs, procs, args.analyze) for _ in range(args.repeat)]
            print(
                f"PGQueuer x{procs} processes, batch 10, {args.jobs} jobs: median "
                f"{statistics.median(rates):,.0f} jobs/s (min {min(rates):,.0f}, "
                f"max {max(rates):,.0f})",
                flush=True,
            )
    finally:
        asyncio.run(_admin(args.dsn, f'DROP DATABASE "{name}" WITH (FORCE)'))


if __name__ == "__main__":
    main()
