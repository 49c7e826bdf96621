"""The bench's CPU meter reads the right processes, and only where they run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from readyq_bench.cpu import CpuMeter

pytestmark = pytest.mark.backend

needs_proc = pytest.mark.skipif(not Path("/proc/stat").is_file(), reason="needs Linux /proc")


@needs_proc
def test_the_meter_finds_the_local_servers_processes(backend: Any) -> None:
    """A server on this machine has spent CPU since it started: a meter that looked for
    the wrong process names would read zero."""
    meter = CpuMeter(backend.url)
    snap = meter.sample()
    assert snap is not None
    if backend.name == "sqlite":
        assert snap.server is None
    else:
        assert (snap.server or 0.0) > 0


def test_a_server_on_another_host_is_not_metered() -> None:
    """Its CPU is not on this machine, so no split is claimed for it."""
    meter = CpuMeter("postgresql+psycopg://u@db.example.com:5432/x")
    assert meter.sample() is None
    assert meter.split(None, None, 100) == {}


def test_the_split_is_per_job_and_busy_is_a_share_of_the_machine() -> None:
    """Busy time is total minus idle; the server's seconds come out of it, per job."""
    from readyq_bench.cpu import Snapshot

    meter = CpuMeter("postgresql+psycopg://u@127.0.0.1/x")
    split = meter.split(Snapshot(100.0, 50.0, 10.0), Snapshot(104.0, 51.0, 11.0), 1000)
    assert split == pytest.approx({"server_ms_per_job": 1.0, "rest_ms_per_job": 2.0, "busy": 0.75})


def test_a_window_with_fewer_busy_ticks_than_it_can_resolve_gives_no_split() -> None:
    """Two busy ticks (20 ms) per 1,000 jobs would be reported as 0.02 ms/job +- 50 %."""
    from readyq_bench.cpu import Snapshot

    meter = CpuMeter("postgresql+psycopg://u@127.0.0.1/x")
    assert meter.split(Snapshot(100.0, 50.0, 10.0), Snapshot(100.5, 50.48, 10.0), 1000) == {}


@needs_proc
def test_a_window_that_burns_cpu_reports_it_busy() -> None:
    """A real 0.3 s busy loop shows up in /proc as busy time of the rest (no server)."""
    import time

    meter = CpuMeter("sqlite:///x.db")
    before = meter.sample()
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    split = meter.split(before, meter.sample(), 10)
    assert split["busy"] > 0, split
    assert split["rest_ms_per_job"] >= 20, split
