"""Limits on how many jobs may start: free slots are the minimum over all limits.

A limit is an object with one method that matters, :meth:`Limit.available`; ``acquire`` and
``release`` are called once per job started and once per job ended (finished, failed, lost
or abandoned), so a limit that counts holders stays exact.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from .errors import InvalidJob
from .job import Lease

__all__ = ["Budget", "Concurrency", "Limit", "RateLimit"]


class Limit:
    """Base class: override :meth:`available`; override the hooks if you count holders."""

    def available(self, now: float) -> int:
        """How many more jobs may start now (``now``: the worker clock's monotonic seconds)."""
        raise NotImplementedError

    def acquire(self, lease: Lease, now: float) -> None:
        """A job under this limit started."""

    def release(self, lease: Lease, now: float) -> None:
        """A job under this limit ended (exactly once per acquire)."""


class Concurrency(Limit):
    """At most ``n`` jobs running in this worker at once."""

    def __init__(self, n: int) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InvalidJob(f"Concurrency needs a positive int, not {n!r}")
        self.n = n
        self.held = 0
        self._lock = threading.Lock()

    def available(self, now: float) -> int:
        return self.n - self.held

    def acquire(self, lease: Lease, now: float) -> None:
        with self._lock:
            self.held += 1

    def release(self, lease: Lease, now: float) -> None:
        with self._lock:
            self.held -= 1

    def __repr__(self) -> str:
        return f"Concurrency({self.n})"


class RateLimit(Limit):
    """A token bucket on job starts: ``per_second`` on average, bursts up to ``burst``."""

    def __init__(self, per_second: float, burst: int = 1) -> None:
        if not (
            isinstance(per_second, (int, float))
            and not isinstance(per_second, bool)
            and math.isfinite(per_second)
            and per_second > 0
        ):
            raise InvalidJob(f"RateLimit needs a positive rate, not {per_second!r}")
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise InvalidJob(f"RateLimit burst must be a positive int, not {burst!r}")
        self.per_second = float(per_second)
        self.burst = burst
        self._tokens = float(burst)
        self._at: float | None = None
        self._lock = threading.Lock()

    def _refill(self, now: float) -> None:
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.per_second)
        self._at = now

    def available(self, now: float) -> int:
        with self._lock:
            self._refill(now)
            # The epsilon absorbs float drift of many small refills (0.05 + ... != 1.0).
            return int(self._tokens + 1e-9)

    def acquire(self, lease: Lease, now: float) -> None:
        with self._lock:
            self._refill(now)
            self._tokens -= 1

    def __repr__(self) -> str:
        return f"RateLimit({self.per_second}, burst={self.burst})"


class Budget(Limit):
    """A caller-supplied remaining budget: ``remaining()`` jobs may start (e.g. free GPUs)."""

    def __init__(self, remaining: Callable[[], float]) -> None:
        if not callable(remaining):
            raise InvalidJob("Budget needs a callable returning how many jobs may start")
        self.remaining = remaining

    def available(self, now: float) -> int:
        value = self.remaining()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidJob(f"the Budget callable returned {value!r:.60}; it must return a number")
        return max(0, math.floor(value)) if math.isfinite(value) else 0

    def __repr__(self) -> str:
        return f"Budget({self.remaining!r})"
