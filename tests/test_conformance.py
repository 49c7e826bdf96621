"""The conformance suite run on each local backend: readyq's adapters pass, bad ones fail.

Each run is a separate ``pytest -p readyq_conformance.plugin`` process (the bad adapters
patch readyq process-wide). With readyq's own adapter the suite runs without its slow
20-interleaving permutation specs (``readyq conformance --url ...`` runs everything); each
known-bad adapter runs the quick ``core`` subset and must be reported as failing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from readyq_conformance.bad_adapters import BAD_ADAPTERS
from readyq_conformance.provision import kind_of

pytestmark = [pytest.mark.backend, pytest.mark.slow]

SUITE = str(Path(__file__).resolve().parent.parent / "conformance" / "suite")


def run_suite(url: str, report: Path, *args: str) -> tuple[int, dict, str]:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        SUITE,
        "-p",
        "readyq_conformance.plugin",
        "-p",
        "no:cacheprovider",
        "-q",
        "--dburi",
        url,
        "--readyq-database",
        "given",
        "--readyq-report",
        str(report),
        *args,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)
    data = (
        json.loads(report.with_suffix(".json").read_text())
        if report.with_suffix(".json").exists()
        else {}
    )
    return proc.returncode, data, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_readyq_adapter_passes(db_url: str, tmp_path: Path) -> None:
    """readyq's own adapter keeps every guarantee, and the report says so in plain words."""
    rc, data, out = run_suite(db_url, tmp_path / "report", "-m", "not slow")
    assert rc == 0, out
    assert data["verdict"] == "PASS"
    env = data["environment"]
    assert env["server_version"]
    assert env["driver"]
    caps = {c["name"]: c for c in data["capabilities"]}
    assert {"skip_locked", "serialized_writers", "key_share_lock", "update_returning"} <= set(caps)
    assert all(c["verdict"] != "ERROR" for c in caps.values())
    assert {g["result"] for g in data["guarantees"]} <= {"PASS", "SKIP"}
    md = (tmp_path / "report.md").read_text()
    assert "**Verdict: PASS**" in md
    assert "## Capabilities" in md
    assert "## Guarantees" in md


@pytest.mark.parametrize("bad", sorted(BAD_ADAPTERS))
def test_bad_adapter_is_reported_failing(db_url: str, tmp_path: Path, bad: str) -> None:
    """Each known-bad adapter, where it applies, makes the core subset fail."""
    info = BAD_ADAPTERS[bad]
    if kind_of(db_url) not in info.kinds:
        pytest.skip(f"{bad} applies to {', '.join(info.kinds)} only")
    rc, data, out = run_suite(
        db_url,
        tmp_path / "report",
        "-m",
        "core",
        "-x",  # one failure is the verdict; the rest of the subset would only cost time
        "--adapter",
        f"readyq_conformance.bad_adapters:{bad}",
    )
    assert rc == 1, f"the suite did not fail {bad} ({info.breaks}):\n{out}"
    assert data["verdict"] == "FAIL"
    caught = [g["id"].split("::")[-1] for g in data["guarantees"] if g["result"] == "FAIL"]
    caught += [c["name"] for c in data["capabilities"] if c["verdict"] == "ERROR"]
    assert caught, out
    print(f"{bad} on {kind_of(db_url)}: caught by {caught}")
