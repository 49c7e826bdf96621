"""Traces, replay and shrinking: delta debugging over a run's recorded decisions.

A trace is the run's config plus its decision list: the actor the scheduler picked at every
step, and every fault decision that came out "yes" (``(actor, n, kind)``: the actor's n-th
fault roll). Replaying a trace follows those picks instead of the seed's schedule stream;
once the recorded picks run out, actors run serially (the last one keeps going while it has
statements), so a trace prefix is the only interleaving in the run.

Shrinking a failing trace:

1. bisect the shortest schedule prefix that still fails (the rest of the run is serial);
2. drop the faults one by one, keeping each drop that still fails.

"Fails" means: at least one of the checkers the original trace failed fails again.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .checkers import check_all
from .config import SimConfig
from .run import RunResult, run
from .world import Hooks

__all__ = ["ShrinkResult", "Trace", "failures", "replay", "shrink", "step_table"]


@dataclass
class Trace:
    cfg: SimConfig
    schedule: list[str]
    faults: list[tuple[str, int, str]] = field(default_factory=list)
    server: str = ""

    @staticmethod
    def of(res: RunResult) -> Trace:
        driver, world = res.world.driver, res.world
        return Trace(res.cfg, list(driver.decisions), list(world.fired), res.server_version)

    def prefix(self, n: int) -> Trace:
        return Trace(self.cfg, self.schedule[:n], list(self.faults), self.server)

    def without(self, fault: tuple[str, int, str]) -> Trace:
        kept = [f for f in self.faults if f != fault]
        return Trace(self.cfg, list(self.schedule), kept, self.server)

    def as_dict(self) -> dict[str, Any]:
        return {
            "format": "readyq-sim-trace/1",
            "config": self.cfg.describe(),
            "server": self.server,
            "schedule": self.schedule,
            "faults": [list(f) for f in self.faults],
        }

    def save(self, path: str) -> None:
        data = json.dumps(self.as_dict()).encode()
        if path.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        with open(path, "wb") as fh:
            fh.write(data)

    @staticmethod
    def load(path: str) -> Trace:
        with open(path, "rb") as fh:
            data = fh.read()
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        d = json.loads(data)
        if d.get("format") != "readyq-sim-trace/1":
            raise ValueError(f"{path}: not a readyq sim trace")
        return Trace(
            SimConfig.from_description(d["config"]),
            [str(a) for a in d["schedule"]],
            [(str(a), int(n), str(k)) for a, n, k in d["faults"]],
            str(d.get("server", "")),
        )


def replay(trace: Trace, url: str | None = None, hooks: Hooks | None = None) -> RunResult:
    """Run ``trace``'s config following its recorded decisions."""
    faults = {(a, n): k for a, n, k in trace.faults}
    return run(trace.cfg, url, hooks, script=trace.schedule, fault_script=faults)


def failures(res: RunResult) -> dict[str, str | None]:
    """Failed checkers (name -> first violation), plus ``driver`` if the run got stuck."""
    out = {c.name: c.first for c in check_all(res.world, res.final, res.live) if c.ok is False}
    if res.stuck is not None:
        out["driver"] = res.stuck
    return out


@dataclass
class ShrinkResult:
    original: Trace
    trace: Trace
    target: set[str]
    runs: int
    result: RunResult | None  # the last failing replay of ``trace``
    reproduced: bool

    @property
    def failed(self) -> dict[str, str | None]:
        return {} if self.result is None else failures(self.result)


def shrink(
    trace: Trace,
    url: str | None = None,
    hooks: Hooks | None = None,
    *,
    make_hooks: Callable[[], Hooks] | None = None,
    log: Callable[[str], None] | None = None,
) -> ShrinkResult:
    """The shortest failing schedule prefix of ``trace``, then with every droppable fault
    dropped. ``make_hooks`` builds fresh hooks per candidate (else ``hooks`` is reused)."""
    say = log or (lambda _msg: None)
    runs = 0

    def attempt(candidate: Trace) -> RunResult | None:
        nonlocal runs
        runs += 1
        res = replay(candidate, url, make_hooks() if make_hooks else hooks)
        return res if set(failures(res)) & target else None

    base = replay(trace, url, make_hooks() if make_hooks else hooks)
    runs += 1
    target = set(failures(base))
    if not target:
        return ShrinkResult(trace, trace, target, runs, None, False)
    say(f"reproduced {sorted(target)}; bisecting {len(trace.schedule)} scheduling decisions")
    best, best_res = trace, base
    lo, hi = -1, len(trace.schedule)  # prefix lo passes (assumed), prefix hi fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        got = attempt(trace.prefix(mid))
        say(f"  prefix {mid}: {'fails' if got else 'passes'}")
        if got is not None:
            hi, best, best_res = mid, trace.prefix(mid), got
        else:
            lo = mid
    for fault in list(best.faults):
        candidate = best.without(fault)
        got = attempt(candidate)
        say(f"  without fault {fault}: {'fails' if got else 'passes'}")
        if got is not None:
            best, best_res = candidate, got
    return ShrinkResult(trace, best, target, runs, best_res, True)


_SPACE = re.compile(r"\s+")


def step_table(res: RunResult, upto: int, *, tail: int = 0, width: int = 100) -> str:
    """One line per scheduled step up to ``upto`` (only the last ``tail`` steps if set):
    step, actor, what it sent, and the history events it completed (TigerBeetle-style)."""
    by_step: dict[int, list[str]] = {}
    for line in res.trace:
        step_s, actor, what, *extra = line.split("|")
        step = int(step_s)
        if step > upto:
            break
        what = _SPACE.sub(" ", what).strip()
        rows = extra[-1] if extra else ""
        text = what if what in ("WAKE", "COMMIT", "ROLLBACK") else f"{what[:56]} -> {rows}"
        by_step.setdefault(step, []).append(f"{actor:<9} {text}")
    start = min((e.now_us for e in res.world.history.events), default=0)
    for e in res.world.history.events:
        if e.step <= upto and e.type != "invoke":
            what = f"{e.type} {e.f}" + (f" job {e.job}" if e.job is not None else "")
            what += f" token {e.token}" if e.token is not None else ""
            leases = e.detail.get("leases")
            if leases:
                what += " leases " + ",".join(f"{ls[0]}@{ls[1]}" for ls in leases)
            t = (e.now_us - start) / 1e6
            by_step.setdefault(e.step, []).append(f"{e.actor:<9} = {what} (t={t:.3f}s)")
    steps = sorted(by_step)
    shown = steps[-tail:] if tail else steps
    out = ["step   actor     action"]
    if len(shown) < len(steps):
        hidden = [s for s in steps if s < shown[0]]
        out.append(f"(steps {hidden[0]}-{hidden[-1]} not shown: {len(hidden)} earlier steps)")
    for step in shown:
        for line in by_step[step]:
            out.append(f"{step:<6} {line}"[:width])
    return "\n".join(out)
