"""The peers' drain windows (bench/peer_common.py), which the peer scripts share.

The peer scripts themselves need PGQueuer's or Procrastinate's virtualenv; what they
compute from the processes' notes is plain arithmetic, checked here.
"""

from __future__ import annotations

import queue
from typing import Any

import pytest
from readyq_bench import peer_common


def _seen(n: int, first: float, last: float, end: float) -> dict[str, float]:
    return {"n": n, "first": first, "last": last, "end": end}


def test_drain_counts_from_the_first_start_to_the_last_start_and_to_the_last_commit() -> None:
    got = peer_common.window([_seen(3, 10.0, 11.0, 11.5), _seen(1, 10.5, 12.0, 12.5)], 4)
    assert (got.rate, got.committed) == (4 / 2.0, 4 / 2.5)


def test_a_process_that_ran_no_job_does_not_start_the_window() -> None:
    got = peer_common.window([_seen(0, 0.0, 0.0, 13.0), _seen(4, 10.0, 12.0, 12.5)], 4)
    assert (got.rate, got.committed) == (4 / 2.0, 4 / 3.0)


def test_a_drain_that_ran_fewer_jobs_than_enqueued_is_refused() -> None:
    with pytest.raises(SystemExit, match="ran 3 of 4 jobs"):
        peer_common.window([_seen(3, 10.0, 11.0, 11.5)], 4)


class _Gate:
    def __init__(self) -> None:
        self.waited = 0

    def wait(self, timeout: float | None = None) -> int:
        self.waited += 1
        return 0


def test_a_peer_that_does_not_say_when_it_committed_ends_when_it_returns() -> None:
    def run(seen: dict[str, float], ready: Any) -> None:
        ready()
        peer_common.mark(seen)
        peer_common.mark(seen)

    gate = _Gate()
    out: queue.Queue[dict[str, float]] = queue.Queue()
    peer_common._child(run, gate, out)
    seen = out.get_nowait()
    assert (gate.waited, seen["n"]) == (1, 2)
    assert seen["first"] <= seen["last"] <= seen["end"]
