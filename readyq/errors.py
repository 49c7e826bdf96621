"""The readyq exception hierarchy.

Every error readyq raises on purpose is a :class:`ReadyqError`; its message says what
went wrong and what to do about it.
"""

from __future__ import annotations

__all__ = [
    "CycleError",
    "InvalidJob",
    "LeaseLost",
    "ReadyqError",
    "SchemaNotInstalled",
    "UnknownJob",
    "UnsupportedDatabase",
]


class ReadyqError(Exception):
    """Base class of every error readyq raises on purpose."""


class InvalidJob(ReadyqError, ValueError):
    """An argument to enqueue/graph/claim/... is invalid; nothing was written."""


class CycleError(InvalidJob):
    """The dependencies given to a graph form a cycle; nothing was written."""

    def __init__(self, message: str, cycle: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.cycle = cycle


class UnknownJob(ReadyqError, LookupError):
    """No job has the given id (or a dependency/parent refers to a missing job)."""

    def __init__(self, message: str, job_id: int | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id


class LeaseLost(ReadyqError):
    """The lease is no longer held: it was reclaimed, timed out, cancelled or re-claimed.

    The job's row was not changed. Stop working on the job; its next holder (if any) owns
    the result.
    """

    def __init__(self, message: str, job_id: int, token: int) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.token = token


class UnsupportedDatabase(ReadyqError):
    """The database, its version or its driver cannot give readyq's guarantees."""


class SchemaNotInstalled(ReadyqError):
    """readyq's tables are missing: run ``Queue.install()`` or ``readyq install``."""
