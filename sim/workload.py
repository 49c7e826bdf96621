"""The seeded workload: tenants with weights, single jobs, chains, fan-out, fan-in, containers."""

from __future__ import annotations

from dataclasses import dataclass, field
from random import Random

from .config import SimConfig

__all__ = ["Batch", "JobSpec", "make_workload"]


@dataclass
class JobSpec:
    """One job as the enqueuer means it; ``after``/``parent`` index into the batch."""

    name: str
    group: str
    weight: float
    duration: float
    poison: bool = False
    hang: bool = False
    container: bool = False
    after: list[int] = field(default_factory=list)
    parent: int | None = None
    max_attempts: int = 5
    timeout: float | None = None


@dataclass
class Batch:
    index: int
    shape: str
    at: float  # virtual seconds after the start
    jobs: list[JobSpec]


def make_workload(cfg: SimConfig, rng: Random) -> list[Batch]:
    tenants = cfg.tenants
    total_w = sum(t.weight for t in tenants)
    mean = (cfg.work_min + cfg.work_max) / 2
    window = 0.0 if cfg.backlog else cfg.jobs * mean / max(1, cfg.workers) * 0.6
    batches: list[Batch] = []
    made = 0
    while made < cfg.jobs:
        i = len(batches)
        shape = "single"
        if rng.random() < cfg.dag_share:
            shape = rng.choice(["chain", "fan-out", "fan-in", "container"])
        if cfg.backlog:
            # A backlog: every tenant has the same number of jobs, round robin.
            tenant = tenants[i % len(tenants)]
        else:
            tenant = rng.choices(tenants, weights=[t.weight / total_w for t in tenants])[0]

        def job(
            n: int, tenant_name: str = tenant.name, weight: float = tenant.weight, batch: int = i
        ) -> JobSpec:
            spec = JobSpec(
                name=f"b{batch}j{n}",
                group=tenant_name,
                weight=weight,
                duration=round(rng.uniform(cfg.work_min, cfg.work_max), 3),
                max_attempts=cfg.max_attempts,
            )
            roll = rng.random()
            if roll < cfg.poison:
                spec.poison, spec.max_attempts = True, 3
            elif roll < cfg.poison + cfg.hang:
                spec.hang, spec.max_attempts = True, 2
                spec.timeout = cfg.hang_timeout
                spec.duration = cfg.hang_timeout * 20
            return spec

        jobs: list[JobSpec]
        if shape == "chain":
            jobs = [job(n) for n in range(rng.randint(2, 4))]
            for n in range(1, len(jobs)):
                jobs[n].after = [n - 1]
        elif shape == "fan-out":
            jobs = [job(n) for n in range(rng.randint(3, 5))]
            for n in range(1, len(jobs)):
                jobs[n].after = [0]
        elif shape == "fan-in":
            jobs = [job(n) for n in range(rng.randint(3, 5))]
            jobs[-1].after = list(range(len(jobs) - 1))
        elif shape == "container":
            box = job(0)
            box.container, box.poison, box.hang, box.timeout = True, False, False, None
            jobs = [box] + [job(n) for n in range(1, rng.randint(3, 4))]
            for n in range(1, len(jobs)):
                jobs[n].parent = 0
            if len(jobs) > 2:
                jobs[-1].after = [1]
        else:
            jobs = [job(0)]
        at = 0.0 if cfg.backlog else round(rng.uniform(0, window), 3)
        batches.append(Batch(i, shape, at, jobs))
        made += sum(1 for j in jobs if not j.container)
    batches.sort(key=lambda b: (b.at, b.index))
    return batches
