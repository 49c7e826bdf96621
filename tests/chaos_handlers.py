"""Handlers for the chaos test's `readyq worker` processes (tests/test_chaos.py).

Every execution is recorded in a side table, ``chaos_exec``, through this module's own
SQLAlchemy engine (``CHAOS_SIDE_URL``): one row when the handler starts (job id, lease
token, the lease's expiry as claimed, process id, wall time). The handler's result
carries its token and process id, so the job row says which execution finalized it.

The worker's own events (claim, finalize, lease_lost, ...) go, one JSON line each, to a
file per process in ``CHAOS_EVENTS_DIR``: a SIGKILL loses at most the line being written.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

import readyq

handlers = readyq.Handlers()

#: The workload: per batch one container holding CHAINS chains of CHAIN_LEN jobs and a
#: fan-in job after every chain's tail, plus FREE jobs outside it, some waiting on the
#: previous batch (its container and its free jobs). Batches rotate over weighted groups.
GROUPS = (("light", 1.0), ("medium", 2.0), ("heavy", 4.0))
CHAINS, CHAIN_LEN, FREE = 3, 4, 6
CONTAINERS_PER_BATCH = 1
JOBS_PER_BATCH = CONTAINERS_PER_BATCH + CHAINS * CHAIN_LEN + 1 + FREE
#: High enough that kills, stops and cuts never exhaust a job: every job must end done.
MAX_ATTEMPTS = 100

side = sa.MetaData()
executions = sa.Table(
    "chaos_exec",
    side,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("token", sa.BigInteger, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    # The lease's expiry as claimed (claim time + ttl): when the lease could first lapse.
    sa.Column("lease_expires_us", sa.BigInteger, nullable=False),
    sa.Column("started", sa.Float(precision=53), nullable=False),
)

_engine: sa.Engine | None = None


def side_engine(url: str) -> sa.Engine:
    """An engine on the side table's database that survives cut connections."""
    if url.startswith("sqlite"):
        return sa.create_engine(url, connect_args={"timeout": 60})
    return sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=4)


def _side() -> sa.Engine:
    global _engine  # noqa: PLW0603 -- one engine per worker process, made on first use
    if _engine is None:
        _engine = side_engine(os.environ["CHAOS_SIDE_URL"])
    return _engine


def _retrying(fn: Any) -> Any:
    """Run ``fn(conn)`` in a transaction; a cut connection or a busy file is retried."""
    for attempt in range(40):
        try:
            with _side().begin() as conn:
                return fn(conn)
        except sa.exc.DBAPIError:
            if attempt == 39:
                raise
            time.sleep(0.05 + 0.01 * attempt)
    return None  # pragma: no cover


@handlers("work")
def work(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    """Record the execution (one commit), then sleep a few milliseconds."""
    started = time.time()
    _retrying(
        lambda conn: conn.execute(
            executions.insert().values(
                job_id=ctx.job_id,
                token=ctx.token,
                pid=os.getpid(),
                lease_expires_us=ctx.lease.expires_us,
                started=started,
            )
        )
    )
    time.sleep(args.get("ms", 5) / 1000)
    return {"token": ctx.token, "pid": os.getpid(), "n": args.get("n")}


class _EventLines(logging.Handler):
    """readyq's worker events as JSON lines, one unbuffered write each."""

    def __init__(self, path: str) -> None:
        super().__init__(logging.INFO)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "readyq_event", None)
        if event is None:
            return
        fields = {k: v for k, v in getattr(record, "readyq", {}).items() if k != "worker"}
        line = json.dumps({"t": time.time(), "pid": os.getpid(), "event": event, **fields})
        os.write(self._fd, (line + "\n").encode())


if os.environ.get("CHAOS_EVENTS_DIR"):
    # SIGUSR1 dumps every thread's stack into the worker's log (a worker that hangs).
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _log = logging.getLogger("readyq")
    _log.setLevel(logging.INFO)
    _log.addHandler(
        _EventLines(os.path.join(os.environ["CHAOS_EVENTS_DIR"], f"{os.getpid()}.jsonl"))
    )


def add_batch(g: readyq.Graph, b: int, previous: Sequence[int]) -> list[readyq.JobHandle]:
    """Add batch ``b`` to ``g``; returns the handles the next batch may wait on."""
    group, weight = GROUPS[b % len(GROUPS)]
    common: dict[str, Any] = {"group": group, "weight": weight, "max_attempts": MAX_ATTEMPTS}
    box = g.add("box", container=True, key=f"chaos:{b}:box", **common)
    tails = []
    for chain in range(CHAINS):
        prev: list[readyq.JobHandle] = []
        for step in range(CHAIN_LEN):
            h = g.add(
                "work",
                {"n": f"{b}.{chain}.{step}"},
                after=prev,
                parent=box,
                key=f"chaos:{b}:{chain}:{step}",
                **common,
            )
            prev = [h]
        tails += prev
    g.add("work", {"n": f"{b}.fanin"}, after=tails, parent=box, key=f"chaos:{b}:fanin", **common)
    free = []
    for i in range(FREE):
        after = [previous[i % len(previous)]] if previous and i % 2 == 0 else []
        free.append(
            g.add("work", {"n": f"{b}.free.{i}"}, after=after, key=f"chaos:{b}:free:{i}", **common)
        )
    return [box, *free]


def enqueue_main(url: str, batches: int, pause: float) -> None:
    """The enqueuer process: one graph per batch, retried (idempotently, by key) on errors."""
    q = readyq.Queue(url)
    previous: list[int] = []
    for b in range(batches):
        for attempt in range(200):
            g = q.graph()
            handles = add_batch(g, b, previous)
            try:
                g.commit()
                break
            except sa.exc.DBAPIError as exc:
                print(f"batch {b} attempt {attempt}: {str(exc).splitlines()[0]}", flush=True)
                time.sleep(0.1)
        else:
            raise SystemExit(f"batch {b} could not be enqueued")
        previous = [h.id for h in handles]
        time.sleep(pause)
    q.close()
    print(f"enqueued {batches} batches", flush=True)


if __name__ == "__main__":
    enqueue_main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
