"""A seed replays whatever else runs beside it: other processes, other clients' locks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from readyq_sim.config import scenario
from readyq_sim.run import run

import readyq

pytestmark = pytest.mark.backend

ROOT = Path(__file__).resolve().parent.parent


def _server(backend: Any) -> str | None:
    return None if backend.name == "sqlite" else backend.url


@contextmanager
def _slow_notify_commits(backend: Any) -> Iterator[None]:
    """Another client, in the test's own database, commits NOTIFY transactions back to
    back, each held 50 ms inside its COMMIT (``commit_delay``): the lock PostgreSQL takes
    for a NOTIFY commit is shared by every database, so it is held most of the time.
    50 ms: past the simulator's old 20 ms ``lock_timeout``, and short enough not to stall
    the other tests on the server."""
    stop = threading.Event()
    engine = backend.engine()
    with engine.connect() as conn:
        conn.exec_driver_sql("CREATE TABLE outside_writes (n INTEGER)")
        conn.commit()
        try:
            conn.exec_driver_sql("SET commit_siblings = 0")
            conn.exec_driver_sql("SET commit_delay = 50000")  # microseconds, superuser only
            conn.commit()
        except sa.exc.DBAPIError:
            pytest.skip("slowing commits down (commit_delay) needs a superuser")

        def commit_loop() -> None:
            while not stop.is_set():
                # A write: a commit that wrote no WAL is not flushed, so not delayed.
                conn.exec_driver_sql("INSERT INTO outside_writes VALUES (1)")
                conn.execute(sa.select(sa.func.pg_notify("outside", "")))
                conn.commit()

        thread = threading.Thread(target=commit_loop)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            conn.exec_driver_sql("DROP TABLE outside_writes")
            conn.commit()
    engine.dispose()


def test_a_lock_held_outside_the_run_is_waited_for_and_the_seed_still_replays(
    backend: Any,
) -> None:
    """The run's COMMITs after NOTIFY queue behind other clients' NOTIFY commits (another
    database); they wait, as they would in production, instead of failing as a lock wait
    on a parked actor must, so the statement stream is the one the seed gives alone."""
    with readyq.Queue(backend.engine()) as q:
        if not q.adapter.listen_notify:
            pytest.skip("needs capability listen_notify")
    cfg = scenario("default", 2).with_(jobs=30)
    alone = run(cfg, _server(backend))
    with _slow_notify_commits(backend):
        beside = run(cfg, _server(backend))
    assert not beside.world.driver.errors
    assert (beside.steps, beside.digest) == (alone.steps, alone.digest)


def _digest_in_a_process(url: str | None, hash_seed: str, tmp_path: Path) -> str:
    out = tmp_path / f"run-{hash_seed}.json"
    cmd = [sys.executable, "-m", "readyq_sim", "--seed", "2", "--jobs", "20", "-q"]
    cmd += ["--json", str(out)]
    if url is not None:
        cmd += ["--url", url]
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, timeout=300)
    return str(json.loads(out.read_text())["digest"])


def test_a_seed_gives_the_same_digest_in_processes_with_different_hash_seeds(
    backend: Any, tmp_path: Path
) -> None:
    """A recorded digest is comparable across processes: parameters are recorded in a
    fixed key order, not in set order (which ``PYTHONHASHSEED`` changes)."""
    url = _server(backend)
    assert _digest_in_a_process(url, "1", tmp_path) == _digest_in_a_process(url, "2", tmp_path)
