"""Run configuration, named scenarios, and the seeded fault plan (swarm testing)."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

__all__ = ["FAULT_KINDS", "SCENARIOS", "FaultPlan", "SimConfig", "scenario"]

#: Every fault the simulator knows, in report order.
FAULT_KINDS = (
    "crash",  # worker crash: session killed mid-transaction, or state dropped while working
    "pause",  # worker stops (no heartbeats) for longer than the TTL, then carries on
    "heartbeat_loss",  # one heartbeat is skipped
    "drop_before_commit",  # connection killed just before a finalize's COMMIT
    "drop_after_commit",  # finalize committed, but the worker never saw the answer
    "skew",  # the worker's clock (the one its Queue gets) is offset from the authority
    "slow_commit",  # a finalize's COMMIT is held while virtual time passes and others run
    "hang_in_txn",  # a claim/heartbeat/finalize stalls holding its locks, then commits or is killed
)


#: Rates for kinds that are rolled at every claim, heartbeat and finalize and stall the run
#: for up to twice the TTL (on SQLite every writer waits): a few per run, not dozens.
_RARE = {"hang_in_txn": 0.015}


@dataclass(frozen=True)
class FaultPlan:
    """Per-kind probabilities (per opportunity). Drawn from the seed when ``swarm``."""

    p: dict[str, float] = field(default_factory=dict)

    def on(self, kind: str) -> bool:
        return self.p.get(kind, 0.0) > 0

    @staticmethod
    def none() -> FaultPlan:
        return FaultPlan({})

    @staticmethod
    def swarm(rng: random.Random, kinds: tuple[str, ...] = FAULT_KINDS) -> FaultPlan:
        """Swarm testing: each kind is on with probability 0.6, at a rate drawn from the seed."""
        top = {"crash": 0.06, "pause": 0.08, "heartbeat_loss": 0.2, "skew": 0.5, **_RARE}
        p: dict[str, float] = {}
        for kind in FAULT_KINDS:
            draw_on, rate = rng.random(), rng.uniform(0.3, 1.0) * top.get(kind, 0.1)
            if kind in kinds and draw_on < 0.6:
                p[kind] = round(rate, 4)
        return FaultPlan(p)

    @staticmethod
    def fixed(kinds: tuple[str, ...]) -> FaultPlan:
        """Every listed kind on, at a moderate fixed rate."""
        rate = {"crash": 0.04, "pause": 0.06, "heartbeat_loss": 0.15, "skew": 0.5, **_RARE}
        return FaultPlan({k: rate.get(k, 0.08) for k in kinds})


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float


@dataclass(frozen=True)
class SimConfig:
    seed: int = 1
    scenario: str = "default"
    workers: int = 4
    jobs: int = 60
    #: Driver steps (SQL statements, commits, rollbacks, wake-ups) with faults active.
    steps: int = 4000
    ttl: float = 10.0
    heartbeat: float = 2.5
    sweep_interval: float = 3.0
    poll: float = 0.5
    claim_limit: int = 2
    max_attempts: int = 5
    #: Job run time in virtual seconds, uniform in [min, max].
    work_min: float = 0.5
    work_max: float = 6.0
    #: Share of jobs that always fail (poison), of jobs that hang past their timeout.
    poison: float = 0.05
    hang: float = 0.03
    hang_timeout: float = 8.0
    #: Virtual cost of one driver step.
    step_us: int = 1000
    tenants: tuple[Tenant, ...] = (Tenant("t-a", 1), Tenant("t-b", 2), Tenant("t-c", 5))
    #: Workload shape: share of jobs arriving in DAG batches (chains, fan-in/out, container).
    dag_share: float = 0.5
    #: Everything enqueued at once (a backlog) instead of arriving over time.
    backlog: bool = False
    fair_share: bool = True
    faults: FaultPlan = field(default_factory=FaultPlan.none)
    #: Pause length as a multiple of the TTL.
    pause_ttl: tuple[float, float] = (1.5, 3.0)
    #: How pauses are drawn: ``ttl`` (uniform ``pause_ttl`` x TTL, per ``p["pause"]``), or,
    #: at every wake-up with probability ``p["pause"]``: ``none``, ``exp`` (exponential with
    #: mean ``pause_mean``), ``heavy`` (Lomax/Pareto II, alpha 1.5, mean ``pause_mean``).
    pause_dist: str = "ttl"
    pause_mean: float = 0.0
    #: Clock skew of a skewed worker: None draws uniform(-h, h); a number is +/- that.
    skew_s: float | None = None
    #: Virtual seconds of slack the timing checkers allow on top of the sweep interval.
    slack_s: float = 1.0
    #: Virtual seconds between checks that the run went quiet (each is a query).
    quiet_check_s: float = 1.0
    #: Virtual seconds after healing within which the run must go quiet.
    liveness_budget: float = 600.0
    #: Wall seconds a statement may take before the driver declares itself stuck.
    watchdog: float = 20.0

    def with_(self, **changes: object) -> SimConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def describe(self) -> dict[str, object]:
        out = dataclasses.asdict(self)
        out["faults"] = dict(self.faults.p)
        out["tenants"] = {t.name: t.weight for t in self.tenants}
        return out

    @staticmethod
    def from_description(d: dict[str, object]) -> SimConfig:
        """The inverse of :meth:`describe` (for traces written to disk)."""
        known = {f.name for f in dataclasses.fields(SimConfig)}
        kw: dict[str, object] = {k: v for k, v in d.items() if k in known}
        faults = kw.pop("faults", {})
        tenants = kw.pop("tenants", {})
        if not isinstance(faults, dict) or not isinstance(tenants, dict):
            raise ValueError("a config description has faults and tenants as mappings")
        for k in ("pause_ttl",):
            if isinstance(kw.get(k), list):
                kw[k] = tuple(kw[k])  # type: ignore[arg-type]
        return SimConfig(
            faults=FaultPlan({str(k): float(v) for k, v in faults.items()}),
            tenants=tuple(Tenant(str(k), float(v)) for k, v in tenants.items()),
            **kw,  # type: ignore[arg-type]
        )


def _default(seed: int, kinds: tuple[str, ...] | None) -> SimConfig:
    rng = random.Random(f"{seed}:swarm")  # noqa: S311 -- simulation
    plan = FaultPlan.swarm(rng) if kinds is None else FaultPlan.fixed(kinds)
    return SimConfig(seed=seed, faults=plan)


def _fencing(seed: int, kinds: tuple[str, ...] | None) -> SimConfig:
    chosen = kinds if kinds is not None else ("pause", "drop_after_commit", "drop_before_commit")
    plan = FaultPlan.fixed(chosen)
    if "pause" in plan.p:
        plan = FaultPlan({**plan.p, "pause": 0.3})
    return SimConfig(
        seed=seed,
        scenario="fencing",
        jobs=40,
        workers=4,
        sweep_interval=1.0,
        poison=0.0,
        hang=0.0,
        dag_share=0.3,
        faults=plan,
    )


def _fair_share(seed: int, kinds: tuple[str, ...] | None) -> SimConfig:
    return SimConfig(
        seed=seed,
        scenario="fair-share",
        jobs=240,
        workers=3,
        claim_limit=2,
        steps=20000,
        work_min=0.2,
        work_max=1.0,
        poison=0.0,
        hang=0.0,
        dag_share=0.0,
        backlog=True,
        tenants=(Tenant("t-a", 1), Tenant("t-b", 1), Tenant("t-c", 8)),
        faults=FaultPlan.none() if kinds is None else FaultPlan.fixed(kinds),
    )


def _ttl_sweep(seed: int, kinds: tuple[str, ...] | None) -> SimConfig:
    chosen = kinds if kinds is not None else ("crash", "pause", "heartbeat_loss", "skew")
    return SimConfig(
        seed=seed,
        scenario="ttl-sweep",
        jobs=50,
        workers=4,
        poison=0.0,
        hang=0.05,
        dag_share=0.2,
        faults=FaultPlan({k: 0.5 if k == "skew" else 0.08 for k in chosen}),
    )


def _quiet(seed: int, kinds: tuple[str, ...] | None) -> SimConfig:
    return SimConfig(seed=seed, scenario="quiet", faults=FaultPlan.none())


SCENARIOS = {
    "default": _default,
    "fencing": _fencing,
    "fair-share": _fair_share,
    "ttl-sweep": _ttl_sweep,
    "quiet": _quiet,
}


def scenario(name: str, seed: int, kinds: tuple[str, ...] | None = None) -> SimConfig:
    """The named scenario's config for ``seed`` (``kinds``: fault kinds to force, or None)."""
    try:
        make = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}") from None
    return make(seed, kinds)
