"""AsyncQueue: the Queue's semantics for asyncio applications, on async drivers.

One core of logic: every method runs the synchronous :class:`~readyq.queue.Queue` code on
the async engine's ``sync_engine`` inside SQLAlchemy's greenlet bridge (the mechanism
behind ``AsyncConnection.run_sync``), so statements go through the async driver (psycopg
async, aiosqlite, aiomysql/asyncmy) without a second copy of any transition.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ParamSpec, TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from . import _store, dialects
from ._scan import GroupStats
from .clock import Clock
from .errors import InvalidJob, UnsupportedDatabase
from .graph import DEFAULT_MAX_ATTEMPTS, Ref
from .job import JobInfo, Lease, Outcome
from .queue import Queue
from .retry import Backoff

__all__ = ["AsyncQueue"]

P = ParamSpec("P")
R = TypeVar("R")


def _greenlet_spawn() -> Callable[..., Any]:
    try:
        from sqlalchemy.util import greenlet_spawn
    except ImportError as exc:  # pragma: no cover - SQLAlchemy without greenlet
        raise UnsupportedDatabase(
            "AsyncQueue needs greenlet: pip install 'SQLAlchemy[asyncio]'"
        ) from exc
    return greenlet_spawn


class AsyncQueue:
    """``await``-able twin of :class:`~readyq.queue.Queue` over an async engine or URL."""

    def __init__(
        self,
        url_or_engine: str | sa.URL | AsyncEngine,
        clock: Clock | None = None,
        *,
        backoff: Backoff | None = None,
        channel: str = "readyq",
    ) -> None:
        if isinstance(url_or_engine, AsyncEngine):
            self.engine, self._owned = url_or_engine, False
        elif isinstance(url_or_engine, (str, sa.URL)):
            url = sa.make_url(url_or_engine)
            options = dialects.adapter_class(url.get_backend_name()).engine_options(url)
            try:
                self.engine, self._owned = create_async_engine(url, **options), True
            except (ImportError, sa.exc.InvalidRequestError) as exc:
                raise UnsupportedDatabase(
                    f"{url.drivername!r} is not an installed async driver ({exc}); e.g. "
                    "postgresql+psycopg://, sqlite+aiosqlite:///, mysql+aiomysql://"
                ) from exc
        else:
            raise InvalidJob("AsyncQueue() takes a database URL or an AsyncEngine")
        self.sync = Queue(self.engine.sync_engine, clock=clock, backoff=backoff, channel=channel)
        self._spawn = _greenlet_spawn()

    async def _run(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = await self._spawn(fn, *args, **kwargs)
        return result

    async def close(self) -> None:
        if self._owned:
            await self.engine.dispose()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def install(self) -> None:
        await self._run(self.sync.install)

    async def enqueue(
        self,
        type: str,
        args: dict[str, Any] | None = None,
        *,
        group: str = "default",
        weight: float = 1,
        priority: int = 0,
        after: Iterable[Ref] = (),
        parent: Ref | None = None,
        run_after: _dt.datetime | _dt.timedelta | None = None,
        key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        container: bool = False,
    ) -> int:
        """See :meth:`Queue.enqueue`."""
        return await self._run(
            self.sync.enqueue,
            type,
            args,
            group=group,
            weight=weight,
            priority=priority,
            after=after,
            parent=parent,
            run_after=run_after,
            key=key,
            max_attempts=max_attempts,
            timeout=timeout,
            container=container,
        )

    async def enqueue_graph(self, build: Callable[[Any], None]) -> list[int]:
        """``build(g)`` adds jobs to a graph, inserted all-or-nothing; returns the ids."""

        def go() -> list[int]:
            g = self.sync.graph()
            build(g)
            return g.commit()

        return await self._run(go)

    async def get(self, job_id: int) -> JobInfo:
        return await self._run(self.sync.get, job_id)

    async def counts(self) -> dict[str, int]:
        return await self._run(self.sync.counts)

    async def scan(self, *, limit: int | None = None) -> list[GroupStats]:
        return await self._run(self.sync.scan, limit=limit)

    async def cancel(self, job_id: int) -> bool:
        return await self._run(self.sync.cancel, job_id)

    async def retry(self, job_id: int) -> bool:
        return await self._run(self.sync.retry, job_id)

    async def claim(
        self,
        worker_id: str,
        *,
        ttl: float = 30.0,
        limit: int = 1,
        groups: Sequence[str] | None = None,
    ) -> list[Lease]:
        return await self._run(self.sync.claim, worker_id, ttl=ttl, limit=limit, groups=groups)

    async def heartbeat(self, lease: Lease, *, ttl: float = 30.0) -> int:
        return await self._run(self.sync.heartbeat, lease, ttl=ttl)

    async def finalize(self, lease: Lease, result: dict[str, Any] | None = None) -> Outcome:
        return await self._run(self.sync.finalize, lease, result)

    async def fail(
        self, lease: Lease, error: str | BaseException, *, retry: bool = True
    ) -> Outcome:
        return await self._run(self.sync.fail, lease, error, retry=retry)

    async def release(self, lease: Lease) -> Outcome:
        return await self._run(self.sync.release, lease)

    async def reclaim(self, *, batch: int = 500) -> int:
        return await self._run(self.sync.reclaim, batch=batch)

    async def sweep(self, *, batch: int = 500) -> _store.ReclaimCounts:
        return await self._run(self.sync.sweep, batch=batch)
