"""The ``readyq`` command: operate a queue from the shell.

Every subcommand takes ``--url`` (default: ``$READYQ_URL``, else ``sqlite:///readyq.db`` in
the working directory). Passwords in URLs are never printed. Extra subcommands (``readyq
sim``, ``readyq conformance``) come from installed ``readyq.commands`` entry points, so a
vendored copy of the core carries no dependency on them.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import sqlalchemy as sa

from .errors import ReadyqError
from .handlers import Handlers
from .limits import Concurrency, Limit, RateLimit
from .queue import Queue
from .worker import EXECUTORS, Worker

__all__ = ["main"]

DEFAULT_URL = "sqlite:///readyq.db"


def _url(args: argparse.Namespace) -> str:
    return str(args.url or os.environ.get("READYQ_URL") or DEFAULT_URL)


def _queue(args: argparse.Namespace) -> Queue:
    return Queue(_url(args))


def _plugins() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group="readyq.commands")}


def _load(spec: str) -> Any:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ReadyqError(f"expected module:attribute, not {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def cmd_install(args: argparse.Namespace) -> int:
    with _queue(args) as q:
        q.install()
        print(f"installed readyq tables in {q!r}")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        # The worker's events (claim, finalize, tick_error, ...) go to stderr, one per line.
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    handlers = _load(args.handlers)
    if not isinstance(handlers, (Handlers, dict)):
        raise ReadyqError(f"{args.handlers} is not a readyq.Handlers or a dict of handlers")
    limits: list[Limit] = [Concurrency(args.concurrency)]
    if args.rate:
        limits.append(RateLimit(args.rate, burst=max(1, int(args.rate))))
    with _queue(args) as q:
        worker = Worker(
            q,
            handlers,
            worker_id=args.worker_id,
            lease_ttl=args.lease_ttl,
            heartbeat_every=args.heartbeat_every,
            limits=limits,
            poll_interval=args.poll_interval,
            executor=args.executor,
        )
        print(
            f"readyq worker {worker.worker_id} on {q!r}; handlers: "
            f"{', '.join(worker.handlers.types())}",
            flush=True,
        )
        worker.run(until_idle=args.until_idle)
    return 0


def _job_dict(q: Queue, job_id: int) -> dict[str, Any]:
    info = q.get(job_id)
    out = {k: getattr(info, k) for k in info.__dataclass_fields__}
    out["state"] = info.state.value
    return {k: (v.isoformat() if isinstance(v, _dt.datetime) else v) for k, v in out.items()}


def cmd_jobs(args: argparse.Namespace) -> int:
    with _queue(args) as q:
        if args.action == "show":
            print(json.dumps(_job_dict(q, args.id), indent=2, default=list))
        elif args.action == "retry":
            print("retried" if q.retry(args.id) else "not failed or cancelled: unchanged")
        elif args.action == "cancel":
            print("cancelled" if q.cancel(args.id) else "already finished: unchanged")
        else:
            for row in q.list_jobs(state=args.state, limit=args.limit):
                print(f"{row.id:>8}  {row.state.value:<9}  {row.group:<12}  {row.type}")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    with _queue(args) as q:
        stats = q.stats()
        if args.json:
            print(json.dumps(stats, indent=2, default=str))
            return 0
        print("jobs per state: " + ", ".join(f"{k}={v}" for k, v in stats["counts"].items()))
        for g in stats["groups"]:
            print(
                f"  group {g['group']}: ready={g['ready']} running={g['running']} "
                f"weight={g['weight']:g}"
            )
        if stats["oldest_ready"]:
            print(f"oldest ready job since {stats['oldest_ready']}")
        for owner, n in stats["running_per_worker"].items():
            print(f"  worker {owner}: {n} running")
    return 0


def cmd_prune(args: argparse.Namespace) -> int:
    with _queue(args) as q:
        n = q.prune(_dt.timedelta(days=args.older_than_days))
        print(f"pruned {n} finished jobs older than {args.older_than_days:g} days")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(_url(args) if args.url else None)


def build_parser(plugins: Sequence[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="readyq", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(
        name: str, fn: Callable[[argparse.Namespace], int], help_: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--url", help=f"database URL (default $READYQ_URL or {DEFAULT_URL})")
        p.set_defaults(fn=fn)
        return p

    add("install", cmd_install, "create readyq's tables (idempotent)")
    p = add("worker", cmd_worker, "run a worker with your handlers")
    p.add_argument("--handlers", required=True, help="module:attr of a readyq.Handlers")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--rate", type=float, default=None, help="job starts per second")
    p.add_argument("--lease-ttl", type=float, default=30.0)
    p.add_argument("--heartbeat-every", type=float, default=10.0)
    p.add_argument("--poll-interval", type=float, default=1.0)
    p.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="thread",
        help="where handlers run (docs/tuning.md, 'Where handlers run')",
    )
    p.add_argument("--worker-id", default=None)
    p.add_argument("--until-idle", action="store_true", help="exit when nothing is left")
    p = add("jobs", cmd_jobs, "list, show, retry or cancel jobs")
    p.add_argument("action", choices=["list", "show", "retry", "cancel"])
    p.add_argument("id", type=int, nargs="?")
    p.add_argument("--state", default=None)
    p.add_argument("--limit", type=int, default=50)
    p = add("stats", cmd_stats, "counts per state and group, oldest ready job, workers")
    p.add_argument("--json", action="store_true")
    p = add("prune", cmd_prune, "delete finished jobs older than N days")
    p.add_argument("--older-than-days", type=float, required=True)
    add("demo", cmd_demo, "run a small weighted DAG on a temporary SQLite database")
    for name in plugins:
        sub.add_parser(name, help=f"(plugin) readyq {name} --help", add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    plugins = _plugins()
    if argv and argv[0] in plugins:
        fn = plugins[argv[0]].load()
        return int(fn(argv[1:]) or 0)
    args = build_parser(sorted(plugins)).parse_args(argv)
    if args.command == "jobs" and args.action != "list" and args.id is None:
        print(f"readyq jobs {args.action}: give a job id", file=sys.stderr)
        return 2
    try:
        return int(args.fn(args))
    except ReadyqError as exc:
        print(f"readyq: {exc}", file=sys.stderr)
        return 1
    except sa.exc.DBAPIError as exc:
        shown = sa.make_url(_url(args)).render_as_string(hide_password=True)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
        print(f"readyq: database error on {shown}: {reason}", file=sys.stderr)
        return 1
