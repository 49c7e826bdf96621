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

from . import report, ttl
from .checkers import check_all
from .config import FAULT_KINDS, SCENARIOS, SimConfig, scenario
from .run import run
from .shrink import Trace, replay, shrink, step_table
from .stress import MODES, run_stress

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
    p.add_argument(
        "--stress",
        action="store_true",
        help="real threads, no interleaver (true parallelism, not replayable), same checkers",
    )
    p.add_argument(
        "--stress-mode",
        choices=MODES,
        default="thread",
        help="stress: actors on threads of one process, or each in a process of its own",
    )
    p.add_argument("--speed", type=float, default=10.0, help="stress: virtual seconds per wall s")
    p.add_argument(
        "--stress-seconds", type=float, default=40.0, help="stress: virtual seconds with faults"
    )
    p.add_argument("--trace", metavar="PATH", help="write the run's decision list (.json[.gz])")
    p.add_argument("--replay-trace", metavar="PATH", help="replay a recorded decision list")
    p.add_argument(
        "--shrink",
        action="store_true",
        help="on failure, shrink the run's decisions to a short failing schedule",
    )
    p.add_argument("--quick", action="store_true", help="ttl-sweep: fewer cells, one seed")
    p.add_argument("--plot", metavar="PATH", help="ttl-sweep/fair-share plot (needs matplotlib)")
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
    if args.scenario == "ttl-sweep" and not args.replay_trace:
        return _ttl_sweep(args)
    trace: Trace | None = None
    if args.replay_trace:
        trace = Trace.load(args.replay_trace)
        cfg = trace.cfg
        print(f"readyq sim: replaying {args.replay_trace} ({len(trace.schedule)} decisions)")
        res = replay(trace, args.url)
    elif args.stress:
        cfg = cfg.with_(slack_s=max(cfg.slack_s, 5.0))
        mode = f"STRESS ({args.stress_mode}s)"
        print(f"readyq sim: {mode} seed {cfg.seed}, scenario {cfg.scenario} ...", flush=True)
        res = run_stress(
            cfg, args.url, speed=args.speed, seconds=args.stress_seconds, mode=args.stress_mode
        )
    else:
        print(f"readyq sim: seed {cfg.seed}, scenario {cfg.scenario} ...", flush=True)
        res = run(cfg, args.url)
    checks = check_all(res.world, res.final, res.live)
    rep = report.build(res, checks, args.url)
    if args.stress:
        rep["replay"] = "(stress mode is not replayable; rerun with the same flags)"
    status = 0 if rep["ok"] else 1
    if args.trace and not args.stress:
        Trace.of(res).save(args.trace)
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
    if args.shrink and not args.stress:
        _shrink(Trace.of(res) if trace is None else trace, args)
    return status


def _shrink(trace: Trace, args: argparse.Namespace) -> None:
    print("\nshrinking ...", flush=True)
    got = shrink(trace, args.url, log=print)
    if not got.reproduced:
        print("nothing to shrink: the run passes every checker")
        return
    n = len(got.trace.schedule)
    print(
        f"shrunk {len(got.original.schedule)} -> {n} scheduling decisions, "
        f"{len(got.original.faults)} -> {len(got.trace.faults)} faults ({got.runs} replays); "
        f"still fails: {sorted(set(got.failed) & got.target)}"
    )
    for f in got.trace.faults:
        print(f"  fault kept: {f[2]} on {f[0]} (its roll #{f[1]})")
    if got.result is not None:
        print(step_table(got.result, n, tail=60))
        for name, first in got.failed.items():
            print(f"  FAIL {name}: {first}")
    path = args.trace.replace(".json", ".shrunk.json") if args.trace else "trace.shrunk.json"
    got.trace.save(path)
    print(f"shrunk trace written to {path}; replay: python -m readyq_sim --replay-trace {path}")


def _ttl_sweep(args: argparse.Namespace) -> int:
    n = len(ttl.cells(args.quick))
    print(f"readyq sim: ttl-sweep, {n} cells (L = {ttl.TTL:g}s) ...", flush=True)

    def progress(row: ttl.Row) -> None:
        d = row.as_dict()
        print(
            f"  L/h {d['ratio']:g} pause {d['pause']:<5} skew {d['skew']:<8} "
            f"false reclaims {d['false_reclaims']:<3} ({row.wall_s:.1f}s)",
            flush=True,
        )

    seeds = (args.seed,) if args.seed is not None else None
    rows = ttl.sweep(args.quick, args.url, seeds=seeds, progress=progress)
    print()
    print(ttl.text(rows))
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(ttl.markdown(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(ttl.as_json(rows))
    if args.plot and not ttl.plot(rows, args.plot):
        print("--plot skipped: matplotlib is not installed")
    ok = all(r.checker_failures == 0 and r.double_commits == 0 for r in rows)
    print(f"\n{'PASS' if ok else 'FAIL'}: every checker in every cell; double commits 0")
    return 0 if ok else 1
