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
end. jobs/s counts from the first handler start to the last, and (the second figure) to
the moment the last process's ``QueueManager.run`` returned, its buffered completions
committed: the window ``readyq bench`` gives a Worker, first claim to last finalize
(slightly longer: it also holds PGQueuer's own finding that the queue is empty, which
the Worker's window leaves out).
Median of ``--repeat`` runs after a warm-up; ``--analyze`` runs ANALYZE after each fill,
as ``readyq bench`` does by default.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import uuid
from typing import Any

from peer_common import admin_database, finished, mark, measure, parser  # bench/ is sys.path[0]

try:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.domain.types import QueueExecutionMode
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
except ImportError as exc:  # a manual tool: say how to get what it needs
    raise SystemExit(f"needs PGQueuer 1.6 and asyncpg ({exc}): see this file's docstring") from None


async def _drain(dsn: str, seen: dict[str, float], ready: Any) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job: Any) -> None:
        mark(seen)

    ready()
    await qm.run(batch_size=10, mode=QueueExecutionMode.drain)
    finished(seen)  # run() returns once its completion buffer is flushed
    await conn.close()


def _run(dsn: str, seen: dict[str, float], ready: Any) -> None:
    asyncio.run(_drain(dsn, seen, ready))


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


def main() -> None:
    p = parser(__doc__, jobs=5000)
    p.add_argument("--analyze", action="store_true", help="ANALYZE after each fill")
    args = p.parse_args()
    with admin_database(args.dsn, f"readyq_bench_pgq_{uuid.uuid4().hex[:12]}") as dsn:
        cmd = [sys.executable, "-m", "pgqueuer", "--pg-dsn", dsn, "install"]
        subprocess.run(cmd, check=True, capture_output=True)  # noqa: S603 -- this interpreter, fixed arguments
        measure(
            "PGQueuer, batch 10,",
            args,
            lambda: asyncio.run(_fill(dsn, args.jobs, args.analyze)),
            functools.partial(_run, dsn),
        )


if __name__ == "__main__":
    main()
