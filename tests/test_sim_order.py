"""Stress mode's commit order: positions that order every pair of conflicting
transactions as the database did, pipelines that commit on the server included
(:class:`readyq_sim.stress.CommitOrder`). No database is written; the driver's URL is
only where it would be."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from readyq_sim import stress
from readyq_sim.stress import ScaledClock, StressDriver


class _Named:
    """An actor as the commit order sees it: its name."""

    def __init__(self, name: str) -> None:
        self.name = name


def _stress_driver(tmp_path: Any) -> StressDriver:
    return StressDriver(f"sqlite:///{tmp_path / 'order.db'}", ScaledClock(10))


def test_a_commit_takes_its_position_only_once_a_pipeline_in_flight_is_back(
    tmp_path: Any,
) -> None:
    """A pipeline's reads and commit happen on the server after it is sent: no COMMIT may
    take a position between its sending and its results."""
    driver = _stress_driver(tmp_path)
    seen: list[str] = []
    at = driver.pipeline_sent(_Named("p"))  # type: ignore[arg-type]  # only .name is read
    committer = threading.Thread(target=lambda: seen.append(f"commit {driver.commit_position()}"))
    committer.start()
    time.sleep(0.2)  # the COMMIT is waiting by now (or the order below would not hold)
    back = driver.pipeline_back(_Named("p"), at)  # type: ignore[arg-type]
    seen.insert(0, f"back {back}")
    committer.join(5)
    assert back == at
    assert [s.split()[0] for s in seen] == ["back", "commit"]
    assert int(seen[1].split()[1]) > back


def test_a_pipeline_passed_by_a_waiting_commit_takes_its_position_after_it(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A COMMIT that a pipeline blocked on its row lock would wait for gives up waiting and
    takes a position; the pipeline, which saw that commit, then comes after it."""
    monkeypatch.setattr(stress, "ORDER_WAIT_S", 0.05)
    driver = _stress_driver(tmp_path)
    at = driver.pipeline_sent(_Named("p"))  # type: ignore[arg-type]
    commit = driver.commit_position()  # the lock is held: it waits, then passes
    back = driver.pipeline_back(_Named("p"), at)  # type: ignore[arg-type]
    assert at < commit < back
