"""Handlers used by worker tests that run in other processes (importable by module name)."""

from __future__ import annotations

import time
from typing import Any

import readyq

handlers = readyq.Handlers()


@handlers("echo")
def echo(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"echo": args, "attempt": ctx.attempt}


@handlers("stall-first")
def stall_first(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    """Hangs on the first attempt (long enough to be killed), succeeds on the next."""
    if ctx.attempt == 1:
        time.sleep(args.get("stall", 120))
    return {"attempt": ctx.attempt}
