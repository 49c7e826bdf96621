"""PostgreSQL server time per drained job, statement by statement, from the server's log.

``readyq bench`` gives the server's CPU per job as one figure; this tool says which
statements it goes to, and how much of each is planning. It drains N no-op jobs (10
groups of weights 1..10, ``Concurrency(10)``) in a database of its own with
``log_min_duration_statement = 0`` set on that database only, then reads the lines the
drain added to the server's log and sums each statement's ``parse``, ``bind`` (where
PostgreSQL plans) and ``execute`` durations, per job:

    python -m readyq_bench.serverlog --url postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        --log /var/log/postgresql/postgresql-15-main.log --runners raw,inline --procs 1

It needs a server on this machine whose log file it can read (``log_destination =
stderr`` to a file, or ``logging_collector``), and a role that may ``ALTER DATABASE ...
SET``. Durations are wall time inside the server: with more processes than cores they
include waiting for a core, so compare counts there, and times at ``--procs 1``.
Runners: ``raw`` (``finalize_and_claim`` in batches of 10), ``inline`` and ``thread`` (a
fair-share ``readyq.Worker`` with that executor).
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

import readyq

from . import db, loops

__all__ = ["Line", "main", "parse", "summarize"]

RUNNERS = ("raw", "inline", "thread")
#: One logged duration: ``duration: 0.123 ms  bind <unnamed>: SELECT ...`` (extended
#: protocol) or ``duration: 0.123 ms  statement: COMMIT`` (simple protocol).
_LINE = re.compile(r"duration: ([\d.]+) ms  (parse|bind|execute|statement)(?: [^:]*)?: (.*)")


@dataclass(frozen=True)
class Line:
    """Total time and count of one (phase, statement) among the logged durations."""

    phase: str
    statement: str
    ms: float
    count: int


def parse(text: str, width: int = 100) -> list[Line]:
    """The durations in ``text`` summed per phase and statement (its first ``width``
    characters, whitespace folded), the costliest first."""
    total: dict[tuple[str, str], float] = defaultdict(float)
    count: dict[tuple[str, str], int] = defaultdict(int)
    for found in _LINE.finditer(text):
        ms, phase, sql = found.groups()
        key = (phase, " ".join(sql.split())[:width])
        total[key] += float(ms)
        count[key] += 1
    lines = [Line(p, s, ms, count[p, s]) for (p, s), ms in total.items()]
    return sorted(lines, key=lambda line: -line.ms)


def summarize(lines: Iterable[Line], jobs: int, top: int = 16) -> str:
    """A table of microseconds per job, calls per job and microseconds per call."""
    lines = list(lines)
    logged = sum(line.ms for line in lines)
    out = [f"  {logged / jobs * 1000:.1f} us of logged server time per job"]
    out.append("   us/job   calls/job  us/call  phase      statement")
    for line in lines[:top]:
        us, calls, per_call = line.ms / jobs * 1000, line.count / jobs, line.ms / line.count * 1000
        out.append(f"  {us:7.1f}  {calls:9.3f}  {per_call:7.1f}  {line.phase:9s}  {line.statement}")
    return "\n".join(out)


def _drain(url: str, runner: str, worker_id: str, scan_max_age: float | None) -> None:
    q = readyq.Queue(url)
    try:
        loops.drain_by(q, runner, worker_id, poll_interval=0.005, scan_max_age=scan_max_age)
    finally:
        q.close()


def _set_logging(url: str, on: bool) -> None:
    name = sa.make_url(url).database
    # ALTER DATABASE takes no bound parameters: the name is the bench's own, checked.
    if not name or not db._SAFE.fullmatch(name):
        raise SystemExit(f"not a bench database: {name!r}")
    engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            setting = "SET log_min_duration_statement = 0" if on else "RESET ALL"
            conn.exec_driver_sql(f'ALTER DATABASE "{name}" {setting}')
    finally:
        engine.dispose()


def measure(
    url: str, log: Path, runner: str, jobs: int, procs: int, *, scan_max_age: float | None = None
) -> list[Line]:
    """Drain ``jobs`` no-op jobs with ``procs`` processes of ``runner`` at ``url`` (a
    bench database; Workers with ``scan_max_age``, None: the default) and parse what the
    drain added to ``log``."""
    db.refill_noops(url, jobs, groups=10)
    _set_logging(url, True)  # new sessions of this database only
    start = log.stat().st_size
    try:
        ctx = multiprocessing.get_context("spawn")
        children = [
            ctx.Process(target=_drain, args=(url, runner, f"w{i}", scan_max_age))
            for i in range(procs)
        ]
        for child in children:
            child.start()
        for child in children:
            child.join()
    finally:
        _set_logging(url, False)
    with log.open(errors="replace") as f:
        f.seek(start)
        return parse(f.read())


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m readyq_bench.serverlog", description=__doc__)
    p.add_argument("--url", required=True, help="a PostgreSQL server on this machine")
    p.add_argument("--log", required=True, type=Path, help="the server's log file")
    p.add_argument("--jobs", type=int, default=3000, help="jobs per drain (default 3000)")
    p.add_argument("--procs", type=int, default=1, help="draining processes (default 1)")
    p.add_argument("--runners", default="raw,inline", help="among raw,inline,thread")
    p.add_argument(
        "--scan-max-age", type=float, help="the Workers' scan_max_age (default: the Worker's)"
    )
    args = p.parse_args(argv)
    runners = [r for r in args.runners.split(",") if r]
    if not runners or any(r not in RUNNERS for r in runners) or args.jobs < 1 or args.procs < 1:
        p.error(f"--runners takes some of {','.join(RUNNERS)}; --jobs and --procs positive")
    if not args.log.is_file():
        p.error(f"--log {args.log}: no such file (the server's log, e.g. /var/log/postgresql/)")
    with db.scratch_database(args.url) as url:
        if db.backend_name(url) != "postgresql":
            p.error("reads PostgreSQL's duration log: give a postgresql URL")
        with readyq.Queue(url) as q:
            q.install()
        for runner in runners:
            lines = measure(
                url, args.log, runner, args.jobs, args.procs, scan_max_age=args.scan_max_age
            )
            print(f"{runner} x{args.procs}, {args.jobs} jobs:")
            print(summarize(lines, args.jobs))


if __name__ == "__main__":
    main()
