"""What every conformance check works with: the database, its adapter, queues and a clock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from readyq_sim.clock import VirtualClock
from sqlalchemy.engine import Connection, Engine

import readyq
from readyq import dialects
from readyq.dialects import Adapter

from .provision import Site

__all__ = ["Env", "ManualClock"]

#: 2026-01-01T00:00:00.000001Z: a start with a non-zero microsecond.
START_US = 1_767_225_600_000_001


class ManualClock(VirtualClock):
    """The simulator's virtual clock, started at a non-zero microsecond so the suite
    notices any dialect that drops fractions of a second."""

    def __init__(self, start_us: int = START_US) -> None:
        super().__init__(start_us)


@dataclass
class Env:
    """The session's database and the adapter under test.

    ``queue()`` makes a Queue (its own engine, so its own connections) on the session's
    database; every queue made by a test is closed after it.
    """

    site: Site
    block_timeout: float = 0.6
    _queues: list[readyq.Queue] = field(default_factory=list)
    _engine: Engine | None = None
    _adapter: Adapter | None = None

    @property
    def url(self) -> str:
        return self.site.url

    @property
    def engine(self) -> Engine:
        """The adapter-prepared engine (isolation level set as the adapter asks)."""
        if self._engine is None:
            raw = dialects.create_engine(self.url)
            self._engine = dialects.for_engine(raw).prepare_engine(raw)
        return self._engine

    @property
    def adapter(self) -> Adapter:
        if self._adapter is None:
            self._adapter = dialects.for_engine(self.engine)
        return self._adapter

    def queue(self, clock: Any = None) -> readyq.Queue:
        q = readyq.Queue(self.url, clock=clock)
        self._queues.append(q)
        return q

    def close_queues(self) -> None:
        while self._queues:
            self._queues.pop().close()

    def dispose(self) -> None:
        self.close_queues()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None
            self._adapter = None

    @contextmanager
    def write(self, engine: Engine | None = None) -> Iterator[tuple[Connection, Adapter]]:
        """One write transaction opened the way readyq opens them (``begin_write``)."""
        eng = engine or self.engine
        ad = self.adapter
        with eng.connect() as conn, conn.begin():
            ad.begin_write(conn)
            yield conn, ad

    def install(self) -> None:
        q = readyq.Queue(self.url)
        try:
            q.install()
        finally:
            q.close()

    def server_version(self) -> str:
        with self.engine.connect() as conn:
            kind = conn.dialect.name
            if kind == "sqlite":
                return "SQLite " + str(conn.exec_driver_sql("select sqlite_version()").scalar())
            return str(conn.exec_driver_sql("select version()").scalar())

    def driver(self) -> str:
        dialect = self.engine.dialect
        module = getattr(dialect, "dbapi", None) or getattr(dialect, "loaded_dbapi", None)
        version = getattr(module, "__version__", None) or getattr(module, "version", "?")
        return f"{dialect.name}+{dialect.driver} ({getattr(module, '__name__', '?')} {version})"


def select_ids(stmt: sa.Select[Any], conn: Connection) -> list[int]:
    return [int(x) for x in conn.execute(stmt).scalars()]
