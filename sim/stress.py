"""Stress mode: the same actors and workload on real threads or processes, no interleaver.

Every actor runs freely against its own connection, so statements really overlap inside the
database: the mode exists for races *inside* one statement, which the interleaver (one
statement at a time) cannot produce. It is not replayable. Two modes:

- ``thread``: every actor in a thread of this process. Python's GIL serializes the client
  code, but the database runs the statements in parallel.
- ``process``: every actor (the enqueuer, the sweeper, each worker) in a ``multiprocessing``
  *spawn* process of its own, with its own engine and its own copy of the seeded streams, so
  the client side runs in parallel too. Each child records its events and, at the end,
  ships them (and its fault counts and the jobs it enqueued) back through a pipe; the parent
  merges them into one history for the same checkers. Heal and stop are
  ``multiprocessing`` events; the faults switch off in a child within 20 ms of the heal.
  Test-only patches (broken variants) cannot follow into a spawned child, so a child can
  run a ``setup`` named as ``"module:function"`` that applies them there and returns the
  Hooks.

Time is the wall clock sped up ``speed`` times (a :class:`ScaledClock`): TTLs, heartbeats
and sweeps keep their virtual values, and a run takes ``1/speed`` of them in wall time. In
process mode every process builds the clock from the same ``time.monotonic()`` origin, set
by the parent once every child has started (the monotonic clock is system-wide).

The history has the same format. Positions come from one shared counter (``Driver.step``
reads and increments it): an event's ``step`` is taken when it is logged, an operation's
``commit_step`` just before its COMMIT is sent (for a pipeline that commits on the server,
PostgreSQL's, see :class:`CommitOrder`). Two writes that conflict on a row are
serialized by the row lock (or SQLite's single writer), which the second one only gets
after the first has committed, so commit positions order every pair of conflicting
transactions as the database did; the checkers replay in that order unchanged. The argument
needs only that an increment finishing before another one starts (in real time) gets the
smaller number. In thread mode the counter is an ``itertools.count`` (atomic under the GIL);
in process mode it is a ``multiprocessing.Value`` in shared memory, incremented under its
lock, which gives the same real-time order across processes for about a microsecond per
position. (A database sequence would also be linearizable, but costs a round trip per
event, and SQLite has none.)
"""

from __future__ import annotations

import importlib
import itertools
import multiprocessing
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from random import Random
from typing import Any

import sqlalchemy as sa

from .actors import enqueuer, sweeper, worker
from .clock import DEFAULT_START_US, VirtualClock
from .config import SimConfig
from .driver import ActorCtx, Driver, Stopped
from .history import Event
from .rng import Streams
from .run import RunResult, _final_read, _install, _open_jobs, fresh_database
from .workload import make_workload
from .world import Hooks, JobRecord, World

__all__ = ["MODES", "ScaledClock", "StressDriver", "run_stress"]

#: Stress modes: actors on threads of this process, or each in a spawned process.
MODES = ("thread", "process")

#: Seconds a blocked statement may wait for a lock before it fails (and is retried).
LOCK_WAIT_S = 10

#: Wall seconds a COMMIT waits for a pipeline in flight before it takes its position anyway
#: (:class:`CommitOrder`): long past any round trip, short beside a lease's TTL.
ORDER_WAIT_S = 0.5


class ScaledClock(VirtualClock):
    """Wall time since ``t0`` (default: creation), ``speed`` times faster, from
    :data:`DEFAULT_START_US`. ``t0`` is a ``time.monotonic()`` reading, which processes on
    one machine share."""

    def __init__(
        self, speed: float, start_us: int = DEFAULT_START_US, t0: float | None = None
    ) -> None:
        super().__init__(start_us)
        self.speed = speed
        self._t0 = time.monotonic() if t0 is None else t0
        self._start = start_us

    def now_us(self) -> int:
        return self._start + round((time.monotonic() - self._t0) * self.speed * 1e6)

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


class SharedCounter:
    """A strictly increasing position shared by processes (``multiprocessing.Value``)."""

    def __init__(self, value: Synchronized[int]) -> None:
        self.value = value

    def __next__(self) -> int:
        with self.value.get_lock():
            self.value.value += 1
            return int(self.value.value)

    def __iter__(self) -> Iterator[int]:
        return self


@dataclass
class CommitOrder:
    """Positions for transactions that commit inside a pipeline (PostgreSQL, autocommit).

    Such a pipeline's reads, locks and commit all happen on the server after it is sent,
    with no client moment between them: a position taken before sending can come before
    that of a transaction it then saw commit (a child claimed "before" its parent's
    finalize), and one taken after the results can come after a transaction that saw it.
    So a pipeline holds ``lock`` from its position until its results are back, and a
    COMMIT takes its position under the same lock: no position is taken while a
    pipeline is in flight, and the pipeline is atomic in the order.

    One wait breaks that: a pipeline blocked on a row lock of a transaction that waits to
    take its COMMIT position. That COMMIT gives up after :data:`ORDER_WAIT_S`, takes a
    position and counts itself in ``passed``; the pipeline it passed, which can only have
    been waiting for it (nothing else holds a lock that long), then takes its own
    position again once back, after the COMMIT's. Shared by processes in process mode.
    """

    lock: Any  # a multiprocessing Lock
    passed: Synchronized[int]

    @classmethod
    def make(cls, mp: Any = multiprocessing) -> CommitOrder:
        return cls(mp.Lock(), mp.Value("q", 0))


class StressDriver(Driver):
    """Spawns free-running actors; ``step`` is a shared, strictly increasing position."""

    def __init__(
        self,
        url: str,
        clock: ScaledClock,
        *,
        watchdog: float = 60.0,
        counter: Iterator[int] | None = None,
        order: CommitOrder | None = None,
    ) -> None:
        self._counter = itertools.count(1) if counter is None else counter
        super().__init__(url, clock, Random(0), watchdog=watchdog)  # noqa: S311 -- unused
        self.speed = clock.speed
        self.stop_event = threading.Event()
        self.order = CommitOrder.make() if order is None else order
        #: Per actor in flight: ``order.passed`` when its pipeline was sent.
        self._passed_at: dict[str, int] = {}

    def commit_position(self) -> int:
        held = self.order.lock.acquire(timeout=ORDER_WAIT_S)
        try:
            if not held:
                with self.order.passed.get_lock():
                    self.order.passed.value += 1
            return self.step
        finally:
            if held:
                self.order.lock.release()

    def pipeline_sent(self, ctx: ActorCtx) -> int:
        if not self.order.lock.acquire(timeout=self.watchdog):
            raise RuntimeError(f"{ctx.name}: a pipeline held the commit order {self.watchdog}s")
        self._passed_at[ctx.name] = self.order.passed.value
        return self.step

    def pipeline_back(self, ctx: ActorCtx, at: int) -> int:
        try:
            passed = self.order.passed.value != self._passed_at.pop(ctx.name)
            return self.step if passed else at
        finally:
            self.order.lock.release()

    @property
    def step(self) -> int:
        return next(self._counter)  # itertools.count: atomic under the GIL

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
    mode: str = "thread",
    setup: str | None = None,
) -> RunResult:
    """Run ``cfg``'s workload on free threads (or processes): faults for ``seconds`` virtual
    seconds (or until quiet), then healed until quiet within ``cfg.liveness_budget``.

    ``setup`` (process mode): ``"module:function"`` each child calls first; it may patch
    readyq in that child and returns the child's Hooks (or None). ``hooks`` is for threads.
    """
    if mode not in MODES:
        raise ValueError(f"unknown stress mode {mode!r}; known: {', '.join(MODES)}")
    if mode == "process" and hooks is not None:
        raise ValueError("process mode takes setup='module:function', not Hooks")
    with fresh_database(url) as db_url, warnings.catch_warnings():
        warnings.simplefilter("ignore", sa.exc.SAWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        if mode == "process":
            return _run_processes(cfg, db_url, speed, seconds, setup)
        return _run_stress(cfg, db_url, hooks or Hooks(), speed, seconds)


def _spawn_actor(world: World, driver: Driver, name: str) -> None:
    """Start actor ``name`` (``enqueuer``, ``sweeper`` or ``w<n>``) on ``driver``."""
    if name == "enqueuer":
        driver.spawn(name, enqueuer(world, make_workload(world.cfg, world.streams["workload"])))
    elif name == "sweeper":
        driver.spawn(name, sweeper(world))
    else:
        driver.spawn(name, worker(world))


def _actor_names(cfg: SimConfig) -> list[str]:
    return ["enqueuer", "sweeper", *(f"w{i + 1}" for i in range(cfg.workers))]


def _run_stress(cfg: SimConfig, url: str, hooks: Hooks, speed: float, seconds: float) -> RunResult:
    started = time.perf_counter()
    server = _install(url, VirtualClock())
    clock = ScaledClock(speed)
    start_us = clock.now_us()
    driver = StressDriver(url, clock, watchdog=max(60.0, cfg.watchdog))
    world = World(cfg, clock, Streams(cfg.seed), driver, hooks)
    for name in _actor_names(cfg):
        _spawn_actor(world, driver, name)

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


# -- process mode ---------------------------------------------------------------------------

#: Wall seconds a child may take to start (spawn, imports) or to ship its events at the end.
CHILD_TIMEOUT_S = 120.0


@dataclass
class _Signals:
    """What the parent and its children share (made from one spawn context)."""

    counter: Synchronized[int]
    order: CommitOrder
    t0: Synchronized[float]
    ready: Any  # multiprocessing.Semaphore: one release per child that has started
    go: Any  # multiprocessing.Event: t0 is set, start
    heal: Any  # Event: the faults are over
    stop: Any  # Event: stop, ship the events
    enqueued: Any  # Event: the enqueuer has acknowledged every batch


@dataclass(frozen=True)
class _ChildSpec:
    name: str  # the actor: enqueuer, sweeper or w<n>
    cfg: SimConfig
    url: str
    speed: float
    setup: str | None


@dataclass
class _ChildResult:
    name: str
    events: list[dict[str, Any]] = field(default_factory=list)
    faults: dict[str, int] = field(default_factory=dict)
    jobs: dict[int, JobRecord] = field(default_factory=dict)
    blocked: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    actor_error: str | None = None


def _load_setup(setup: str | None) -> Hooks:
    if setup is None:
        return Hooks()
    module, _, attr = setup.partition(":")
    made = getattr(importlib.import_module(module), attr)()
    return made if isinstance(made, Hooks) else Hooks()


def _child(spec: _ChildSpec, sig: _Signals, out: Connection) -> None:
    """One actor in a spawned process: wait for the start, run until stopped, ship events."""
    warnings.simplefilter("ignore", sa.exc.SAWarning)
    warnings.simplefilter("ignore", ResourceWarning)
    result = _ChildResult(spec.name)
    try:
        hooks = _load_setup(spec.setup)
        sig.ready.release()
        if not sig.go.wait(CHILD_TIMEOUT_S):
            raise TimeoutError("the parent never said go")
        cfg = spec.cfg
        clock = ScaledClock(spec.speed, t0=sig.t0.value)
        counter = SharedCounter(sig.counter)
        driver = StressDriver(
            spec.url, clock, watchdog=max(60.0, cfg.watchdog), counter=counter, order=sig.order
        )
        world = World(cfg, clock, Streams(cfg.seed), driver, hooks)
        _spawn_actor(world, driver, spec.name)
        while not sig.stop.wait(0.02):
            if sig.heal.is_set() and world.faults_active:
                world.faults_active = False
            if world.enqueuer_done:
                sig.enqueued.set()
        driver.stop()
        driver.close()
        result.events = [e.as_dict() for e in world.history.events]
        result.faults = dict(world.faults)
        result.jobs = world.jobs
        result.blocked, result.errors = dict(driver.blocked), dict(driver.errors)
        errors = [repr(a.error) for a in driver.actors if a.error is not None]
        result.actor_error = errors[0] if errors else None
    except BaseException as exc:  # the parent reports it as this actor's error
        result.actor_error = f"child process: {exc!r}"
    out.send(result)
    out.close()


class _Processes:
    """The parent's side of a process-mode run."""

    def __init__(self, cfg: SimConfig, url: str, speed: float, setup: str | None) -> None:
        self.cfg, self.url, self.speed = cfg, url, speed
        mp = multiprocessing.get_context("spawn")
        self.sig = _Signals(
            counter=mp.Value("q", 0),
            order=CommitOrder.make(mp),
            t0=mp.Value("d", 0.0),
            ready=mp.Semaphore(0),
            go=mp.Event(),
            heal=mp.Event(),
            stop=mp.Event(),
            enqueued=mp.Event(),
        )
        self.children: list[tuple[str, Any, Connection]] = []
        for name in _actor_names(cfg):
            recv, send = mp.Pipe(duplex=False)
            spec = _ChildSpec(name, cfg, url, speed, setup)
            proc = mp.Process(
                target=_child, args=(spec, self.sig, send), name=f"readyq-sim-{name}", daemon=True
            )
            proc.start()
            send.close()
            self.children.append((name, proc, recv))

    def close(self) -> None:
        self.sig.stop.set()
        for _name, proc, recv in self.children:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
            recv.close()

    def wait_ready(self) -> None:
        """Until every child has started (spawned, imported, set up); fail if one died."""
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        for _ in self.children:
            while not self.sig.ready.acquire(timeout=0.2):
                dead = [(n, p.exitcode) for n, p, _ in self.children if p.exitcode is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"stress child processes did not start (exited: {dead}); a script "
                        "that runs the simulator needs an `if __name__ == '__main__':` guard"
                    )

    def quiet(self) -> bool:
        return self.sig.enqueued.is_set() and _open_jobs(self.url) == 0

    def wait(self, clock: ScaledClock, budget: float) -> str:
        """Until quiet, every child gone, or ``budget`` virtual seconds have passed."""
        deadline = clock.now_us() + round(budget * 1e6)
        while clock.now_us() < deadline:
            if self.quiet():
                return "until"
            if not any(proc.is_alive() for _, proc, _ in self.children):
                return "idle"
            time.sleep(0.2)
        return "deadline"

    def drive(self, seconds: float, started: float, server: str) -> RunResult:
        cfg, sig = self.cfg, self.sig
        self.wait_ready()
        sig.t0.value = time.monotonic()
        clock = ScaledClock(self.speed, t0=sig.t0.value)
        start_us = clock.now_us()
        sig.go.set()
        driver = StressDriver(self.url, clock, counter=SharedCounter(sig.counter), order=sig.order)
        world = World(cfg, clock, Streams(cfg.seed), driver, Hooks())
        phases = {"faults": self.wait(clock, seconds)}
        sig.heal.set()
        world.faults_active = False
        world.heal_us = clock.now_us()
        world.log("driver", "note", "heal", world.heal_us)
        if phases["faults"] == "until":
            phases["liveness"] = "already quiet"
        else:
            phases["liveness"] = self.wait(clock, cfg.liveness_budget)
        live = phases["liveness"] in ("until", "already quiet")
        world.log("driver", "note", "stop", clock.now_us())
        sig.stop.set()
        results = []
        for name, _proc, recv in self.children:
            if recv.poll(CHILD_TIMEOUT_S):
                results.append(recv.recv())
            else:
                results.append(_ChildResult(name, actor_error="child process sent no events"))
        driver.close()
        _merge(world, results)
        return RunResult(
            cfg=cfg,
            url=self.url,
            world=world,
            final=_final_read(self.url),
            digest="(stress: not replayable)",
            steps=int(sig.counter.value),
            wall_s=time.perf_counter() - started,
            virtual_s=(clock.now_us() - start_us) / 1e6,
            phases=phases,
            live=live,
            server_version=server,
            stuck=None,
            actor_errors={r.name: r.actor_error for r in results if r.actor_error is not None},
        )


def _run_processes(
    cfg: SimConfig, url: str, speed: float, seconds: float, setup: str | None
) -> RunResult:
    started = time.perf_counter()
    server = _install(url, VirtualClock())
    procs = _Processes(cfg, url, speed, setup)
    try:
        return procs.drive(seconds, started, server)
    finally:
        procs.close()


def _merge(world: World, results: list[_ChildResult]) -> None:
    """Fold the children's histories into ``world``'s, in shared-counter order."""
    rows = [e.as_dict() for e in world.history.events]
    for r in results:
        rows += r.events
        world.faults.update(r.faults)
        world.jobs.update(r.jobs)
        world.driver.blocked.update(Counter(r.blocked))
        world.driver.errors.update(Counter(r.errors))
    rows.sort(key=lambda d: int(d["step"]))
    world.history.events = [
        Event(
            i,
            d["step"],
            d["actor"],
            d["type"],
            d["f"],
            d["now_us"],
            d["job"],
            d["token"],
            d["commit_step"],
            d["detail"],
        )
        for i, d in enumerate(rows)
    ]
    world.enqueuer_done = True
