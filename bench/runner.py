"""Running n clients at once (threads, or processes of a persistent spawn pool), and stats."""

from __future__ import annotations

import multiprocessing
import statistics
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from . import loops

__all__ = ["BenchError", "Clients", "rate", "summarize"]

Stats = dict[str, Any]


class BenchError(RuntimeError):
    """A measurement went wrong (a client raised, jobs were left over)."""


def summarize(values: Sequence[float]) -> Stats:
    """Median, min and max of the repetitions, and the repetitions themselves."""
    if not values:
        raise BenchError("no repetitions to summarize")
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": list(values),
    }


def rate(results: Sequence[loops.Result]) -> float:
    """Units per second over the union of the clients' windows (first unit to last)."""
    firsts = [r["first"] for r in results if r.get("first") is not None and r["count"]]
    total = sum(int(r["count"]) for r in results)
    if not firsts or total == 0:
        raise BenchError("no client did any work")
    span = max(float(r["last"]) for r in results) - min(firsts)
    return total / span if span > 0 else float("inf")


def ping(barrier: loops.Barrier) -> loops.Result:
    barrier.wait(120)
    return {"count": 0, "first": None, "last": 0.0}


class Clients:
    """Starts n copies of a loop together; processes come from one reused spawn pool.

    Spawning (a fresh interpreter importing SQLAlchemy) costs about a second per process
    on this machine, so the pool is created once, at the largest size needed, and every
    process measurement reuses it; each task still makes its own Queue and engine.
    """

    def __init__(self, max_processes: int) -> None:
        self.max_processes = max_processes
        self._ctx = multiprocessing.get_context("spawn")
        self._pool: ProcessPoolExecutor | None = None
        self._manager: Any = None

    def _start_pool(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._manager = self._ctx.Manager()
            self._pool = ProcessPoolExecutor(self.max_processes, mp_context=self._ctx)
            # Spawn every process now (each blocks at the barrier, so each is a new one).
            self.run("process", ping, [() for _ in range(self.max_processes)])
        return self._pool

    def run(
        self, mode: str, fn: Callable[..., loops.Result], arglists: Sequence[tuple[Any, ...]]
    ) -> list[loops.Result]:
        """Run ``fn(*args, barrier)`` once per arglist, all released at one barrier."""
        n = len(arglists)
        if mode == "thread":
            results: list[loops.Result] = [{} for _ in range(n)]
            tbarrier = threading.Barrier(n + 1)

            def target(i: int, args: tuple[Any, ...]) -> None:
                results[i] = fn(*args, tbarrier)

            threads = [
                threading.Thread(target=target, args=(i, a), daemon=True)
                for i, a in enumerate(arglists)
            ]
            for t in threads:
                t.start()
            tbarrier.wait(120)
            for t in threads:
                t.join()
        elif mode == "process":
            if n > self.max_processes:
                raise BenchError(f"{n} processes asked, pool has {self.max_processes}")
            pool = self._start_pool()
            pbarrier = self._manager.Barrier(n + 1)
            futures = [pool.submit(fn, *a, pbarrier) for a in arglists]
            pbarrier.wait(120)
            results = [f.result() for f in futures]
        else:
            raise BenchError(f"unknown mode {mode!r}")
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            raise BenchError(f"{len(errors)} of {n} clients failed; first:\n{errors[0]}")
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._manager is not None:
            self._manager.shutdown()
            self._manager = None
