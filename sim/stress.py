"""Stress mode: the same actors and workload on real threads, no interleaver.

Every actor runs freely in its own thread against its own connection, so statements really
overlap inside the database: the mode exists for races *inside* one statement, which the
interleaver (one statement at a time) cannot produce. It is not replayable.

Time is the wall clock sped up ``speed`` times (a :class:`ScaledClock`): TTLs, heartbeats
and sweeps keep their virtual values, and a run takes ``1/speed`` of them in wall time.

The history has the same format. Positions come from one shared counter (``Driver.step``
reads and increments it): an event's ``step`` is taken when it is logged, an operation's
``commit_step`` just before its COMMIT is sent. Two writes that conflict on a row are
serialized by the row lock (or SQLite's single writer), which the second one only gets
after the first has committed, so commit positions order every pair of conflicting
transactions as the database did; the checkers replay in that order unchanged.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections.abc import Callable
from random import Random
from typing import Any

import sqlalchemy as sa

from .actors import enqueuer, sweeper, worker
from .clock import DEFAULT_START_US, VirtualClock
from .config import SimConfig
from .driver import ActorCtx, Driver, Stopped
from .rng import Streams
from .run import RunResult, _final_read, _install, _open_jobs, fresh_database
from .workload import make_workload
from .world import Hooks, World

__all__ = ["ScaledClock", "StressDriver", "run_stress"]

#: Seconds a blocked statement may wait for a lock before it fails (and is retried).
LOCK_WAIT_S = 10


class ScaledClock(VirtualClock):
    """Wall time since creation, ``speed`` times faster, from :data:`DEFAULT_START_US`."""

    def __init__(self, speed: float, start_us: int = DEFAULT_START_US) -> None:
        super().__init__(start_us)
        self.speed = speed
        self._t0 = time.perf_counter()
        self._start = start_us

    def now_us(self) -> int:
        return self._start + round((time.perf_counter() - self._t0) * self.speed * 1e6)

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout) / self.speed)

    def advance(self, seconds: float) -> int:
        return self.now_us()  # time moves by itself

    def set(self, now_us: int) -> None:
        pass


class StressCtx(ActorCtx):
    """An actor that never waits for a baton: statements run at once, sleeps really sleep."""

    driver: StressDriver

    def _yield(self, state: str) -> None:
        if state != "time":
            return
        self.state = "time"
        clock = self.driver.clock
        while not self.driver.stop_event.is_set():
            left = self.wake_us - clock.now_us()
            if left <= 0:
                break
            self.driver.stop_event.wait(left / 1e6 / self.driver.speed)
        self.state = "running"

    def _main(self) -> None:
        try:
            self.fn(self)
        except Stopped:
            pass
        except BaseException as exc:
            self.error = exc
        finally:
            self.state = "done"


class StressDriver(Driver):
    """Spawns free-running actors; ``step`` is a shared, strictly increasing position."""

    def __init__(self, url: str, clock: ScaledClock, *, watchdog: float = 60.0) -> None:
        self._counter = itertools.count(1)
        super().__init__(url, clock, Random(0), watchdog=watchdog)  # noqa: S311 -- unused
        self.speed = clock.speed
        self.stop_event = threading.Event()
        self._count_lock = threading.Lock()

    @property
    def step(self) -> int:
        return next(self._counter)  # atomic under the GIL

    @step.setter
    def step(self, value: int) -> None:
        pass

    def record(self, actor: str, what: str, extra: str = "") -> None:
        """No digest in stress mode (nothing is replayable); keep only error counts."""

    def connect_args(self) -> dict[str, Any]:
        """Real lock waits (bounded), instead of the interleaver's fail-at-once."""
        if self.kind == "sqlite":
            return {"timeout": LOCK_WAIT_S, "check_same_thread": False}
        if self.kind == "postgresql":
            return {"options": f"-c lock_timeout={LOCK_WAIT_S * 1000}"}
        if self.kind == "mysql":
            return {"init_command": f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}"}
        return {}

    def spawn(self, name: str, fn: Callable[[ActorCtx], None]) -> ActorCtx:
        ctx = StressCtx(self, name, fn)
        self.actors.append(ctx)
        ctx.thread.start()
        return ctx

    def run_for(self, seconds: float, until: Callable[[], bool], every: float = 0.05) -> str:
        """Let the actors run ``seconds`` of virtual time, or until ``until()`` holds."""
        deadline = self.clock.now_us() + round(seconds * 1e6)
        while self.clock.now_us() < deadline:
            if until():
                return "until"
            if all(a.state == "done" for a in self.actors):
                return "idle"
            time.sleep(every)
        return "deadline"

    def stop(self) -> None:
        self.stopping = True
        self.stop_event.set()
        for a in self.actors:
            a.thread.join(timeout=self.watchdog)
            a.dispose_engines()


def run_stress(
    cfg: SimConfig,
    url: str | None = None,
    hooks: Hooks | None = None,
    *,
    speed: float = 10.0,
    seconds: float = 60.0,
) -> RunResult:
    """Run ``cfg``'s workload on free threads: faults for ``seconds`` virtual seconds (or
    until quiet), then healed until quiet within ``cfg.liveness_budget``."""
    with fresh_database(url) as db_url, warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.exc.SAWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        return _run_stress(cfg, db_url, hooks or Hooks(), speed, seconds)


def _run_stress(cfg: SimConfig, url: str, hooks: Hooks, speed: float, seconds: float) -> RunResult:
    started = time.perf_counter()
    server = _install(url, VirtualClock())
    clock = ScaledClock(speed)
    start_us = clock.now_us()
    driver = StressDriver(url, clock, watchdog=max(60.0, cfg.watchdog))
    world = World(cfg, clock, Streams(cfg.seed), driver, hooks)
    batches = make_workload(cfg, world.streams["workload"])
    driver.spawn("enqueuer", enqueuer(world, batches))
    driver.spawn("sweeper", sweeper(world))
    for i in range(cfg.workers):
        driver.spawn(f"w{i + 1}", worker(world))

    def quiet() -> bool:
        return world.enqueuer_done and _open_jobs(url) == 0

    phases = {"faults": driver.run_for(seconds, quiet, every=0.2)}
    world.faults_active = False
    world.heal_us = clock.now_us()
    world.log("driver", "note", "heal", world.heal_us)
    if phases["faults"] == "until":
        phases["liveness"] = "already quiet"
    else:
        phases["liveness"] = driver.run_for(cfg.liveness_budget, quiet, every=0.2)
    live = phases["liveness"] in ("until", "already quiet")
    world.log("driver", "note", "stop", clock.now_us())
    driver.stop()
    driver.close()
    errors = {a.name: repr(a.error) for a in driver.actors if a.error is not None}
    return RunResult(
        cfg=cfg,
        url=url,
        world=world,
        final=_final_read(url),
        digest="(stress: not replayable)",
        steps=next(driver._counter),
        wall_s=time.perf_counter() - started,
        virtual_s=(clock.now_us() - start_us) / 1e6,
        phases=phases,
        live=live,
        server_version=server,
        stuck=None,
        actor_errors=errors,
    )
