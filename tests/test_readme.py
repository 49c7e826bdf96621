"""The README's example and commands are real: they run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_readme_example_runs_to_completion(tmp_path: Path) -> None:
    """The 15-line example runs both jobs and the container rolls up."""
    block = re.search(r"^```python\n(.*?)^```", README, re.MULTILINE | re.DOTALL)
    assert block
    code = block.group(1) + ("\nassert q.counts()['done'] == 3, q.counts()\nprint('example ok')\n")
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "example ok" in out.stdout


def test_readyq_demo_runs_every_job(tmp_path: Path) -> None:
    """`readyq demo` runs its 18-job DAG to completion on a temporary SQLite file."""
    out = subprocess.run(
        [sys.executable, "-m", "readyq", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "final: done=18" in out.stdout
