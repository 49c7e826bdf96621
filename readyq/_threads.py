"""Handler threads that a running Worker reuses (internal).

A thread started per job cost a fair-share Worker about as much CPU as everything else
in its tick. :meth:`HandlerThreads.start` hands the job to an idle thread instead, and
waits until that thread has taken it, as ``Thread.start()`` waits until a new thread
runs. The wait matters: without it a short handler has not finished by the next tick,
which then finds its slots still taken and claims half as many jobs for the same fixed
cost (docs/benchmarks.md, sessions 5 and 9).
"""

from __future__ import annotations

import _thread
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

__all__: list[str] = []

T = TypeVar("T")


class HandlerThreads(Generic[T]):
    """Runs ``target(item)`` on a thread of its own per item, reusing idle threads."""

    def __init__(self, target: Callable[[T], None]) -> None:
        self._target = target
        self._lock = threading.Lock()
        self._idle: list[_HandlerThread[T]] = []
        self._closed = False

    def start(self, item: T, name: str) -> threading.Thread:
        """Run ``target(item)`` on an idle thread (a new one if none is idle), named
        ``name``; returns once the thread has taken the item."""
        with self._lock:
            if self._closed:
                raise RuntimeError("these handler threads are closed")
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                worker = _HandlerThread(self)
        worker.give(item, name)
        return worker.thread

    def close(self) -> None:
        """Idle threads end now, busy ones when their item returns; no more starts."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.inbox.put(None)

    def _done(self, worker: _HandlerThread[T]) -> bool:
        """``worker`` finished its item: park it as idle; False if it should end."""
        with self._lock:
            if self._closed:
                return False
            self._idle.append(worker)
            return True


class _HandlerThread(Generic[T]):
    def __init__(self, pool: HandlerThreads[T]) -> None:
        self.pool = pool
        self.inbox: queue.SimpleQueue[tuple[T, str] | None] = queue.SimpleQueue()
        # Released by the thread once it has taken an item: start() waits on it.
        self.taken = _thread.allocate_lock()
        self.taken.acquire()
        self.thread = threading.Thread(target=self._loop, daemon=True, name="readyq-handler")
        self.thread.start()

    def give(self, item: T, name: str) -> None:
        self.inbox.put((item, name))
        self.taken.acquire()

    def _loop(self) -> None:
        while True:
            got = self.inbox.get()
            if got is None:
                return
            item, name = got
            self.thread.name = name
            self.taken.release()
            self.pool._target(item)  # the target catches what the handler raises
            self.thread.name = "readyq-handler"
            if not self.pool._done(self):
                return
