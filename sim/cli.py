"""``readyq sim``: run a seeded simulation against a real database and report.

Exit status: 0 when every checker passes, 1 when any fails (or the run is not
deterministic under ``--check-determinism``), 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
from collections.abc import Sequence

from . import report
from .checkers import check_all
from .config import FAULT_KINDS, SCENARIOS, SimConfig, scenario
from .run import run

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="readyq sim", description=__doc__.splitlines()[0])
    p.add_argument(
        "--url",
        help="database URL (default: a temporary SQLite file); "
        "on a server, a fresh readyq_sim_<hex> database is created and dropped",
    )
    p.add_argument("--seed", type=int, help="root seed (default: random, printed)")
    p.add_argument("--scenario", default="default", choices=sorted(SCENARIOS))
    p.add_argument("--workers", type=int)
    p.add_argument("--jobs", type=int)
    p.add_argument("--steps", type=int, help="driver steps with faults active")
    p.add_argument(
        "--faults",
        default=None,
        help=f"on (swarm: drawn from the seed), off, or a comma list of {','.join(FAULT_KINDS)}",
    )
    p.add_argument(
        "--check-determinism",
        action="store_true",
        help="run the seed twice on fresh databases and compare step digests",
    )
    p.add_argument("--json", metavar="PATH", help="write the report as JSON")
    p.add_argument("--markdown", metavar="PATH", help="write the report as Markdown")
    p.add_argument("-q", "--quiet", action="store_true", help="only the verdict line")
    return p


def config_from(args: argparse.Namespace) -> SimConfig:
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    kinds: tuple[str, ...] | None = None
    if args.faults not in (None, "on", "swarm"):
        kinds = () if args.faults == "off" else tuple(k.strip() for k in args.faults.split(","))
        unknown = set(kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kind(s) {sorted(unknown)}; known: {FAULT_KINDS}")
    cfg = scenario(args.scenario, seed, kinds)
    changes = {k: getattr(args, k) for k in ("workers", "jobs", "steps") if getattr(args, k)}
    return cfg.with_(**changes) if changes else cfg


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(list(argv) if argv is not None else None)
    try:
        cfg = config_from(args)
    except ValueError as exc:
        print(f"readyq sim: {exc}", file=sys.stderr)
        return 2
    print(f"readyq sim: seed {cfg.seed}, scenario {cfg.scenario} ...", flush=True)
    res = run(cfg, args.url)
    checks = check_all(res.world, res.final, res.live)
    rep = report.build(res, checks, args.url)
    status = 0 if rep["ok"] else 1
    if args.check_determinism:
        again = run(cfg, args.url)
        same = again.digest == res.digest and again.steps == res.steps
        rep["determinism"] = {"digest_1": res.digest, "digest_2": again.digest, "same": same}
        if not same:
            status = 1
            first = next(
                (i for i, (a, b) in enumerate(zip(res.trace, again.trace, strict=False)) if a != b),
                min(len(res.trace), len(again.trace)),
            )
            rep["determinism"]["first_divergence"] = {
                "step": first,
                "run_1": res.trace[first] if first < len(res.trace) else None,
                "run_2": again.trace[first] if first < len(again.trace) else None,
            }
    if args.quiet:
        print(f"{'PASS' if status == 0 else 'FAIL'} seed {cfg.seed}; replay: {rep['replay']}")
    else:
        print(report.text(rep, res, checks))
        if "determinism" in rep:
            d = rep["determinism"]
            print(
                f"determinism: {'SAME' if d['same'] else 'DIFFERENT'} digests "
                f"{d['digest_1']} / {d['digest_2']}"
            )
            if not d["same"]:
                print(f"  first divergence: {d['first_divergence']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rep, fh, indent=2, default=str)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(report.markdown(rep))
    return status
