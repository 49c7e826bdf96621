"""Handlers and what they see: the registry by job type, and the per-run context."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import InvalidJob, LeaseLost
from .job import Lease
from .queue import Queue

__all__ = ["Handler", "Handlers", "JobContext"]

Handler = Callable[["JobContext", dict[str, Any]], "dict[str, Any] | None"]


class Handlers:
    """A registry of handlers by job type: ``@handlers("fetch") def fetch(ctx, args): ...``."""

    def __init__(self, mapping: Mapping[str, Handler] | None = None) -> None:
        self._by_type: dict[str, Handler] = {}
        for name, fn in (mapping or {}).items():
            self.add(name, fn)

    def add(self, type_: str, fn: Handler) -> Handler:
        if not isinstance(type_, str) or not type_:
            raise InvalidJob("a handler's job type must be a non-empty string")
        if not callable(fn):
            raise InvalidJob(f"the handler for {type_!r} is not callable")
        self._by_type[type_] = fn
        return fn

    def __call__(self, type_: str) -> Callable[[Handler], Handler]:
        return lambda fn: self.add(type_, fn)

    def get(self, type_: str) -> Handler | None:
        return self._by_type.get(type_)

    def __contains__(self, type_: object) -> bool:
        return type_ in self._by_type

    def types(self) -> list[str]:
        return sorted(self._by_type)


_BUILDING = threading.Lock()


class _LostEvent(threading.Event):
    """A ``threading.Event`` that builds its Condition on first use: a Worker makes one
    per job, and most jobs end without anyone waiting on (or setting) it. ``is_set()``
    reads the flag alone, as ``threading.Event``'s does."""

    def __init__(self) -> None:  # no super().__init__(): that builds the Condition now
        self._flag = False

    @property
    def _cond(self) -> threading.Condition:  # built on first use
        cond: threading.Condition | None = self.__dict__.get("_built")
        if cond is None:
            with _BUILDING:  # two threads' first set() and wait() must share one
                cond = self.__dict__.get("_built")
                if cond is None:
                    cond = self.__dict__["_built"] = threading.Condition(threading.Lock())
        return cond


@dataclass
class JobContext:
    """What a handler knows about its run. Check ``lost`` in long loops and stop when set."""

    lease: Lease
    _queue: Queue = field(repr=False)
    _ttl: float = field(repr=False)
    lost: threading.Event = field(default_factory=_LostEvent)
    reason: str | None = None

    @property
    def job_id(self) -> int:
        return self.lease.job_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def token(self) -> int:
        return self.lease.token

    @property
    def idempotency_key(self) -> str:
        """Stable per (job, lease): key external side effects with it."""
        return self.lease.idempotency_key

    def heartbeat(self) -> None:
        """Renew the lease now (the worker also does so every ``heartbeat_every``)."""
        try:
            self._queue.heartbeat(self.lease, ttl=self._ttl)
        except LeaseLost:
            self.lose("lease lost")
            raise

    def lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()
