"""Crash recovery: a worker is killed mid-job; after its lease expires another one finishes.

1. Enqueue one long job ("render", about 3 s of work in small steps: longer than the
   lease TTL, so it also shows that a live worker's heartbeats keep the lease).
2. Start worker-1 as a separate process: ``python -m readyq worker --handlers
   crash_recovery:handlers --lease-ttl 2 ...`` (this file is the handlers module).
3. As soon as the job is running, kill worker-1 with SIGKILL: no cleanup, no release;
   the job stays ``running`` under worker-1's lease.
4. Start worker-2. Its sweeper reclaims the job once the lease has expired (2 s without a
   heartbeat), claims it with a new lease token, and finishes it: attempt 2. Its run
   outlasts the 2 s TTL without being reclaimed, because worker-2 heart-beats.

Run: ``python examples/crash_recovery.py [DB_FILE]`` (default: a temporary SQLite file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import readyq
from readyq import JobState

LEASE_TTL = 2.0
HERE = Path(__file__).resolve().parent
handlers = readyq.Handlers()


@handlers("render")
def render(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    for _ in range(args["steps"]):
        if ctx.lost.is_set():  # lease gone or worker stopping: stop working
            raise RuntimeError(f"stopped: {ctx.reason}")
        time.sleep(0.1)
    return {"frames": args["steps"], "attempt": ctx.attempt, "pid": os.getpid()}


def start_worker(url: str, name: str) -> subprocess.Popen[str]:
    path = [str(HERE), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    command = [
        sys.executable,
        "-m",
        "readyq",
        "worker",
        "--url",
        url,
        "--handlers",
        "crash_recovery:handlers",
        "--worker-id",
        name,
        "--lease-ttl",
        str(LEASE_TTL),
        "--heartbeat-every",
        "0.5",
        "--poll-interval",
        "0.1",
        "--until-idle",
    ]
    return subprocess.Popen(command, env=env, text=True)  # noqa: S603 -- our own interpreter


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def main(db: Path) -> int:
    url = f"sqlite:///{db}"
    q = readyq.Queue(url)
    q.install()
    job = q.enqueue("render", {"steps": 30}, max_attempts=3)
    print(f"enqueued render job {job} on {q!r}")

    started: list[subprocess.Popen[str]] = []
    try:
        first = start_worker(url, "worker-1")
        started.append(first)
        wait_for("worker-1 to start the job", lambda: q.get(job).state == JobState.RUNNING)
        time.sleep(0.3)  # a few heartbeats into the job
        info = q.get(job)
        print(f"job {job} is {info.state.value} under {info.lease_owner}, token {info.lease_token}")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed_at = time.monotonic()
        dead = q.get(job)
        assert dead.state == JobState.RUNNING
        assert dead.lease_owner == "worker-1"
        assert dead.lease_expires_at is not None
        expires = f"{dead.lease_expires_at:%H:%M:%S.%f}"[:-3]
        print(f"killed worker-1 (SIGKILL); job {job} is still running, lease until {expires} UTC")

        second = start_worker(url, "worker-2")
        started.append(second)
        assert second.wait(60) == 0
        recovered = time.monotonic() - killed_at
        info = q.get(job)
        print(
            f"job {job} is {info.state.value} after {recovered:.1f}s: attempts={info.attempts}, "
            f"token={info.lease_token}, result={info.result}"
        )
        assert info.state == JobState.DONE, info
        assert info.attempts == 2
        assert info.result is not None
        assert info.result["attempt"] == 2
        assert info.result["pid"] == second.pid != first.pid
        # worker-2 claimed the job only after worker-1's lease had expired.
        assert info.started_at is not None
        assert info.started_at >= dead.lease_expires_at
        assert info.finished_at is not None
        took = (info.finished_at - info.started_at).total_seconds()
        claimed = f"{info.started_at:%H:%M:%S.%f}"[:-3]
        print(f"worker-2 claimed it at {claimed} UTC, after the expiry")
        print(f"its run took {took:.1f}s, longer than the {LEASE_TTL:g}s TTL: heartbeats kept it")
        assert took > LEASE_TTL  # and attempts == 2: nobody reclaimed the live run
        print("crash recovery ok: worker-2 finished the job worker-1 was killed in")
    finally:
        for proc in started:  # never leave a worker behind, whatever happened
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    q.close()
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "crash.db"))
