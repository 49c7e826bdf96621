"""Every example runs as the one command examples/README.md gives, and keeps its promise.

Each example asserts its own outcome and exits non-zero otherwise; these tests run them as
a user would (a fresh interpreter, a temporary SQLite file) and check the closing line.
The examples mostly wait (on a rate limit, a lease TTL), so they run side by side.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import readyq

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: Example -> a line its output contains only when the promised outcome was checked.
PROMISES = {
    "pipeline.py": "pipeline ok: 12 jobs done, the orders branch recovered by one retry",
    "crawler.py": "crawler ok: rate limit held, starts shared by weight",
    "custom_limit.py": "custom limit ok: GPU memory never exceeded",
    "async_enqueue.py": "async enqueue ok: enqueued from asyncio, drained by a Worker",
    "crash_recovery.py": "crash recovery ok: worker-2 finished the job worker-1 was killed in",
}
TIMEOUT = 60


def test_every_example_is_tested_and_listed() -> None:
    """No example escapes CI, and examples/README.md gives each one's command."""
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(PROMISES)
    readme = (EXAMPLES / "README.md").read_text()
    for name in PROMISES:
        assert f"python examples/{name}" in readme, name


@pytest.mark.slow
def test_examples_run_and_keep_their_promises(tmp_path: Path) -> None:
    """`python examples/NAME.py` exits 0 and prints its closing line, for every example.

    pipeline.py gets a database file as its argument (the other form of the command) and
    that file holds its jobs afterwards.
    """
    db = tmp_path / "pipeline-arg.db"
    procs: dict[str, subprocess.Popen[str]] = {}
    for name in sorted(PROMISES):
        argv = [sys.executable, str(EXAMPLES / name)]
        if name == "pipeline.py":
            argv.append(str(db))
        cwd = tmp_path / name.removesuffix(".py")
        cwd.mkdir()
        procs[name] = subprocess.Popen(
            argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    deadline = time.monotonic() + TIMEOUT
    failures = []
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            failures.append(f"{name} did not finish in {TIMEOUT}s\n{out}\n{err}")
            continue
        if proc.returncode != 0 or PROMISES[name] not in out:
            failures.append(f"{name} exited {proc.returncode}\n{out}\n{err}")
    assert not failures, "\n\n".join(failures)
    with readyq.Queue(f"sqlite:///{db}") as q:
        assert q.counts()["done"] == 12


def test_docs_cite_examples_and_tests_that_exist() -> None:
    """Every example command and test id the user-facing pages cite is real."""
    root = EXAMPLES.parent
    for page in ("docs/when-to-use.md", "docs/vendoring.md", "examples/README.md"):
        text = (root / page).read_text()
        for name in re.findall(r"python examples/(\w+\.py)", text):
            assert (EXAMPLES / name).exists(), (page, name)
        for path, names in re.findall(r"`(tests/\w+\.py)((?:::\w+)*)`", text):
            source = (root / path).read_text()
            for part in names.split("::")[1:]:
                assert re.search(rf"(def|class) {part}\b", source), (page, path, part)
