"""The TTL tradeoff experiment: lease TTL / heartbeat ratio x pauses x clock skew.

Every cell runs the same small, saturated workload (2 workers, 8 jobs lasting L to 3L) with
the lease TTL fixed at readyq's default L = 30 s and the heartbeat period h = L / ratio, the
sweep every S = L / 2 (``readyq.Worker``'s ``reclaim_every`` default), workers crashing now
and then. Pauses (GC-like, no heartbeats) strike at half of a worker's wake-ups; skewed
workers' clocks are off by exactly +h or -h. readyq takes "now" from the writer's clock, so a
worker whose clock lags writes lease expiries early.

Per cell, over a fixed seed set: false reclaims (a live worker's lease reclaimed: it comes
back to LeaseLost, and the job ran twice), stale finalizes rejected by fencing (each one a
double commit without fencing), double commits with fencing (must be 0), recovery latency
from a crash to the sweep that reclaims its lease against the band [L - h, L] + [0, S],
heartbeat writes, jobs that failed because false reclaims used up their attempts, and whether every
checker passed.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .checkers import check_all
from .config import FaultPlan, SimConfig
from .run import RunResult, run

__all__ = ["Cell", "cells", "markdown", "measure", "plot", "sweep", "text"]

RATIOS = (1.5, 2.0, 3.0, 5.0, 8.0)
PAUSES = ("none", "exp", "heavy")
SKEWS = (0, 1)  # multiples of h
TTL = 30.0
SEEDS = (1, 2)

PAUSE_LABEL = {"none": "none", "exp": "exp h/2", "heavy": "heavy h/2"}


@dataclass(frozen=True)
class Cell:
    ratio: float
    pause: str
    skew: int  # 0, or 1: every worker off by exactly +h or -h

    @property
    def h(self) -> float:
        return TTL / self.ratio

    def config(self, seed: int) -> SimConfig:
        h = self.h
        p: dict[str, float] = {"crash": 0.04}
        if self.pause != "none":
            p["pause"] = 0.5
        if self.skew:
            p["skew"] = 1.0
        return SimConfig(
            seed=seed,
            scenario="ttl-sweep",
            workers=2,
            jobs=8,
            steps=10**7,  # faults stay on until the run is quiet
            ttl=TTL,
            heartbeat=h,
            sweep_interval=TTL / 2,
            poll=1.0,
            claim_limit=1,
            work_min=TTL,
            work_max=3 * TTL,
            poison=0.0,
            hang=0.0,
            dag_share=0.0,
            backlog=True,
            fair_share=False,
            faults=FaultPlan(p),
            pause_dist=self.pause,
            pause_mean=h / 2,
            skew_s=self.skew * h,
            liveness_budget=1200.0,
            quiet_check_s=10.0,
        )


def cells(quick: bool = False) -> list[Cell]:
    ratios = (1.5, 3.0, 8.0) if quick else RATIOS
    return [Cell(r, p, s) for r in ratios for p in PAUSES for s in SKEWS]


@dataclass
class Row:
    cell: Cell
    runs: int = 0
    heartbeats: int = 0
    false_reclaims: int = 0
    stale_finalizes: int = 0
    double_commits: int = 0
    failed_jobs: int = 0
    checker_failures: int = 0
    worker_seconds: float = 0.0
    recovery: list[float] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def band(self) -> tuple[float, float]:
        h = self.cell.h
        return TTL - h, TTL + TTL / 2

    def as_dict(self) -> dict[str, Any]:
        rec = sorted(self.recovery)
        lo, hi = self.band
        return {
            "ratio": self.cell.ratio,
            "heartbeat_s": round(self.cell.h, 3),
            "pause": self.cell.pause,
            "skew": f"+/-{self.cell.h:g}s" if self.cell.skew else "0",
            "runs": self.runs,
            "heartbeats": self.heartbeats,
            "false_reclaims": self.false_reclaims,
            "false_per_100_hb": round(100 * self.false_reclaims / max(1, self.heartbeats), 2),
            "stale_finalizes_rejected": self.stale_finalizes,
            "double_commits": self.double_commits,
            "failed_jobs": self.failed_jobs,
            "hb_writes_per_worker_s": round(self.heartbeats / max(1e-9, self.worker_seconds), 4),
            "recovery_n": len(rec),
            "recovery_min": round(rec[0], 1) if rec else None,
            "recovery_median": round(statistics.median(rec), 1) if rec else None,
            "recovery_max": round(rec[-1], 1) if rec else None,
            "recovery_in_band": sum(1 for x in rec if lo <= x <= hi),
            "band": [round(lo, 1), round(hi, 1)],
            "checkers_ok": self.checker_failures == 0,
            "wall_s": round(self.wall_s, 2),
        }


def reclaim_latencies(res: RunResult) -> list[float]:
    """Virtual seconds from each crash to the sweep that reclaimed a lease it left behind.

    The analytic band is [L - h, L] (the lease was renewed between 0 and h before the crash)
    plus [0, S] (where the sweep's period falls), shifted by the crashed worker's skew.
    """
    expires: dict[tuple[int, int], int] = {}
    pending: list[tuple[int, int]] = []  # (crash time, lease expiry)
    out: list[float] = []
    for e in res.world.history.events:
        if e.f == "claim" and e.type == "ok":
            for job, token, _a, exp, _d, _g in e.detail.get("leases", []):
                expires[(job, token)] = exp
        elif e.f == "heartbeat" and e.type == "ok" and e.job is not None:
            expires[(e.job, e.token or 0)] = int(e.detail.get("expires", 0))
        elif e.f == "fault" and e.detail.get("kind") == "crash":
            for job, token in e.detail.get("leases", []):
                pending.append((e.now_us, expires.get((job, token), e.now_us)))
        elif e.f == "sweep" and e.type == "ok" and e.detail.get("expired"):
            due = [p for p in pending if p[1] < e.now_us]
            out += [(e.now_us - crash) / 1e6 for crash, _ in due]
            pending = [p for p in pending if p not in due]
    return out


def measure(cell: Cell, seeds: Iterable[int] = SEEDS, url: str | None = None) -> Row:
    row = Row(cell)
    for seed in seeds:
        started = time.perf_counter()
        res = run(cell.config(seed), url)
        checks = check_all(res.world, res.final, res.live)
        events = res.world.history.events
        row.runs += 1
        row.heartbeats += sum(1 for e in events if e.f == "heartbeat" and e.type == "ok")
        lost = [e for e in events if e.type == "fail" and e.detail.get("error") == "LeaseLost"]
        row.false_reclaims += len(lost)
        row.stale_finalizes += sum(1 for e in lost if e.f in ("finalize", "fail"))
        single = next(c for c in checks if c.name == "single-finalize")
        row.double_commits += int(single.counts.get("violations", 0))
        row.failed_jobs += sum(1 for r in res.final.values() if r["state"] == "failed")
        row.checker_failures += sum(1 for c in checks if c.ok is False) + (res.stuck is not None)
        row.worker_seconds += res.virtual_s * res.cfg.workers
        row.recovery += reclaim_latencies(res)
        row.wall_s += time.perf_counter() - started
    return row


def sweep(
    quick: bool = False,
    url: str | None = None,
    seeds: Iterable[int] | None = None,
    progress: Callable[[Row], None] | None = None,
) -> list[Row]:
    chosen = tuple(seeds) if seeds is not None else ((1,) if quick else SEEDS)
    rows = []
    for cell in cells(quick):
        row = measure(cell, chosen, url)
        rows.append(row)
        if progress is not None:
            progress(row)
    return rows


_COLS = (
    ("L/h", "ratio"),
    ("h s", "heartbeat_s"),
    ("pause", "pause"),
    ("skew", "skew"),
    ("hb", "heartbeats"),
    ("false reclaims", "false_reclaims"),
    ("per 100 hb", "false_per_100_hb"),
    ("stale fin. rejected", "stale_finalizes_rejected"),
    ("double commits", "double_commits"),
    ("jobs failed", "failed_jobs"),
    ("recovery min/med/max s", "recovery"),
    ("in band", "in_band"),
    ("hb/worker-s", "hb_writes_per_worker_s"),
    ("checkers", "checkers"),
)


def _cells_of(d: dict[str, Any]) -> list[str]:
    out = []
    for _title, key in _COLS:
        if key == "recovery":
            v = (
                "-"
                if d["recovery_min"] is None
                else f"{d['recovery_min']}/{d['recovery_median']}/{d['recovery_max']}"
            )
        elif key == "in_band":
            v = f"{d['recovery_in_band']}/{d['recovery_n']} of {d['band'][0]}-{d['band'][1]}"
        elif key == "checkers":
            v = "PASS" if d["checkers_ok"] else "FAIL"
        elif key == "pause":
            v = PAUSE_LABEL[d["pause"]]
        else:
            v = f"{d[key]:g}" if isinstance(d[key], float) else str(d[key])
        out.append(v)
    return out


def text(rows: list[Row]) -> str:
    table = [[t for t, _ in _COLS]] + [_cells_of(r.as_dict()) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLS))]
    lines = []
    for x in table:
        pairs = enumerate(zip(x, widths, strict=True))
        lines.append("  ".join(c.ljust(w) if i == 2 else c.rjust(w) for i, (c, w) in pairs))
    return "\n".join(lines)


def markdown(rows: list[Row]) -> str:
    head = "| " + " | ".join(t for t, _ in _COLS) + " |"
    sep = "|" + "|".join("---" for _ in _COLS) + "|"
    body = ["| " + " | ".join(_cells_of(r.as_dict())) + " |" for r in rows]
    return "\n".join([head, sep, *body]) + "\n"


def as_json(rows: list[Row]) -> str:
    return json.dumps([r.as_dict() for r in rows], indent=2)


def plot(rows: list[Row], path: str) -> bool:
    """False reclaims per 100 heartbeats against L/h (matplotlib, if installed)."""
    try:
        import matplotlib  # type: ignore[import-not-found,unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4))
    for pause in PAUSES:
        for skew in SKEWS:
            pts = [r for r in rows if r.cell.pause == pause and r.cell.skew == skew]
            if pts:
                ax.plot(
                    [r.cell.ratio for r in pts],
                    [r.as_dict()["false_per_100_hb"] for r in pts],
                    marker="o",
                    label=f"pause {PAUSE_LABEL[pause]}, skew {'±h' if skew else '0'}",
                )
    ax.set_xlabel("lease TTL / heartbeat period (L/h)")
    ax.set_ylabel("false reclaims per 100 heartbeats")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    return True
