"""The history: Jepsen-shaped invoke/ok/fail/info events, in the order they happened.

Events are appended by the actor holding the driver's baton, so the list is totally ordered.
``commit_step`` is the driver step at which the operation's COMMIT ran (ok events only): in
the interleaved mode the commit steps are a total order of committed transactions.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Event", "History"]


@dataclass
class Event:
    i: int
    step: int
    actor: str
    type: str  # invoke | ok | fail | info | note
    f: str  # enqueue | claim | heartbeat | finalize | fail | release | sweep | fault | ...
    now_us: int
    job: int | None = None
    token: int | None = None
    commit_step: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def order(self) -> int:
        """Commit position for committed events, else the step it completed at."""
        return self.commit_step if self.commit_step is not None else self.step

    def line(self, start_us: int = 0) -> str:
        t = (self.now_us - start_us) / 1e6
        where = f"job {self.job}" if self.job is not None else ""
        tok = f" token {self.token}" if self.token is not None else ""
        extra = " ".join(f"{k}={v}" for k, v in sorted(self.detail.items()))
        commit = f" commit@{self.commit_step}" if self.commit_step is not None else ""
        return (
            f"#{self.i:<5} step {self.step:<6} t={t:9.3f}s {self.actor:<10} "
            f"{self.type:<6} {self.f:<10} {where}{tok}{commit} {extra}".rstrip()
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "i": self.i,
            "step": self.step,
            "actor": self.actor,
            "type": self.type,
            "f": self.f,
            "now_us": self.now_us,
            "job": self.job,
            "token": self.token,
            "commit_step": self.commit_step,
            "detail": self.detail,
        }


class History:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()  # stress mode: actors append from many threads

    def add(
        self,
        step: int,
        actor: str,
        type: str,
        f: str,
        now_us: int,
        *,
        job: int | None = None,
        token: int | None = None,
        commit_step: int | None = None,
        **detail: Any,
    ) -> Event:
        with self._lock:
            i = len(self.events)
            ev = Event(i, step, actor, type, f, now_us, job, token, commit_step, detail)
            self.events.append(ev)
        return ev

    def of_job(self, job: int) -> list[Event]:
        return [e for e in self.events if e.job == job]

    def __len__(self) -> int:
        return len(self.events)
