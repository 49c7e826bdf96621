"""Time enters readyq here, and only here.

readyq never reads the system clock anywhere else: every ``now`` sent to SQL comes from a
:class:`Clock` as integer microseconds since the Unix epoch (UTC). The simulator hands
readyq a virtual clock; production uses :class:`SystemClock`.
"""

from __future__ import annotations

import datetime as _dt
import threading
import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "from_us", "to_us"]

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


@runtime_checkable
class Clock(Protocol):
    """What readyq needs from time. Implement it to control time (tests, simulation)."""

    def now_us(self) -> int:
        """Current wall time, integer microseconds since the Unix epoch, UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (for intervals, not for SQL)."""
        ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Block until ``event`` is set or ``timeout`` seconds pass; True if it was set."""
        ...


class SystemClock:
    """The real clock: ``time.time_ns`` for SQL, ``time.monotonic`` for intervals."""

    def now_us(self) -> int:
        return time.time_ns() // 1000

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout))

    def __repr__(self) -> str:
        return "SystemClock()"


def to_us(value: _dt.datetime) -> int:
    """An aware datetime as epoch microseconds (exact, no float rounding)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_us(value: int | None) -> _dt.datetime | None:
    """Epoch microseconds as an aware UTC datetime (None stays None)."""
    if value is None:
        return None
    return _EPOCH + _dt.timedelta(microseconds=value)
