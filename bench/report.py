"""The terminal table of a bench result (the same dict that ``--json`` writes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["render"]


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    fmt = "  ".join(f"{{:{'<' if i == 0 else '>'}{w}}}" for i, w in enumerate(widths))
    lines = ["", title, fmt.format(*head), "  ".join("-" * w for w in widths)]
    lines += [fmt.format(*r) for r in rows]
    return lines


def _n(x: float) -> str:
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _smm(stats: dict[str, Any]) -> list[str]:
    return [_n(stats["median"]), _n(stats["min"]), _n(stats["max"])]


def _reference(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    ref = result["reference"]
    rows = [[f"{mode} x{n}", *_smm(s)] for mode, by in ref.items() for n, s in by.items()]
    out += _table(
        "Reference: one-row UPDATE ... WHERE id = :id + commit (tx/s)",
        ["clients", "median", "min", "max"],
        rows,
    )
    return out


def _enqueue(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    enq = result["enqueue"]
    rows = [[name, *_smm(s), f"{s['ratio']:.2f}"] for name, s in enq.items() if name != "dag_shape"]
    shape = enq["dag_shape"]
    out += _table(
        f"Enqueue, 1 client (jobs/s; dag = {shape['jobs']} jobs, {shape['edges']} edges "
        "per transaction)",
        ["kind", "median", "min", "max", "x ref"],
        rows,
    )
    return out


def _drain(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    rows = []
    for r in result["drain"]:
        name = f"{r['runner']} {r['mode']} x{r['workers']} limit {r['limit']}"
        if r.get("finalize") == "batch":
            name += ", finalize_many"
        elif r.get("finalize") == "fused":
            name += ", finalize_and_claim"
        if r["runner"] == "worker":
            name = f"Worker {r['mode']} x{r['workers']} {r['groups']} groups, {r['limit']} slots"
            name += f", {r['executor']}"
        extra = f"{r['vs_raw']:.2f}" if r.get("vs_raw") else ""
        rows.append([name, *_smm(r["jobs_per_s"]), f"{r['ratio']:.2f}", extra, *_cpu(r)])
    out += _table(
        "Drain of no-op jobs (jobs/s, first claim to last finalize; x ref = same clients; "
        "CPU ms per job on this machine: the database server's processes, the rest, and "
        "the share of the machine busy)",
        ["runner", "median", "min", "max", "x ref", "x raw", "server", "rest", "busy"],
        rows,
    )
    return out


def _cpu(row: dict[str, Any]) -> list[str]:
    split = row.get("cpu") or {}
    server, rest, busy = (split.get(k) for k in ("server_ms_per_job", "rest_ms_per_job", "busy"))
    return [
        "" if server is None else f"{server:.3f}",
        "" if rest is None else f"{rest:.3f}",
        "" if busy is None else f"{busy:.0%}",
    ]


def _latency(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    lat = result["latency"]
    rows = []
    for how, block in lat.items():
        if not isinstance(block, dict):
            continue
        label = "LISTEN" if how == "listen_notify" else "poll"
        rows += [
            [f"{label} {k.removesuffix('_ms')}", *_smm(block[k])]
            for k in ("p50_ms", "p95_ms", "p99_ms", "enqueue_ms")
        ]
    out += _table(
        f"End-to-end latency, enqueue call -> handler start (ms; poll = Worker "
        f"poll_interval {lat['poll_interval_s']} s; reference tx {lat['reference_tx_ms']:.2f} ms)",
        ["", "median", "min", "max"],
        rows,
    )
    return out


def _scaling(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    rows = []
    for kind, block in result["scaling"].items():
        for size, s in block["sizes"].items():
            rows.append(
                [
                    f"{int(size):,} {kind}",
                    *_smm(s["claim_finalize_ms"]),
                    _n(s["claim_ms"]["median"]),
                ]
            )
        rows.append(
            [
                f"  ratio largest/smallest ({kind})",
                f"{block['ratio_largest_smallest']:.2f}",
                "",
                "",
                f"{block['claim_ratio_largest_smallest']:.2f}",
            ]
        )
    out += _table(
        "Scaling: one claim + finalize (ms, median of single claims) beside filler rows",
        ["rows", "median", "min", "max", "claim only"],
        rows,
    )
    return out


def _backlog(result: dict[str, Any]) -> list[str]:
    block = result["backlog"]
    rows = [
        [f"{int(size):,} ready", *_smm(s["jobs_per_s"]), _n(s["scan_ms"]["median"])]
        for size, s in block["sizes"].items()
    ]
    rows.append(
        [
            "  ratio smallest/largest (jobs/s); largest/smallest (scan)",
            f"{block['ratio_smallest_largest']:.2f}",
            "",
            "",
            f"{block['scan_ratio_largest_smallest']:.2f}",
        ]
    )
    return _table(
        f"Backlog: one Worker ({block['slots']} slots, {block['groups']} weighted groups) "
        f"draining {block['jobs']} jobs beside a ready backlog (jobs/s)",
        ["backlog", "median", "min", "max", "ms/scan"],
        rows,
    )


def _write_cost(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    cost = result["write_cost"]
    pg = "reference_wal_bytes_per_tx" in cost
    head = ["phase", "statements/job", "tx/job", "round trips/job"]
    if pg:
        head += ["updates/job", "HOT/job", "dead tuples/job", "WAL B/job"]
    rows = []
    for name, row in cost.items():
        if not isinstance(row, dict):
            continue
        line = [
            name,
            f"{row['statements_per_job']:.2f}",
            f"{row['transactions_per_job']:.2f}",
            f"{row['round_trips_per_job']:.2f}",
        ]
        if pg:
            line += [
                f"{row['upd_per_job']:.2f}",
                f"{row['hot_upd_per_job']:.2f}",
                f"{row['dead_tuples_per_job']:.2f}",
                f"{row['wal_bytes_per_job']:,.0f}",
            ]
        rows.append(line)
    title = "Write cost per job"
    if pg:
        title += f" (reference tx: {cost['reference_wal_bytes_per_tx']:,.0f} WAL bytes)"
    out += _table(title, head, rows)
    return out


def _profile(result: dict[str, Any]) -> list[str]:
    out: list[str] = []
    prof = result.get("profile")
    if prof:
        rows = [
            [
                e["function"],
                f"{100 * e['self_share']:.1f}",
                f"{100 * e['cumulative_share']:.1f}",
                f"{e['calls_per_job']:.1f}",
            ]
            for e in prof["by_self_time"]
        ]
        out += _table(
            f"Profile: single-worker raw drain, limit 1, {prof['jobs']} jobs "
            f"({prof['jobs_per_s_profiled']:.0f} jobs/s under cProfile), by self time",
            ["function", "self %", "cum %", "calls/job"],
            rows,
        )
        pk = ", ".join(f"{k} {100 * v:.0f}%" for k, v in prof["self_time_by_package"].items())
        out += ["", f"Self time by package: {pk}"]
    worker = (prof or {}).get("worker")
    if worker:
        rows = [
            [name, f"{st['ms_per_tick']:.2f}", f"{100 * st['share']:.0f}"]
            for name, st in worker["stages"].items()
        ]
        out += _table(
            f"Worker x1 ({worker['slots']} slots, {worker['groups']} groups, {worker['jobs']} "
            f"jobs in {worker['ticks']} ticks, {worker['jobs_per_s']:.0f} jobs/s): wall time "
            "per tick by stage",
            ["stage", "ms/tick", "% of wall"],
            rows,
        )
    return out


_SECTIONS = [
    ("reference", _reference),
    ("enqueue", _enqueue),
    ("drain", _drain),
    ("latency", _latency),
    ("scaling", _scaling),
    ("backlog", _backlog),
    ("write_cost", _write_cost),
    ("profile", _profile),
]


def render(result: dict[str, Any]) -> str:
    meta = result["meta"]
    out = [
        f"readyq bench: {meta['backend']} ({meta['server']}), {meta['cpus']} CPUs, "
        f"repeat {meta['config']['repeat']} (median, min, max), "
        f"{meta['config']['jobs']} jobs per drain{', QUICK' if meta['config']['quick'] else ''}",
        "tables ANALYZEd after each fill"
        if meta["config"].get("analyze", True)
        else "tables NOT analyzed after filling (--no-analyze): the planner has no statistics",
    ]
    age = meta["config"].get("scan_max_age")
    out.append(f"Workers: scan_max_age {'(the Worker default)' if age is None else f'{age:g} s'}")
    for key, fn in _SECTIONS:
        if result.get(key):
            out += fn(result)
    out += ["", f"Total bench time {meta['elapsed_s']:.0f} s."]
    return "\n".join(out)
