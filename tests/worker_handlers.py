"""Handlers used by worker tests that run in other processes (importable by module name)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import readyq

handlers = readyq.Handlers()

#: The environment of a `readyq worker` subprocess that can import this module.
ENV = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}


def worker_command(url: str, *options: str) -> list[str]:
    """`readyq worker` on ``url`` with these handlers, polling every 0.05 s, plus options."""
    return [
        sys.executable, "-m", "readyq", "worker", "--url", url,
        "--handlers", "worker_handlers:handlers", "--poll-interval", "0.05", *options,
    ]  # fmt: skip


@handlers("echo")
def echo(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"echo": args, "attempt": ctx.attempt}


@handlers("stall-first")
def stall_first(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    """Hangs on the first attempt (long enough to be killed), succeeds on the next."""
    if ctx.attempt == 1:
        time.sleep(args.get("stall", 120))
    return {"attempt": ctx.attempt}


@handlers("pid-then-hang")
def pid_then_hang(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    """Writes its process id to args['path'], then hangs."""
    with open(args["path"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
    return {}


@handlers("in-process")
def in_process(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return {"pid": os.getpid(), "key": ctx.idempotency_key}


@handlers("thread-name")
def thread_name(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return {"thread": threading.current_thread().name, "pid": os.getpid()}
