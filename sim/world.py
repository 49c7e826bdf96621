"""State shared by the actors of one run: config, history, fault counters, job registry."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from random import Random
from typing import Any

from sqlalchemy.engine import Engine

import readyq

from .clock import VirtualClock
from .config import SimConfig
from .driver import Driver
from .history import Event, History
from .rng import Streams
from .workload import JobSpec

__all__ = ["ActorClock", "Hooks", "JobRecord", "World"]

Ranker = Callable[[Sequence[Any], int], list[str]]


class ActorClock:
    """One actor's view of the authority: ``offset_us`` models skew; remembers its last read.

    readyq takes every "now" from the clock its Queue was given, so an actor's clock is the
    time authority for the writes that actor makes: a worker whose clock lags by d stores
    lease expiries d early in true time.
    """

    def __init__(self, base: VirtualClock) -> None:
        self.base = base
        self.offset_us = 0
        self.last_us = base.now_us()

    def now_us(self) -> int:
        self.last_us = self.base.now_us() + self.offset_us
        return self.last_us

    def monotonic(self) -> float:
        return self.base.monotonic()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        raise RuntimeError("simulated actors never block inside readyq")


@dataclass
class Hooks:
    """Seams for tests (broken variants live in test code, never in readyq)."""

    #: Build an actor's Queue on its engine (default: ``readyq.Queue(engine, clock)``).
    make_queue: Callable[[Engine, ActorClock], readyq.Queue] | None = None
    #: The fair-share ranking function (default: ``readyq.fairshare.fair_share`` if present).
    fair_share: Ranker | None = None
    #: ``GroupDemand`` class for ``fair_share`` (default: readyq.fairshare.GroupDemand).
    group_demand: type | None = None


@dataclass
class JobRecord:
    id: int
    spec: JobSpec
    batch: int
    parents: list[int] = field(default_factory=list)
    container_id: int | None = None


@dataclass
class World:
    cfg: SimConfig
    clock: VirtualClock
    streams: Streams
    driver: Driver
    hooks: Hooks
    history: History = field(default_factory=History)
    faults: Counter[str] = field(default_factory=Counter)
    jobs: dict[int, JobRecord] = field(default_factory=dict)
    faults_active: bool = True
    enqueuer_done: bool = False
    ranker: Ranker | None = None
    demand: type | None = None
    heal_us: int | None = None
    #: Replay: fault decisions to follow, ``(actor, n) -> kind`` for the n-th chance the
    #: actor rolled (0-based); None draws them from the seed.
    fault_script: dict[tuple[str, int], str] | None = None
    #: Every fault decision that came out "yes", as ``(actor, n, kind)``.
    fired: list[tuple[str, int, str]] = field(default_factory=list)
    chances: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.ranker, self.demand = self.hooks.fair_share, self.hooks.group_demand
        if self.ranker is None and self.cfg.fair_share:
            try:
                from readyq import fairshare
            except ImportError:  # pragma: no cover - fair share not written yet
                fairshare = None  # type: ignore[assignment]
            if fairshare is not None:
                self.ranker, self.demand = fairshare.fair_share, fairshare.GroupDemand
        if self.ranker is not None and self.demand is None:
            from readyq import fairshare

            self.demand = fairshare.GroupDemand
        if not self.cfg.fair_share:
            self.ranker = None

    def make_queue(self, engine: Engine, clock: ActorClock) -> readyq.Queue:
        if self.hooks.make_queue is not None:
            return self.hooks.make_queue(engine, clock)
        return readyq.Queue(engine, clock)

    def log(self, actor: str, type: str, f: str, now_us: int, **kw: Any) -> Event:
        return self.history.add(self.driver.step, actor, type, f, now_us, **kw)

    def chance(self, actor: str, rng: Random, kind: str) -> bool:
        """Whether fault ``kind`` strikes ``actor`` now; always draws, so streams stay aligned."""
        roll = rng.random()
        n = self.chances[actor]
        self.chances[actor] += 1
        if not self.faults_active:
            return False
        if self.fault_script is not None:
            hit = self.fault_script.get((actor, n)) == kind
        else:
            hit = roll < self.cfg.faults.p.get(kind, 0.0)
        if hit:
            self.fired.append((actor, n, kind))
        return hit

    def fault(self, kind: str, actor: str, now_us: int, **kw: Any) -> None:
        self.faults[kind] += 1
        self.history.add(self.driver.step, actor, "note", "fault", now_us, kind=kind, **kw)
