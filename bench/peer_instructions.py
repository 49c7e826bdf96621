"""PGQueuer's client instructions per drained job, counted by valgrind's callgrind: the
peer's figure for ``python -m readyq_bench.instructions`` (same method: drain N and then
3N no-op jobs in one fresh process under callgrind and print ``(I(3N) - I(N)) / 2N``, so
start-up, imports and connecting cancel out).

A manual tool like ``peer_pgqueuer.py``, whose drain it runs (one process, asyncpg,
``batch_size=10``); run it from PGQueuer's virtualenv, with valgrind on PATH::

    /tmp/pgq/bin/python bench/peer_instructions.py --jobs 1000

It creates its own database ``readyq_bench_pgqi_<hex>`` and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import uuid
from pathlib import Path

import peer_pgqueuer  # bench/ is sys.path[0]
from peer_common import admin_database, fresh

_COLLECTED = re.compile(r"Collected : (\d+)")


def _instructions(dsn: str, jobs: int) -> int:
    asyncio.run(peer_pgqueuer._fill(dsn, jobs, True))
    here = str(Path(__file__).resolve())
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [sys.executable, here, "--drain", "--dsn", dsn, "--jobs", str(jobs)]
    got = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603 -- fixed program, our arguments
    found = _COLLECTED.search(got.stderr)
    if got.returncode != 0 or found is None:
        raise SystemExit(f"the drain under callgrind failed:\n{got.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    p.add_argument("--jobs", type=int, default=1000, help="N (default 1000)")
    p.add_argument("--drain", action="store_true", help=argparse.SUPPRESS)  # the child
    args = p.parse_args()
    if args.drain:
        seen = fresh()
        peer_pgqueuer._run(args.dsn, seen, lambda: None)
        if seen["n"] != args.jobs:
            raise SystemExit(f"PGQueuer ran {seen['n']:.0f} of {args.jobs} jobs")
        return
    with admin_database(args.dsn, f"readyq_bench_pgqi_{uuid.uuid4().hex[:12]}") as dsn:
        cmd = [sys.executable, "-m", "pgqueuer", "--pg-dsn", dsn, "install"]
        subprocess.run(cmd, check=True, capture_output=True)  # noqa: S603 -- this interpreter, fixed arguments
        small, large = _instructions(dsn, args.jobs), _instructions(dsn, 3 * args.jobs)
    per_job = (large - small) / (2 * args.jobs)
    print(f"PGQueuer client instructions per job (N={args.jobs}): {per_job:,.0f}")


if __name__ == "__main__":
    main()
