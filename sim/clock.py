"""Virtual time: the simulator's only clock, handed to readyq as its ``Clock``.

Integer microseconds, advanced explicitly; ``wait`` never sleeps, it moves time forward.
"""

from __future__ import annotations

import threading

__all__ = ["VirtualClock"]

#: 2026-01-01T00:00:00Z, so virtual timestamps read as plausible dates.
DEFAULT_START_US = 1_767_225_600_000_000


class VirtualClock:
    """A clock that only moves when told to (thread-safe)."""

    def __init__(self, start_us: int = DEFAULT_START_US) -> None:
        self._now = start_us
        self._lock = threading.Lock()

    def now_us(self) -> int:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.now_us() / 1e6

    def wait(self, event: threading.Event, timeout: float) -> bool:
        if event.is_set():
            return True
        self.advance(timeout)
        return event.is_set()

    def advance(self, seconds: float) -> int:
        """Move time forward by ``seconds`` (>= 0); returns the new now."""
        if seconds < 0:
            raise ValueError("virtual time never goes backwards")
        with self._lock:
            self._now += round(seconds * 1e6)
            return self._now

    def set(self, now_us: int) -> None:
        """Jump to ``now_us`` (not earlier than now)."""
        with self._lock:
            if now_us < self._now:
                raise ValueError("virtual time never goes backwards")
            self._now = now_us

    def __repr__(self) -> str:
        return f"VirtualClock(now_us={self.now_us()})"
