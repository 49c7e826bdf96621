"""A data-pipeline DAG: containers that roll up, a failure that propagates, a retry that heals.

Branch "sales": fetch x3 -> merge -> report, all inside the container "sales"; "publish"
runs after the container, so it starts only once the whole container is done.

Branch "orders": ingest -> clean -> load inside the container "orders", "notify" after it.
ingest reads an input file that is missing on the first run and has max_attempts=1, so it
fails for good: clean and load are cancelled, the container fails, notify is cancelled.
The operator then provides the file and calls ``q.retry(ingest)``: everything the failure
cancelled comes back and the branch completes.

Run: ``python examples/pipeline.py [DB_FILE]`` (default: a temporary SQLite file).
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import readyq
from readyq import JobState

handlers = readyq.Handlers()
ran: list[str] = []
_lock = threading.Lock()


def _log(what: str) -> None:
    with _lock:
        ran.append(what)
    print(f"  ran {what}", flush=True)


@handlers("fetch")
def fetch(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    _log(f"fetch {args['region']}")
    return {"region": args["region"], "rows": 100 * (1 + len(args["region"]))}


@handlers("merge")
def merge(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    _log("merge")
    return {"merged": True}


@handlers("report")
def report(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    _log("report")
    return {"pages": 3}


@handlers("publish")
def publish(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    _log(f"publish ({args['what']})")
    return {"published": args["what"]}


@handlers("ingest")
def ingest(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    _log(f"ingest {args['path']} (attempt {ctx.attempt})")
    # Raises FileNotFoundError while the input is missing: with max_attempts=1 the job
    # fails for good at once (the error text is stored with the job).
    lines = Path(args["path"]).read_text().splitlines()
    return {"orders": len(lines)}


@handlers("clean")
def clean(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    _log("clean")
    return {"clean": True}


@handlers("load")
def load(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    _log("load")
    return {"loaded": True}


def drain(q: readyq.Queue) -> None:
    readyq.Worker(
        q,
        handlers,
        limits=[readyq.Concurrency(3)],
        poll_interval=0.05,
        lease_ttl=10,
        heartbeat_every=2,
    ).run(until_idle=True)


def states(q: readyq.Queue, jobs: dict[str, int]) -> dict[str, JobState]:
    return {name: q.get(job_id).state for name, job_id in jobs.items()}


def show(title: str, q: readyq.Queue, jobs: dict[str, int]) -> None:
    print(title)
    for name, job_id in jobs.items():
        info = q.get(job_id)
        error = f"  ({info.error})" if info.error else ""
        print(f"  {name:<14} {info.state.value:<9}{error}".rstrip())


def main(db: Path, workdir: Path) -> int:
    inbox = workdir / "orders.csv"  # missing until the operator provides it
    q = readyq.Queue(f"sqlite:///{db}")
    q.install()
    with q.graph() as g:
        sales = g.add("container", {"name": "sales"}, container=True)
        fetches = [g.add("fetch", {"region": r}, parent=sales) for r in ("eu", "us", "apac")]
        merged = g.add("merge", after=fetches, parent=sales)
        rep = g.add("report", after=[merged], parent=sales)
        pub = g.add("publish", {"what": "sales report"}, after=[sales])

        orders = g.add("container", {"name": "orders"}, container=True)
        ing = g.add("ingest", {"path": str(inbox)}, parent=orders, max_attempts=1)
        cln = g.add("clean", after=[ing], parent=orders)
        lod = g.add("load", after=[cln], parent=orders)
        notify = g.add("publish", {"what": "orders loaded"}, after=[orders])
    jobs = {
        "sales": sales.id,
        "fetch eu": fetches[0].id,
        "fetch us": fetches[1].id,
        "fetch apac": fetches[2].id,
        "merge": merged.id,
        "report": rep.id,
        "publish": pub.id,
        "orders": orders.id,
        "ingest": ing.id,
        "clean": cln.id,
        "load": lod.id,
        "notify": notify.id,
    }
    print(f"enqueued {len(jobs)} jobs on {q!r}")
    print("first run:")
    drain(q)
    show("after the first run:", q, jobs)
    first = states(q, jobs)
    done, failed, cancelled = JobState.DONE, JobState.FAILED, JobState.CANCELLED
    assert all(first[n] == done for n in ("sales", "merge", "report", "publish")), first
    assert (first["ingest"], first["orders"]) == (failed, failed), first
    assert (first["clean"], first["load"], first["notify"]) == (cancelled,) * 3, first
    # publish started only after the sales container had rolled up.
    assert ran.index("publish (sales report)") > ran.index("report")
    assert "clean" not in ran
    assert "load" not in ran

    print("operator provides orders.csv and retries the failed ingest job")
    inbox.write_text("order-1\norder-2\norder-3\n")
    assert q.retry(ing.id)
    print("after retry: " + ", ".join(f"{n}={s.value}" for n, s in states(q, jobs).items()))
    print("second run:")
    drain(q)
    show("after the second run:", q, jobs)
    final = states(q, jobs)
    assert all(s == done for s in final.values()), final
    assert q.get(ing.id).result == {"orders": 3}
    print(f"pipeline ok: {len(final)} jobs done, the orders branch recovered by one retry")
    q.close()
    return 0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "pipeline.db"
        sys.exit(main(target, Path(tmp)))
