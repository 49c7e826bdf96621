"""The run report: text for the terminal, JSON and Markdown for files."""

from __future__ import annotations

import json
import shlex
import statistics
from typing import Any

import sqlalchemy as sa

from .checkers import Check
from .config import FAULT_KINDS
from .run import RunResult

__all__ = ["build", "markdown", "recovery_latencies", "replay_command", "text"]


def replay_command(res: RunResult, url: str | None) -> str:
    cmd = ["python", "-m", "readyq_sim", "--seed", str(res.cfg.seed)]
    if res.cfg.scenario != "default":
        cmd += ["--scenario", res.cfg.scenario]
    cmd += ["--workers", str(res.cfg.workers), "--jobs", str(res.cfg.jobs)]
    cmd += ["--steps", str(res.cfg.steps)]
    if url is not None:
        cmd += ["--url", sa.make_url(url).render_as_string(hide_password=True)]
    return " ".join(shlex.quote(c) for c in cmd)


def recovery_latencies(res: RunResult) -> list[float]:
    """Virtual seconds from a crash to the next claim of each job the crash left leased."""
    events = res.world.history.events
    out: list[float] = []
    for e in events:
        if e.f == "fault" and e.detail.get("kind") == "crash":
            for job, token in e.detail.get("leases", []):
                for later in events[e.i + 1 :]:
                    if later.f == "claim" and later.type == "ok":
                        hit = [ls for ls in later.detail.get("leases", []) if ls[0] == job]
                        if hit and hit[0][1] > token:
                            out.append((later.now_us - e.now_us) / 1e6)
                            break
    return out


def _recovery(res: RunResult) -> dict[str, Any]:
    out = recovery_latencies(res)
    if not out:
        return {"crashes_with_leases": 0}
    return {
        "crashes_with_leases": len(out),
        "min_s": round(min(out), 3),
        "median_s": round(statistics.median(out), 3),
        "max_s": round(max(out), 3),
        "band_s": [
            round(res.cfg.ttl - res.cfg.heartbeat, 3),
            round(res.cfg.ttl + res.cfg.sweep_interval + res.cfg.poll, 3),
        ],
    }


def build(res: RunResult, checks: list[Check], url: str | None) -> dict[str, Any]:
    hist = res.world.history
    false_reclaims = sum(
        1 for e in hist.events if e.type == "fail" and e.detail.get("error") == "LeaseLost"
    )
    hb = sum(1 for e in hist.events if e.f == "heartbeat" and e.type == "ok")
    fair = next((c for c in checks if c.name == "fair-share"), None)
    return {
        "seed": res.cfg.seed,
        "scenario": res.cfg.scenario,
        "ok": all(c.ok is not False for c in checks) and res.stuck is None,
        "replay": replay_command(res, url),
        "database": res.server_version,
        "config": res.cfg.describe(),
        "phases": res.phases,
        "steps": res.steps,
        "wall_s": round(res.wall_s, 3),
        "steps_per_s": round(res.steps / res.wall_s, 1) if res.wall_s else None,
        "virtual_s": round(res.virtual_s, 3),
        "digest": res.digest,
        "faults": {k: res.world.faults.get(k, 0) for k in FAULT_KINDS},
        "would_block": dict(res.world.driver.blocked),
        "db_errors": dict(res.world.driver.errors),
        "checks": [
            {
                "name": c.name,
                "verdict": c.verdict,
                "invariant": c.invariant,
                "counts": c.counts,
                "first_violation": c.first,
                "job": c.job,
            }
            for c in checks
        ],
        "fair_share": None if fair is None else fair.counts.get("table"),
        "ttl": {
            "ttl_s": res.cfg.ttl,
            "heartbeat_s": res.cfg.heartbeat,
            "sweep_s": res.cfg.sweep_interval,
            "recovery_after_crash": _recovery(res),
            "lease_lost": false_reclaims,
            "heartbeat_writes_per_virtual_s": round(hb / res.virtual_s, 3) if res.virtual_s else 0,
        },
        "stuck": res.stuck,
        "actor_errors": res.actor_errors,
    }


def _job_story(res: RunResult, job: int) -> list[str]:
    start = min((e.now_us for e in res.world.history.events), default=0)
    lines = []
    for e in res.world.history.events:
        mine = e.job == job or any(
            ls[0] == job for ls in e.detail.get("leases", []) if isinstance(ls, (list, tuple))
        )
        if mine or (
            e.f == "sweep"
            and e.type == "ok"
            and (e.detail.get("expired") or e.detail.get("timed_out"))
        ):
            lines.append(e.line(start))
    return lines


def text(rep: dict[str, Any], res: RunResult, checks: list[Check]) -> str:
    out = [
        f"readyq sim: seed {rep['seed']}, scenario {rep['scenario']}, on {rep['database']}",
        f"  workers {res.cfg.workers}, jobs {res.cfg.jobs}, steps {res.cfg.steps} (with faults), "
        f"ttl {res.cfg.ttl:g}s, heartbeat {res.cfg.heartbeat:g}s, "
        f"sweep {res.cfg.sweep_interval:g}s",
        f"  fault plan: {rep['config']['faults'] or 'none'}",
        "  faults injected: " + ", ".join(f"{k} {v}" for k, v in rep["faults"].items()),
        f"  phases: {rep['phases']}",
        f"  {rep['steps']} steps in {rep['wall_s']:.2f}s wall ({rep['steps_per_s']} steps/s), "
        f"{rep['virtual_s']:.1f}s virtual; would-block {rep['would_block'] or 0}",
        f"  digest {rep['digest']}",
        "",
        "checkers:",
    ]
    for c in checks:
        counts = ", ".join(
            f"{k} {v}" for k, v in c.counts.items() if k not in ("table",) and v is not None
        )
        out.append(f"  {c.verdict:<5} {c.name:<20} {counts}")
        if c.first:
            out.append(f"        first violation: {c.first}")
    table = rep["fair_share"] or {}
    if table:
        out += ["", "fair share:   group   weight  target  observed  dispatches  max lag"]
        for g, row in table.items():
            lag = "-" if row["max_lag"] is None else f"{row['max_lag']:.2f}"
            out.append(
                f"              {g:<7} {row['weight']:>6g}  {row['target']:>6.1%}  "
                f"{row['observed']:>8.1%}  {row['dispatches']:>10}  {lag:>7}"
            )
    ttl = rep["ttl"]
    rec = ttl["recovery_after_crash"]
    out += [
        "",
        f"TTL: ttl {ttl['ttl_s']:g}s / heartbeat {ttl['heartbeat_s']:g}s / "
        f"sweep {ttl['sweep_s']:g}s",
    ]
    if rec.get("crashes_with_leases"):
        out.append(
            f"  recovery after crash ({rec['crashes_with_leases']} leases): min {rec['min_s']}s, "
            f"median {rec['median_s']}s, max {rec['max_s']}s (expected band {rec['band_s']})"
        )
    else:
        out.append("  recovery after crash: no crash left a lease behind")
    out.append(
        f"  LeaseLost answers {ttl['lease_lost']}, heartbeat writes "
        f"{ttl['heartbeat_writes_per_virtual_s']}/virtual s"
    )
    if rep["stuck"]:
        out.append(f"DRIVER STUCK: {rep['stuck']}")
    if rep["actor_errors"]:
        out.append(f"actor errors: {rep['actor_errors']}")
    bad = next((c for c in checks if c.ok is False and c.job is not None), None)
    if bad is not None and bad.job is not None:
        out += ["", f"history of job {bad.job} (first violation of {bad.name}):"]
        out += ["  " + line for line in _job_story(res, bad.job)]
    out += ["", f"{'PASS' if rep['ok'] else 'FAIL'}; replay: {rep['replay']}"]
    return "\n".join(out)


def markdown(rep: dict[str, Any]) -> str:
    out = [
        f"# readyq sim, seed {rep['seed']} ({rep['scenario']})",
        "",
        f"- database: {rep['database']}",
        f"- steps: {rep['steps']} in {rep['wall_s']} s ({rep['steps_per_s']} steps/s), "
        f"{rep['virtual_s']} s virtual",
        f"- faults: {rep['faults']}",
        f"- digest: `{rep['digest']}`",
        f"- replay: `{rep['replay']}`",
        "",
        "| checker | verdict | counts | first violation |",
        "|---|---|---|---|",
    ]
    for c in rep["checks"]:
        counts = {k: v for k, v in c["counts"].items() if k != "table"}
        out.append(
            f"| {c['name']} | {c['verdict']} | {json.dumps(counts)} "
            f"| {c['first_violation'] or ''} |"
        )
    if rep["fair_share"]:
        out += ["", "| group | weight | target | observed | max lag |", "|---|---|---|---|---|"]
        for g, row in rep["fair_share"].items():
            out.append(
                f"| {g} | {row['weight']} | {row['target']} | {row['observed']} "
                f"| {row['max_lag']} |"
            )
    out += ["", f"TTL: `{json.dumps(rep['ttl'])}`", ""]
    return "\n".join(out)
