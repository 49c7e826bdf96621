"""The capability and result report, as JSON and Markdown, for attaching to an issue.

It says which database and driver were checked, what the adapter declares and what the
live probes found, and one line per guarantee: PASS, FAIL (with the first assertion),
SKIP (with the reason, e.g. a capability the database does not have) or ERROR.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plugin import SessionState

__all__ = ["build", "markdown", "summary_lines", "write"]

FORMAT = 1

_EXPLAIN = {
    "PASS": "the guarantee held on this database",
    "FAIL": "the guarantee was violated: readyq with this adapter is not safe here",
    "ERROR": "the check itself could not run (setup or teardown failed)",
    "SKIP": "not applicable: the adapter does not declare a capability the check needs",
}


def build(state: SessionState) -> dict[str, Any]:
    caps = state.caps
    capabilities = [r.as_dict() for r in (caps.results.values() if caps else [])]
    problems: list[str] = []
    if caps is not None:
        problems += caps.consistency_errors()
        problems += [
            f"{r['name']}: declared, but the probe found otherwise ({r['detail']})"
            for r in capabilities
            if r["verdict"] == "ERROR"
        ]
    ran = [t for t in state.tests.values() if t.outcome != "not run"]
    totals = Counter(t.outcome for t in ran)
    failed = totals["FAIL"] + totals["ERROR"]
    verdict = "PASS" if ran and not failed and not problems and not state.setup_error else "FAIL"
    return {
        "format": f"readyq-conformance/{FORMAT}",
        "verdict": verdict,
        "generated": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "environment": dict(state.info),
        "setup_error": state.setup_error,
        "capabilities": capabilities,
        "capability_problems": problems,
        "totals": dict(totals),
        "guarantees": [
            {
                "id": t.nodeid,
                "area": t.module,
                "guarantee": t.guarantee,
                "requires": list(t.requires),
                "result": t.outcome,
                "detail": " | ".join(x for x in (t.detail, t.note) if x),
                "seconds": round(t.seconds, 3),
            }
            for t in ran
        ],
        "legend": _EXPLAIN,
    }


def summary_lines(data: dict[str, Any]) -> list[str]:
    env = data["environment"]
    out = [
        f"verdict: {data['verdict']}  "
        + "  ".join(f"{k} {v}" for k, v in sorted(data["totals"].items())),
        f"server: {env.get('server_version', '?')}; driver: {env.get('driver', '?')}; "
        f"adapter: {env.get('adapter', '?')}",
    ]
    if data["setup_error"]:
        out.append(f"setup error: {data['setup_error']}")
    caps = data["capabilities"]
    if caps:
        have = [c["name"] for c in caps if c["declared"]]
        out.append("capabilities declared: " + (", ".join(have) or "none"))
        for c in caps:
            if c["verdict"] in ("ERROR", "unexpected", "unverified"):
                out.append(f"  {c['verdict']}: {c['name']}: {c['detail']}")
    for p in data["capability_problems"]:
        if p.split(":")[0] not in {c["name"] for c in caps if c["verdict"] == "ERROR"}:
            out.append(f"  ERROR: {p}")
    return out


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(data: dict[str, Any]) -> str:
    env = data["environment"]
    lines = [
        "# readyq conformance report",
        "",
        f"**Verdict: {data['verdict']}**  ("
        + ", ".join(f"{v} {k}" for k, v in sorted(data["totals"].items()))
        + f"; generated {data['generated']})",
        "",
        "readyq is a job queue that keeps its jobs in a SQL database and relies on that",
        "database's locking to hand each job to exactly one worker. This report says whether",
        "the database below, used through the named adapter, keeps readyq's guarantees.",
        "",
        "## Environment",
        "",
        "| | |",
        "|---|---|",
    ]
    for key in (
        "server_version",
        "driver",
        "url",
        "database",
        "database_mode",
        "adapter",
        "adapter_option",
        "isolation_level",
        "readyq_version",
        "sqlalchemy_version",
        "python",
        "block_timeout_s",
    ):
        if key in env:
            lines.append(f"| {key.replace('_', ' ')} | {_cell(env[key])} |")
    if data["setup_error"]:
        lines += ["", f"**Setup error:** {_cell(data['setup_error'])}"]
    lines += [
        "",
        "## Capabilities",
        "",
        "*Declared* is what the adapter says; *probed* is what a live check on this database",
        "found. A declared capability the probe refutes is an error; one that works without",
        "being declared is reported as *unexpected* (the adapter could declare it).",
        "",
        "| capability | meaning | declared | probed | verdict | what the probe saw |",
        "|---|---|---|---|---|---|",
    ]
    for c in data["capabilities"]:
        probed = {True: "works", False: "absent", None: "n/a"}[c["works"]]
        lines.append(
            f"| {c['name']} | {_cell(c['meaning'])} | {'yes' if c['declared'] else 'no'} | "
            f"{probed} | {c['verdict']} | {_cell(c['detail'])} |"
        )
    if data["capability_problems"]:
        lines += ["", "**Capability problems:**", ""]
        lines += [f"- {_cell(p)}" for p in data["capability_problems"]]
    lines += ["", "## Guarantees", ""]
    lines += [f"- **{k}**: {v}" for k, v in data["legend"].items()]
    area = None
    for g in data["guarantees"]:
        if g["area"] != area:
            area = g["area"]
            lines += [
                "",
                f"### {_cell(area)}",
                "",
                "| result | guarantee | detail |",
                "|---|---|---|",
            ]
        needs = f" *(needs {', '.join(g['requires'])})*" if g["requires"] else ""
        lines.append(
            f"| {g['result']} | {_cell(g['guarantee'])}{needs} | {_cell(g['detail'])[:400]} |"
        )
    lines.append("")
    return "\n".join(lines)


def write(data: dict[str, Any], path: str) -> list[str]:
    """Write ``data`` as JSON and Markdown next to ``path``; returns the files written."""
    base, ext = os.path.splitext(path)
    if ext.lower() not in (".json", ".md"):
        base = path
    json_path, md_path = base + ".json", base + ".md"
    with open(json_path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, default=str)
    with open(md_path, "w", encoding="utf-8") as fh:
        fh.write(markdown(data))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as fh:
            fh.write(markdown(data))
    return [json_path, md_path]
