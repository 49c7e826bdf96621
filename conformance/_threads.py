"""Run a call in a thread of its own and tell whether it finished within a wall timeout.

That is how the suite says "this statement would block": a call that has not returned
after ``timeout`` seconds is waiting on something another connection holds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Attempt"]


class Attempt:
    """``fn()`` started at once in a daemon thread."""

    def __init__(self, fn: Callable[[], Any], name: str = "attempt") -> None:
        self._fn = fn
        self.value: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.value = self._fn()
        except BaseException as exc:  # reported to the caller, never swallowed
            self.error = exc
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """True if the call finished within ``timeout`` seconds (it keeps running if not)."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> Any:
        """The call's return value (re-raising its exception); waits up to ``timeout``."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self._thread.name} did not finish within {timeout}s")
        if self.error is not None:
            raise self.error
        return self.value
