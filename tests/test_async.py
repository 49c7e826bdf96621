"""AsyncQueue: the same semantics through async drivers (psycopg async, aiosqlite, aiomysql)."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

import readyq
from readyq import JobState, LeaseLost

pytestmark = pytest.mark.backend
ASYNC_DRIVER = {
    "sqlite": "sqlite+aiosqlite",
    "postgresql": "postgresql+psycopg",
    "mariadb": "mysql+aiomysql",
    "mysql": "mysql+aiomysql",
}


@pytest.fixture
def async_url(queue_url: str, backend) -> str:  # type: ignore[no-untyped-def]
    return str(sa.make_url(queue_url).set(drivername=ASYNC_DRIVER[backend.name]))


def test_async_queue_runs_a_job_through_the_async_driver(async_url: str) -> None:
    """Enqueue, claim, heartbeat and finalize from async code; the result is stored."""

    async def main() -> readyq.JobInfo:
        async with readyq.AsyncQueue(async_url) as q:
            assert q.engine.dialect.is_async
            job = await q.enqueue("t", {"x": 1})
            lease = (await q.claim("w"))[0]
            await q.heartbeat(lease)
            await q.finalize(lease, {"ok": True})
            return await q.get(job)

    info = asyncio.run(main())
    assert (info.state, info.result) == (JobState.DONE, {"ok": True})


def test_async_graph_promotes_dependents(async_url: str) -> None:
    """A DAG enqueued from async code runs in dependency order."""

    async def main() -> list[str]:
        async with readyq.AsyncQueue(async_url) as q:

            def build(g):  # type: ignore[no-untyped-def]
                a = g.add("a")
                g.add("b", after=[a])

            await q.enqueue_graph(build)
            order = []
            for _ in range(2):
                lease = (await q.claim("w"))[0]
                order.append(lease.type)
                await q.finalize(lease)
            return order

    assert asyncio.run(main()) == ["a", "b"]


def test_async_stale_finalize_is_lease_lost(async_url: str, clock) -> None:  # type: ignore[no-untyped-def]
    """Fencing holds through the async path: a reclaimed lease cannot finalize."""

    async def main() -> None:
        async with readyq.AsyncQueue(async_url, clock=clock) as q:
            await q.enqueue("t")
            old = (await q.claim("w1", ttl=5))[0]
            clock.advance(6)
            assert await q.reclaim() == 1
            await q.claim("w2", ttl=5)
            with pytest.raises(LeaseLost):
                await q.finalize(old)

    asyncio.run(main())


def test_async_failure_is_retried_then_failed(async_url: str) -> None:
    """fail() from async code follows the same retry policy."""

    async def main() -> readyq.JobInfo:
        async with readyq.AsyncQueue(async_url) as q:
            job = await q.enqueue("t", max_attempts=1)
            await q.fail((await q.claim("w"))[0], "nope")
            return await q.get(job)

    assert asyncio.run(main()).state == JobState.FAILED


def test_concurrent_async_claimers_get_disjoint_jobs(async_url: str) -> None:
    """Eight coroutines claiming at once from one AsyncQueue never share a job."""

    async def main() -> list[int]:
        async with readyq.AsyncQueue(async_url) as q:
            for i in range(40):
                await q.enqueue("t", {"i": i})

            async def claimer(name: str) -> list[int]:
                got = []
                while leases := await q.claim(name, limit=2):
                    for lease in leases:
                        got.append(lease.job_id)
                        await q.finalize(lease)
                return got

            results = await asyncio.gather(*(claimer(f"c{i}") for i in range(8)))
            return [j for r in results for j in r]

    ids = asyncio.run(main())
    assert (len(ids), len(set(ids))) == (40, 40)


def test_async_scan_caps_ready_counts_at_the_limit(async_url: str) -> None:
    """AsyncQueue.scan(limit=...) reads the capped shape, as Queue.scan does."""

    async def main() -> list[tuple[str, int]]:
        async with readyq.AsyncQueue(async_url) as q:
            for _ in range(3):
                await q.enqueue("t", group="a")
            await q.enqueue("t", group="b")
            return [(s.group, s.ready) for s in await q.scan(limit=2)]

    assert asyncio.run(main()) == [("a", 2), ("b", 1)]
