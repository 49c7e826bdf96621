"""An asyncio application enqueues with ``readyq.AsyncQueue``; a normal Worker runs the jobs.

The application side is async (``sqlite+aiosqlite://``, from the ``asyncio`` extra:
``pip install 'readyq[asyncio]'``): it enqueues ten thumbnail jobs concurrently, then a
small DAG with ``enqueue_graph``, and awaits the results. The worker side is the ordinary
synchronous ``readyq.Worker`` on the same database file, here in a thread of the same
process (in production: a ``readyq worker`` process). Both sides see one database, the only
source of truth; nothing else connects them.

Run: ``python examples/async_enqueue.py [DB_FILE]`` (default: a temporary SQLite file).
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import readyq
from readyq import JobState

# readyq.AsyncQueue is this class, loaded on first use; importing it from readyq.aio
# makes it visible to type checkers, and loads the async side (SQLAlchemy's asyncio
# extension and ORM) now, before any worker thread runs: a first import of sqlalchemy.orm
# while another thread builds SQL statements can make that thread fail with
# "partially initialized module 'sqlalchemy.orm.exc'".
from readyq.aio import AsyncQueue

handlers = readyq.Handlers()


@handlers("thumbnail")
def thumbnail(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"image": args["image"], "thumb": f"{args['image']}.thumb.png"}


@handlers("album")
def album(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"album": args["name"]}


async def wait_done(
    aq: AsyncQueue, job_ids: list[int], worker: threading.Thread, timeout: float = 30
) -> list[readyq.JobInfo]:
    """Poll until every job has finished (a web app would return the ids and poll later)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        infos = [await aq.get(j) for j in job_ids]
        if all(i.state in readyq.TERMINAL for i in infos):
            return infos
        assert worker.is_alive(), "the worker thread died (see its traceback above)"
        assert loop.time() < deadline, [i.state.value for i in infos]
        await asyncio.sleep(0.05)


async def application(db: Path, worker: threading.Thread) -> int:
    async with AsyncQueue(f"sqlite+aiosqlite:///{db}") as aq:
        await aq.install()
        images = [f"img-{i:02}.jpg" for i in range(10)]
        ids = await asyncio.gather(
            *(aq.enqueue("thumbnail", {"image": name}, group="uploads") for name in images)
        )
        print(f"enqueued {len(ids)} thumbnail jobs concurrently from async code: {ids}")

        def build(g: readyq.Graph) -> None:
            thumbs = [g.add("thumbnail", {"image": f"trip-{i}.jpg"}) for i in range(3)]
            g.add("album", {"name": "trip"}, after=thumbs)

        dag = await aq.enqueue_graph(build)
        print(f"enqueued a 4-job DAG (album after 3 thumbnails): {dag}")

        infos = await wait_done(aq, [*ids, *dag], worker)
        for info in infos:
            print(f"  job {info.id:>2} {info.type:<9} {info.state.value}: {info.result}")
        assert all(i.state == JobState.DONE for i in infos), [i.state for i in infos]
        assert infos[0].result == {"image": "img-00.jpg", "thumb": "img-00.jpg.thumb.png"}
        album_info = infos[-1]
        thumbs_done = [i.finished_at for i in infos[-4:-1]]
        assert album_info.started_at is not None
        assert all(t is not None and t <= album_info.started_at for t in thumbs_done)
        counts = await aq.counts()
        print("counts: " + ", ".join(f"{k}={v}" for k, v in counts.items() if v))
        assert counts["done"] == len(ids) + len(dag)
    return 0


def main(db: Path) -> int:
    # Create the tables first, so that the worker can start before the application.
    with readyq.Queue(f"sqlite:///{db}") as q:
        q.install()
        worker = readyq.Worker(
            q, handlers, poll_interval=0.05, lease_ttl=10, heartbeat_every=2, grace=5
        )
        thread = threading.Thread(target=worker.run, name="worker")
        thread.start()
        try:
            rc = asyncio.run(application(db, thread))
        finally:
            worker.stop()
            thread.join(30)
        assert not thread.is_alive()
    print("async enqueue ok: enqueued from asyncio, drained by a Worker")
    return rc


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tmp) / "async.db"))
