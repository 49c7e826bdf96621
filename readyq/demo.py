"""``readyq demo``: a small DAG across weighted groups, run to completion, printed."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path
from typing import Any

from .handlers import Handlers, JobContext
from .limits import Concurrency
from .queue import Queue
from .worker import Worker

__all__ = ["run_demo"]


def run_demo(url: str | None = None) -> int:
    """Enqueue a fetch -> train -> report pipeline for three tenants and run it."""
    with tempfile.TemporaryDirectory() as tmp:
        target = url or f"sqlite:///{Path(tmp) / 'demo.db'}"
        q = Queue(target)
        q.install()
        lines: list[str] = []
        lock = threading.Lock()
        handlers = Handlers()

        def step(ctx: JobContext, args: dict[str, Any]) -> dict[str, Any]:
            with lock:
                lines.append(f"  ran job {ctx.job_id:>3} {args['name']:<22} attempt {ctx.attempt}")
            return {"ok": args["name"]}

        for kind in ("fetch", "train", "report"):
            handlers.add(kind, step)
        with q.graph() as g:
            for tenant, weight in (("alpha", 1), ("beta", 2), ("gamma", 5)):
                box = g.add(
                    "pipeline", {"name": tenant}, group=tenant, weight=weight, container=True
                )
                fetches = [
                    g.add(
                        "fetch",
                        {"name": f"{tenant}/fetch-{i}"},
                        group=tenant,
                        weight=weight,
                        parent=box,
                    )
                    for i in range(3)
                ]
                train = g.add(
                    "train",
                    {"name": f"{tenant}/train"},
                    group=tenant,
                    weight=weight,
                    after=fetches,
                    parent=box,
                )
                g.add(
                    "report",
                    {"name": f"{tenant}/report"},
                    group=tenant,
                    weight=weight,
                    after=[train],
                )
        print(f"readyq demo on {q!r}: 3 tenants (weights 1, 2, 5), 18 jobs")
        worker = Worker(
            q,
            handlers,
            limits=[Concurrency(2)],
            poll_interval=0.05,
            lease_ttl=10,
            heartbeat_every=2,
        )
        worker.run(until_idle=True)
        print("\n".join(lines))
        counts = q.counts()
        print("final: " + ", ".join(f"{k}={v}" for k, v in counts.items() if v))
        q.close()
        return 0 if counts["done"] == sum(counts.values()) else 1
