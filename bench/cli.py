"""``readyq bench``: throughput, latency and scaling, each beside the machine's own limit.

Runs in a database of its own (created on the server the URL names, dropped afterwards;
SQLite: a temporary file), so it can be pointed at a shared server safely.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

import readyq

from . import db
from .config import Config
from .report import render
from .runner import Clients
from .sections import Bench

__all__ = ["main", "run"]

SECTIONS = ("reference", "enqueue", "drain", "latency", "scaling", "backlog", "write_cost")


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints, not {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive ints, not {text!r}")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="readyq bench",
        description="Measure readyq against the simplest durable write on the same database.",
    )
    p.add_argument("--url", help="database server or SQLite URL (default: a temporary SQLite)")
    p.add_argument("--quick", action="store_true", help="tiny sizes: a CI smoke of seconds")
    p.add_argument("--repeat", type=int, help="repetitions per figure (default 3; quick 1)")
    p.add_argument("--jobs", type=int, help="jobs per drain measurement (default 2000)")
    p.add_argument("--workers", type=_ints, help="drain worker counts (default 1,4,8,32)")
    p.add_argument(
        "--fair-workers", type=_ints, help="readyq.Worker counts of the drain (default 1,8)"
    )
    p.add_argument("--limits", type=_ints, help="claim limits of the raw drain (default 1,10)")
    p.add_argument("--modes", help="thread,process (default both)")
    p.add_argument("--finished", type=_ints, help="finished-row sizes (default 1000,100000,1M)")
    p.add_argument("--blocked", type=_ints, help="blocked-row sizes (default 100000)")
    p.add_argument(
        "--deferred", type=_ints, help="deferred ready-row sizes, more urgent (default 100000)"
    )
    p.add_argument(
        "--backlog", type=_ints, help="ready backlogs of the Worker tick (default 1000,100000)"
    )
    p.add_argument(
        "--no-analyze",
        action="store_true",
        help="drain tables the planner has no statistics for (default: ANALYZE after filling)",
    )
    p.add_argument(
        "--scan-max-age",
        type=float,
        metavar="SECONDS",
        help="the Workers' scan_max_age (default: the Worker's; 0 scans on every tick)",
    )
    p.add_argument(
        "--executors", help="the fair-share Workers' executors: thread,inline (default both)"
    )
    p.add_argument("--profile", action="store_true", help="also cProfile the single-worker drain")
    p.add_argument("--only", help=f"comma-separated sections among {','.join(SECTIONS)}")
    p.add_argument("--json", metavar="PATH", help="write the full result as JSON")
    return p


def config_from(args: argparse.Namespace) -> Config:
    cfg = Config.quick_defaults() if args.quick else Config()
    cfg.url = args.url
    if args.repeat is not None:
        cfg.repeat = max(1, args.repeat)
    if args.jobs is not None:
        cfg.jobs = max(1, args.jobs)
    if args.workers:
        cfg.workers = args.workers
        cfg.process_workers = None
    if args.fair_workers:
        cfg.fair_workers = args.fair_workers
        cfg.fair_process_workers = None
    if args.limits:
        cfg.limits = args.limits
    if args.modes:
        cfg.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not set(cfg.modes) <= {"thread", "process"}:
            raise SystemExit("--modes takes thread, process or both")
    if args.executors:
        cfg.fair_executors = [e.strip() for e in args.executors.split(",") if e.strip()]
        if not cfg.fair_executors or not set(cfg.fair_executors) <= {"thread", "inline"}:
            raise SystemExit("--executors takes thread, inline or both")
    if args.finished:
        cfg.finished_sizes = sorted(args.finished)
    if args.blocked:
        cfg.blocked_sizes = sorted(args.blocked)
    if args.deferred:
        cfg.deferred_sizes = sorted(args.deferred)
    if args.backlog:
        cfg.backlog_sizes = sorted(args.backlog)
    cfg.profile = args.profile
    cfg.analyze = not args.no_analyze
    if args.scan_max_age is not None:
        if not args.scan_max_age >= 0:
            raise SystemExit("--scan-max-age takes a number of seconds >= 0")
        cfg.scan_max_age = args.scan_max_age
    return cfg


def _log(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _driver(url: str) -> str:
    parsed = sa.make_url(url)
    name = parsed.get_driver_name()
    module = {"pysqlite": "sqlite3"}.get(name, name)
    try:
        mod = __import__(module)
        version = getattr(mod, "__version__", None) or getattr(mod, "sqlite_version", "?")
    except ImportError:
        version = "?"
    return f"{name} {version}"


def run(cfg: Config, sections: Sequence[str] = SECTIONS, log: Any = _log) -> dict[str, Any]:
    """Run the bench in a scratch database and return the result dict."""
    started = time.perf_counter()
    result: dict[str, Any] = {}
    with db.scratch_database(cfg.url) as url:
        log(f"scratch database: {sa.make_url(url).render_as_string(hide_password=True)}")
        result["meta"] = {
            "backend": db.backend_name(url),
            "database": sa.make_url(url).database,
            "server": db.server_version(url),
            "driver": _driver(url),
            "readyq": readyq.__version__,
            "sqlalchemy": sa.__version__,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "config": cfg.as_dict(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        needs_processes = "process" in cfg.modes  # the reference always runs
        clients = Clients(max(cfg.client_counts("process")) if needs_processes else 1)
        try:
            bench = Bench(cfg, url, clients, log)
            # Every ratio divides by the reference measured in this same run.
            timings: dict[str, float] = {}
            todo = [s for s in SECTIONS if s == "reference" or s in sections]
            for name in [*todo, *(["profile"] if cfg.profile else [])]:
                t = time.perf_counter()
                result[name] = getattr(bench, name)()
                timings[name] = time.perf_counter() - t
                log(f"{name} took {timings[name]:.1f} s")
            result["meta"]["section_s"] = timings
        finally:
            clients.close()
    result["meta"]["elapsed_s"] = time.perf_counter() - started
    return result


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_from(args)
    sections = SECTIONS if not args.only else tuple(s.strip() for s in args.only.split(","))
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"unknown section(s) {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    result = run(cfg, sections)
    print(render(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=2, sort_keys=False)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
