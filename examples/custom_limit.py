"""A user-written limit: jobs share a pool of GPU memory, which is never oversubscribed.

``readyq.Limit`` has one method that matters, ``available(now)``: how many more jobs may
start. ``acquire(lease, now)`` and ``release(lease, now)`` are called exactly once per job
started and ended, so a limit that counts holders stays exact. The worker starts jobs only
while every limit says yes; here the GPU pool is the binding limit, not the worker's
``Concurrency``.

A limit answers "how many", before the jobs are claimed, so it cannot see their sizes:
``available`` assumes each next job needs the largest size the application allows
(MAX_JOB_GB), and ``acquire`` books what the claimed job really asks for.

Run: ``python examples/custom_limit.py [DB_FILE]`` (default: a temporary SQLite file).
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import readyq

TOTAL_GB = 24
MAX_JOB_GB = 8  # the application refuses larger jobs at enqueue
SIZES = [8, 4, 2, 8, 2, 4, 6, 2, 8, 4, 2, 6, 4, 2, 2, 8]


class GpuMemory(readyq.Limit):
    """A pool of GPU memory: a job books ``args["gpu_gb"]`` from start to end."""

    def __init__(self, total_gb: int, largest_job_gb: int) -> None:
        self.total = total_gb
        self.largest = largest_job_gb
        self.booked = 0
        self.peak = 0
        self._lock = threading.Lock()

    def available(self, now: float) -> int:
        with self._lock:
            return (self.total - self.booked) // self.largest

    def acquire(self, lease: readyq.Lease, now: float) -> None:
        with self._lock:
            self.booked += lease.args["gpu_gb"]
            self.peak = max(self.peak, self.booked)

    def release(self, lease: readyq.Lease, now: float) -> None:
        with self._lock:
            self.booked -= lease.args["gpu_gb"]


# What the handlers really hold, measured on their side, independently of the limit.
in_use = {"now": 0, "peak": 0, "jobs": 0, "most_jobs": 0}
_lock = threading.Lock()
handlers = readyq.Handlers()


@handlers("train")
def train(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    gb = args["gpu_gb"]
    with _lock:
        in_use["now"] += gb
        in_use["jobs"] += 1
        in_use["peak"] = max(in_use["peak"], in_use["now"])
        in_use["most_jobs"] = max(in_use["most_jobs"], in_use["jobs"])
        print(f"  start job {ctx.job_id:>2} ({gb} GB): {in_use['now']:>2}/{TOTAL_GB} GB in use")
    time.sleep(0.05 + gb / 100)  # "training"
    with _lock:
        in_use["now"] -= gb
        in_use["jobs"] -= 1
    return {"gpu_gb": gb}


def main(db: Path) -> int:
    q = readyq.Queue(f"sqlite:///{db}")
    q.install()
    with q.graph() as g:
        for gb in SIZES:
            assert gb <= MAX_JOB_GB
            g.add("train", {"gpu_gb": gb})
    print(f"{len(SIZES)} training jobs of 2-8 GB on a {TOTAL_GB} GB GPU")
    gpu = GpuMemory(TOTAL_GB, MAX_JOB_GB)
    readyq.Worker(
        q,
        handlers,
        limits=[readyq.Concurrency(16), gpu],
        poll_interval=0.01,
        lease_ttl=10,
        heartbeat_every=2,
    ).run(until_idle=True)
    counts = q.counts()
    print(
        f"done: {counts['done']}/{len(SIZES)}; peak {in_use['peak']}/{TOTAL_GB} GB, "
        f"at most {in_use['most_jobs']} jobs at once (the limit booked {gpu.peak} GB at peak)"
    )
    assert counts["done"] == len(SIZES), counts
    assert in_use["peak"] <= TOTAL_GB, in_use
    assert gpu.peak <= TOTAL_GB, gpu.peak
    assert gpu.booked == 0, "every acquire had its release"
    assert in_use["most_jobs"] >= 2, "the pool should let several jobs run together"
    print("custom limit ok: GPU memory never exceeded")
    q.close()
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "gpu.db"))
