"""readyq: a vendorable SQLAlchemy 2.x ready-set job scheduler.

Jobs and their dependencies live in two tables; workers lease ready jobs atomically
(``SKIP LOCKED`` on PostgreSQL and MySQL/MariaDB, ``BEGIN IMMEDIATE`` on SQLite) under a
lease token that fences stale workers. This module is the whole public API.
"""

from typing import TYPE_CHECKING

from .clock import Clock, SystemClock
from .errors import (
    CycleError,
    InvalidJob,
    LeaseLost,
    ReadyqError,
    SchemaNotInstalled,
    UnknownJob,
    UnsupportedDatabase,
)
from .fairshare import GroupDemand, fair_share
from .graph import DEFAULT_MAX_ATTEMPTS, Graph, JobHandle
from .handlers import Handlers, JobContext
from .job import TERMINAL, TRANSITIONS, JobInfo, JobState, Lease, Outcome, Transition
from .limits import Budget, Concurrency, Limit, RateLimit
from .queue import Queue
from .retry import Backoff
from .worker import TickReport, Worker

if TYPE_CHECKING:
    from .aio import AsyncQueue

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # AsyncQueue loads sqlalchemy.ext.asyncio only when an application asks for it.
    if name == "AsyncQueue":
        from .aio import AsyncQueue

        return AsyncQueue
    raise AttributeError(f"module 'readyq' has no attribute {name!r}")


__all__ = [
    "DEFAULT_MAX_ATTEMPTS",
    "TERMINAL",
    "TRANSITIONS",
    "AsyncQueue",
    "Backoff",
    "Budget",
    "Clock",
    "Concurrency",
    "CycleError",
    "Graph",
    "GroupDemand",
    "Handlers",
    "InvalidJob",
    "JobContext",
    "JobHandle",
    "JobInfo",
    "JobState",
    "Lease",
    "LeaseLost",
    "Limit",
    "Outcome",
    "Queue",
    "RateLimit",
    "ReadyqError",
    "SchemaNotInstalled",
    "SystemClock",
    "TickReport",
    "Transition",
    "UnknownJob",
    "UnsupportedDatabase",
    "Worker",
    "__version__",
    "fair_share",
]
