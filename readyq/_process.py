"""``executor="process"``: each job's handler in its own process, killable on timeout.

Internal. The handler must be importable (defined at module level). In the child, the
context has the job's identity and idempotency key; heartbeats stay with the parent, which
kills the child when the lease is lost or the job times out.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .job import Lease

__all__: list[str] = []

_POLL = 0.05  # seconds between checks of the child, the kill flag and the pipe


class HandlerFailed(Exception):
    """The handler raised in its process (the original exception may not pickle)."""


@dataclass(frozen=True)
class ProcessContext:
    """What a handler running in a child process knows about its run."""

    job_id: int
    attempt: int
    token: int
    idempotency_key: str

    def heartbeat(self) -> None:
        """The parent worker heart-beats for the child; nothing to do here."""


def _child(fn: Any, ctx: ProcessContext, args: dict[str, Any], send: Connection) -> None:
    try:
        send.send(("ok", fn(ctx, args)))
    except BaseException as exc:
        send.send(("error", f"{type(exc).__name__}: {exc}"))


def run(fn: Any, lease: Lease, kill: Any) -> tuple[str, Any]:
    """Run ``fn`` for ``lease`` in a new process; kill it as soon as ``kill`` is set."""
    mp = multiprocessing.get_context("spawn")
    recv, send = mp.Pipe(duplex=False)
    ctx = ProcessContext(lease.job_id, lease.attempt, lease.token, lease.idempotency_key)
    proc = mp.Process(
        target=_child,
        args=(fn, ctx, dict(lease.args), send),
        daemon=True,
        name=f"readyq-job-{lease.job_id}",
    )
    try:
        proc.start()
    except Exception as exc:  # typically: the handler cannot be pickled
        return "error", HandlerFailed(
            f"cannot start the handler in a process ({exc}); executor='process' needs "
            "handlers defined at module level"
        )
    finally:
        send.close()
    try:
        while True:
            if recv.poll(_POLL):
                kind, value = recv.recv()
                return kind, value if kind == "ok" else HandlerFailed(value)
            if kill.is_set():
                proc.kill()
                return "error", HandlerFailed("handler process killed: timed out or lease lost")
            if not proc.is_alive() and not recv.poll(0):
                return "error", HandlerFailed(f"handler process died (exit code {proc.exitcode})")
    except EOFError:
        return "error", HandlerFailed(f"handler process died (exit code {proc.exitcode})")
    finally:
        proc.join(5)
        recv.close()
