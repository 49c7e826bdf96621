"""JobContext.lost: the Event a Worker makes per job, whose Condition is built on first use."""

from __future__ import annotations

import threading

from readyq.handlers import _LostEvent


def test_a_lost_flag_set_in_one_thread_wakes_a_waiter_in_another() -> None:
    """wait() blocks until another thread's set(), then returns True."""
    lost = _LostEvent()
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(lost.wait(10)))
    waiter.start()
    lost.set()
    waiter.join(10)
    assert (woke, lost.is_set()) == ([True], True)


def test_many_threads_waiting_first_all_wake_on_one_set() -> None:
    """Threads racing to build the Condition share one: a single set() wakes every one."""
    lost = _LostEvent()
    start = threading.Barrier(9)
    woke: list[bool] = []

    def wait() -> None:
        start.wait(10)
        woke.append(lost.wait(10))

    waiters = [threading.Thread(target=wait) for _ in range(8)]
    for t in waiters:
        t.start()
    start.wait(10)
    lost.set()
    for t in waiters:
        t.join(15)
    assert woke == [True] * 8


def test_a_lost_flag_starts_clear_and_clears_again() -> None:
    """is_set() is False until set(); clear() makes a later wait time out."""
    lost = _LostEvent()
    assert not lost.is_set()
    lost.set()
    lost.clear()
    assert (lost.is_set(), lost.wait(0.01)) == (False, False)
