"""readyq/ copied into an application as ``myapp._vendor.readyq`` works on its own.

The copy runs in a fresh interpreter that cannot import the installed ``readyq``: ``-S``
keeps site-packages (and the editable install's import hook) off ``sys.path``, and only
the application and links to SQLAlchemy and its one dependency, typing_extensions, are
on ``PYTHONPATH``. A smoke workload (a small DAG with a container, across two groups) runs
through the vendored Queue and Worker, through ``executor="process"``, and through the
vendored command line (``python -m myapp._vendor.readyq``), as docs/vendoring.md says.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

JOBS = '''
"""The application's handlers (module level, so that executor="process" can pickle them)."""
import os

from myapp._vendor import readyq

handlers = readyq.Handlers()


@handlers("step")
def step(ctx, args):
    return {"name": args["name"], "attempt": ctx.attempt, "pid": os.getpid()}
'''

SMOKE = """
import importlib.metadata
import importlib.util
import os
import sys

from myapp._vendor import readyq
from myapp.jobs import handlers


def main() -> None:
    assert importlib.util.find_spec("readyq") is None, "the installed readyq is importable"
    assert not importlib.metadata.entry_points(group="readyq.commands"), "plugins are visible"
    assert readyq.__name__ == "myapp._vendor.readyq"
    q = readyq.Queue(f"sqlite:///{sys.argv[1]}")
    q.install()
    with q.graph() as g:
        box = g.add("step", {"name": "box"}, container=True, group="a")
        fetch = [g.add("step", {"name": f"fetch-{i}"}, parent=box, group="a") for i in range(3)]
        merge = g.add("step", {"name": "merge"}, after=fetch, parent=box, group="b", weight=2)
        g.add("step", {"name": "report"}, after=[box], group="b")
    readyq.Worker(
        q, handlers, limits=[readyq.Concurrency(2)], poll_interval=0.02, lease_ttl=10,
        heartbeat_every=2,
    ).run(until_idle=True)
    counts = q.counts()
    assert counts["done"] == 6 == sum(counts.values()), counts
    assert q.get(merge.id).result["name"] == "merge"

    # executor="process": the child unpickles the vendored module's functions by name.
    job = q.enqueue("step", {"name": "in-a-process"})
    readyq.Worker(
        q, handlers, executor="process", poll_interval=0.02, lease_ttl=10, heartbeat_every=2
    ).run(until_idle=True)
    info = q.get(job)
    assert info.state == readyq.JobState.DONE, (info.state, info.error)
    assert info.result["pid"] != os.getpid(), info.result

    stray = sorted(m for m in sys.modules if m == "readyq" or m.startswith("readyq."))
    assert stray == [], stray
    print("vendored smoke ok", counts["done"] + 1)


# Guarded: executor="process" spawns children that import this file as __main__ again.
if __name__ == "__main__":
    main()
"""


def _vendor(tmp_path: Path) -> dict[str, str]:
    """Lay out the application and its dependencies; return the interpreter's environment."""
    app = tmp_path / "app"
    vendor = app / "myapp" / "_vendor"
    vendor.mkdir(parents=True)
    (app / "myapp" / "__init__.py").write_text("")
    (vendor / "__init__.py").write_text("")
    shutil.copytree(
        ROOT / "readyq", vendor / "readyq", ignore=shutil.ignore_patterns("__pycache__")
    )
    (app / "myapp" / "jobs.py").write_text(JOBS)
    (app / "smoke.py").write_text(SMOKE)
    deps = tmp_path / "deps"
    deps.mkdir()
    for name in ("sqlalchemy", "typing_extensions"):
        spec = importlib.util.find_spec(name)
        assert spec is not None
        assert spec.origin is not None
        source = Path(spec.origin)
        source = source.parent if source.name == "__init__.py" else source
        (deps / source.name).symlink_to(source, target_is_directory=source.is_dir())
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, "PYTHONPATH": os.pathsep.join([str(app), str(deps)])}


def _python(
    tmp_path: Path, env: dict[str, str], *argv: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-S", *argv],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def vendored(tmp_path: Path) -> dict[str, str]:
    return _vendor(tmp_path)


def test_the_installed_readyq_is_not_importable_there(
    tmp_path: Path, vendored: dict[str, str]
) -> None:
    """The check itself works: without the copy, `import readyq` fails in that interpreter."""
    out = _python(tmp_path, vendored, "-c", "import readyq")
    assert out.returncode == 1
    assert "No module named 'readyq'" in out.stderr


@pytest.mark.slow
def test_vendored_copy_runs_a_dag_to_completion(tmp_path: Path, vendored: dict[str, str]) -> None:
    """Queue, graph, containers, Worker (threads and processes) work under another name."""
    out = _python(tmp_path, vendored, "app/smoke.py", str(tmp_path / "smoke.db"))
    assert out.returncode == 0, out.stderr
    assert "vendored smoke ok 7" in out.stdout


@pytest.mark.slow
def test_vendored_command_line_runs_a_worker(tmp_path: Path, vendored: dict[str, str]) -> None:
    """`python -m myapp._vendor.readyq` runs a worker; plugin subcommands do not exist."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    cli = ("-m", "myapp._vendor.readyq")
    enqueue = (
        "from myapp._vendor import readyq\n"
        f"q = readyq.Queue({url!r})\n"
        "q.install()\n"
        "a = q.enqueue('step', {'name': 'a'})\n"
        "q.enqueue('step', {'name': 'b'}, after=[a])\n"
    )
    assert _python(tmp_path, vendored, "-c", enqueue).returncode == 0
    worker = _python(
        tmp_path,
        vendored,
        *cli,
        "worker",
        "--url",
        url,
        "--handlers",
        "myapp.jobs:handlers",
        "--poll-interval",
        "0.05",
        "--until-idle",
    )
    assert worker.returncode == 0, worker.stderr
    listed = _python(tmp_path, vendored, *cli, "jobs", "list", "--url", url)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count(" done ") == 2, listed.stdout
    plugin = _python(tmp_path, vendored, *cli, "sim")
    assert plugin.returncode == 2
    assert "invalid choice: 'sim'" in plugin.stderr
    assert "{install,worker,jobs,stats,prune,demo}" in plugin.stderr
