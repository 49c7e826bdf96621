"""Procrastinate's drain on the same server, for a ratio measured in the same session.

Issue 6's unbatched PostgreSQL target is twice Procrastinate's rate "measured on this
machine", whose speed varies by 2x from one day to the next. This script drains N no-op
jobs with Procrastinate (psycopg 3, one job per fetch, ``wait=False`` so that a worker
stops once the queue is empty), in one or more processes, each running one worker with
``--concurrency`` jobs at a time. A manual tool like ``peer_pgqueuer.py``, run from a
virtualenv that has Procrastinate::

    python3 -m venv /tmp/proc && /tmp/proc/bin/pip install 'procrastinate==3.10.0'
    /tmp/proc/bin/python bench/peer_procrastinate.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

It creates its own database ``readyq_bench_proc_<hex>`` and drops it at the end. jobs/s
counts from the first handler start to the last, median of ``--repeat`` runs after a
warm-up.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Any

# bench/ is sys.path[0]
from peer_common import admin_database, finished, fresh, mark, measure, parser

try:
    import procrastinate
    import psycopg
except ImportError as exc:  # a manual tool: say how to get what it needs
    raise SystemExit(f"needs Procrastinate 3.10 ({exc}): see this file's docstring") from None


def _app(dsn: str, seen: dict[str, float]) -> tuple[Any, Any]:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="noop")
    async def noop() -> None:
        mark(seen)

    return app, noop


async def _drain(dsn: str, concurrency: int, seen: dict[str, float], ready: Any) -> None:
    app, _ = _app(dsn, seen)
    async with app.open_async():
        ready()
        await app.run_worker_async(concurrency=concurrency, wait=False, listen_notify=False)
        finished(seen)


def _run(dsn: str, concurrency: int, seen: dict[str, float], ready: Any) -> None:
    asyncio.run(_drain(dsn, concurrency, seen, ready))


async def _fill(dsn: str, jobs: int, install: bool) -> None:
    app, noop = _app(dsn, fresh())
    async with app.open_async():
        if install:
            await app.schema_manager.apply_schema_async()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("TRUNCATE procrastinate_jobs CASCADE")
        for start in range(0, jobs, 1000):
            await noop.batch_defer_async(*[{} for _ in range(min(1000, jobs - start))])


def main() -> None:
    p = parser(__doc__, jobs=3000)
    p.add_argument("--concurrency", type=int, default=1, help="jobs at a time per worker")
    args = p.parse_args()
    with admin_database(args.dsn, f"readyq_bench_proc_{uuid.uuid4().hex[:12]}") as dsn:
        asyncio.run(_fill(dsn, 0, install=True))
        measure(
            f"Procrastinate, concurrency {args.concurrency},",
            args,
            lambda: asyncio.run(_fill(dsn, args.jobs, install=False)),
            functools.partial(_run, dsn, args.concurrency),
        )


if __name__ == "__main__":
    main()
