"""Client instructions per drained job, counted by valgrind's callgrind.

Throughput on a shared 2-core machine moves by 2x from one hour to the next; the number
of instructions a process executes for the same work does not (to about 0.1 %). This
tool counts them for the client side of a drain, so that a change to the client's hot
path can be judged on a noisy day. It does not count the database server's work, nor
time spent waiting: measure those with ``readyq bench``.

    python -m readyq_bench.instructions --url postgresql+psycopg://postgres@127.0.0.1:5432/postgres

For each runner it drains N and then 3N no-op jobs (10 groups of weights 1..10) in a
fresh interpreter under callgrind, and prints ``(I(3N) - I(N)) / 2N``: start-up, imports
and connecting cancel out. Runners: ``raw`` (``finalize_and_claim`` in batches of 10),
``inline`` and ``thread`` (a fair-share ``readyq.Worker``, ``Concurrency(10)``, with that
executor). Under callgrind a process runs about 50 times slower, so a Worker's
``scan_max_age`` is raised to an hour: the counts leave out the scans a Worker makes
every 0.05 s of wall time (about one tick in 25 on PostgreSQL).

It works in a database of its own on the server the URL names (SQLite: a temporary
file) and drops it afterwards. Needs valgrind on PATH.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import readyq

from . import db, loops

__all__ = ["count", "main"]

RUNNERS = ("raw", "inline", "thread")
_COLLECTED = re.compile(r"Collected : (\d+)")


def _drain(url: str, runner: str, n: int) -> None:
    """The measured process: drain the ``n`` jobs in the table with ``runner``."""
    q = readyq.Queue(url)
    try:
        q.counts()
        loops.drain_by(q, runner, "instructions", scan_max_age=3600.0)
        done = q.counts()["done"]
    finally:
        q.close()
    if done != n:
        raise SystemExit(f"drained {done} of {n} jobs")


def _instructions(url: str, runner: str, n: int) -> int:
    db.refill_noops(url, n, groups=10)
    assert __spec__ is not None  # run with -m: the child runs this module the same way
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        __spec__.name,  # this module, as bench.instructions or installed
        "--drain",
        runner,
        "--url",
        url,
        "--jobs",
        str(n),
    ]
    root = Path(__file__).resolve().parents[1]  # ``-m bench.instructions`` imports from here
    got = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=root)  # noqa: S603 -- fixed program, our arguments
    found = _COLLECTED.search(got.stderr)
    if got.returncode != 0 or found is None:
        raise SystemExit(f"{runner}: the drain under callgrind failed:\n{got.stderr[-2000:]}")
    return int(found.group(1))


def count(url: str, runner: str, jobs: int) -> float:
    """Client instructions per job of ``runner`` draining no-op jobs at ``url``."""
    small, large = _instructions(url, runner, jobs), _instructions(url, runner, 3 * jobs)
    return (large - small) / (2 * jobs)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m readyq_bench.instructions", description=__doc__)
    p.add_argument("--url", default=None, help="database server or SQLite URL")
    p.add_argument("--jobs", type=int, default=1000, help="N (default 1000)")
    p.add_argument("--runners", default="raw,inline", help="among raw,inline,thread")
    p.add_argument("--drain", choices=RUNNERS, help=argparse.SUPPRESS)  # the child
    args = p.parse_args(argv)
    if args.drain:
        _drain(args.url, args.drain, args.jobs)
        return
    runners = [r for r in args.runners.split(",") if r]
    if not runners or any(r not in RUNNERS for r in runners) or args.jobs < 1:
        p.error(f"--runners takes some of {','.join(RUNNERS)}; --jobs a positive int")
    if shutil.which("valgrind") is None:
        p.error("needs valgrind on PATH (Debian: apt-get install valgrind)")
    with db.scratch_database(args.url) as url:
        with readyq.Queue(url) as q:
            q.install()
            server = db.server_version(url)
        got: dict[str, float] = {r: count(url, r, args.jobs) for r in runners}
    print(f"client instructions per job ({server}, N={args.jobs}):")
    for runner, per_job in got.items():
        ratio = f"  {per_job / got['raw']:.2f}x raw" if "raw" in got else ""
        print(f"  {runner:8s} {per_job:10,.0f}{ratio}")


if __name__ == "__main__":
    main()
