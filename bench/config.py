"""Sizes of one bench run: the full defaults, and ``--quick`` (a CI smoke of seconds)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Config"]


@dataclass
class Config:
    url: str | None = None
    repeat: int = 3
    quick: bool = False
    #: Jobs pre-enqueued per drain measurement.
    jobs: int = 2000
    #: ANALYZE the tables after filling them for a drain (PostgreSQL, MySQL/MariaDB), as
    #: autovacuum does on a default server. False: the planner has no statistics (a new
    #: table, or a server without autovacuum), and PostgreSQL plans a small table badly.
    analyze: bool = True
    workers: list[int] = field(default_factory=lambda: [1, 4, 8, 32])
    modes: list[str] = field(default_factory=lambda: ["thread", "process"])
    #: Worker counts of the process mode (None: the same as ``workers``).
    process_workers: list[int] | None = None
    #: Claim ``limit`` values of the raw drain (1 = one job per claim).
    limits: list[int] = field(default_factory=lambda: [1, 10])
    #: Workers of the ``readyq.Worker`` (fair share) variant, in each of ``modes``.
    fair_workers: list[int] = field(default_factory=lambda: [1, 8])
    #: Worker counts of its process mode (None: the same as ``fair_workers``).
    fair_process_workers: list[int] | None = None
    fair_groups: int = 10
    #: ``readyq.Worker(executor=...)`` values the fair-share drain runs with.
    fair_executors: list[str] = field(default_factory=lambda: ["thread", "inline"])
    #: Seconds each reference client runs per repetition.
    ref_seconds: float = 1.0
    enqueue_single: int = 300
    enqueue_batches: dict[int, int] = field(default_factory=lambda: {100: 10, 1000: 3})
    dag_graphs: int = 4
    latency_samples: int = 200
    latency_gap: float = 0.01
    poll_interval: float = 0.005
    #: ``readyq.Worker(scan_max_age=...)`` of every Worker the bench runs (None: its
    #: default). 0 scans on every tick, as every Worker did before the option existed.
    scan_max_age: float | None = None
    finished_sizes: list[int] = field(default_factory=lambda: [1000, 100_000, 1_000_000])
    blocked_sizes: list[int] = field(default_factory=lambda: [100_000])
    #: Ready jobs not due for an hour, one priority more urgent than the claimed ones.
    deferred_sizes: list[int] = field(default_factory=lambda: [100_000])
    scaling_claims: int = 100
    #: Ready jobs waiting while one fair-share Worker drains ``backlog_jobs`` of them.
    backlog_sizes: list[int] = field(default_factory=lambda: [1000, 100_000])
    backlog_jobs: int = 500
    cost_jobs: int = 500
    #: Seconds for PostgreSQL backends to publish their counters (they flush at exit).
    stats_wait: float = 0.5
    profile: bool = False
    profile_jobs: int = 1000
    profile_top: int = 20

    @classmethod
    def quick_defaults(cls) -> Config:
        return cls(
            repeat=1,
            quick=True,
            jobs=40,
            workers=[1, 4, 8],
            process_workers=[2],
            fair_workers=[4],
            fair_process_workers=[2],
            ref_seconds=0.1,
            enqueue_single=20,
            enqueue_batches={100: 1, 1000: 1},
            dag_graphs=1,
            latency_samples=15,
            finished_sizes=[100, 1000],
            blocked_sizes=[1000],
            deferred_sizes=[1000],
            scaling_claims=15,
            backlog_sizes=[100, 1000],
            backlog_jobs=30,
            cost_jobs=40,
            stats_wait=0.3,
            profile_jobs=100,
        )

    def drain_variants(self) -> list[tuple[int, str]]:
        """(claim limit, finish) pairs of the raw drain. finish: ``each`` (finalize per
        lease), ``batch`` (one finalize_many per claim; needs limit > 1) or ``fused``
        (finalize_and_claim: a round's results commit with the next claim)."""
        out = []
        for limit in sorted(set(self.limits)):
            out.append((limit, "each"))
            if limit > 1:
                out.append((limit, "batch"))
            out.append((limit, "fused"))
        return out

    def counts(self, mode: str) -> list[int]:
        """Worker counts measured in ``mode``."""
        if mode == "process" and self.process_workers is not None:
            return self.process_workers
        return self.workers

    def fair_counts(self, mode: str) -> list[int]:
        """``readyq.Worker`` counts measured in ``mode``."""
        if mode == "process" and self.fair_process_workers is not None:
            return self.fair_process_workers
        return self.fair_workers

    def client_counts(self, mode: str) -> list[int]:
        """Every client count some section runs in ``mode``: the reference measures each,
        so each figure has a reference with as many clients."""
        return sorted({1, *self.counts(mode), *self.fair_counts(mode)})

    @property
    def warm_jobs(self) -> int:
        """Jobs of the discarded warm-up drain before each configuration."""
        return max(10, self.jobs // 10)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["enqueue_batches"] = {str(k): v for k, v in self.enqueue_batches.items()}
        out.pop("url")
        return out
