"""The readyq command: install, jobs, stats, prune; clear errors; no passwords printed."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest
import worker_handlers

import readyq
from readyq import JobState
from readyq.cli import main


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "readyq", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.backend
class TestCommands:
    def test_install_creates_the_tables(self, db_url: str) -> None:
        """`readyq install` makes a database usable."""
        assert main(["install", "--url", db_url]) == 0
        with readyq.Queue(db_url) as q:
            assert q.counts()["ready"] == 0

    def test_worker_executor_inline_runs_handlers_on_the_main_thread(
        self, queue_url: str, queue: readyq.Queue
    ) -> None:
        """`readyq worker --executor inline` runs each job in the command's own thread."""
        jobs = [queue.enqueue("thread-name") for _ in range(3)]
        proc = subprocess.run(
            worker_handlers.worker_command(queue_url, "--executor", "inline", "--until-idle"),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=worker_handlers.ENV,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        results = [queue.get(j).result or {} for j in jobs]
        assert [r.get("thread") for r in results] == ["MainThread"] * 3
        assert os.getpid() not in {r.get("pid") for r in results}

    def test_jobs_list_shows_jobs(
        self, queue_url: str, queue: readyq.Queue, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`readyq jobs list` prints id, state, group and type."""
        job = queue.enqueue("fetch", group="g1")
        assert main(["jobs", "list", "--url", queue_url]) == 0
        assert f"{job}  ready      g1            fetch" in capsys.readouterr().out

    def test_jobs_show_prints_json(
        self, queue_url: str, queue: readyq.Queue, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`readyq jobs show ID` prints the job as JSON."""
        job = queue.enqueue("fetch", {"u": 1})
        assert main(["jobs", "show", str(job), "--url", queue_url]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert (shown["id"], shown["state"], shown["args"]) == (job, "ready", {"u": 1})

    def test_jobs_cancel_and_retry(self, queue_url: str, queue: readyq.Queue) -> None:
        """`readyq jobs cancel` then `readyq jobs retry` brings the job back."""
        job = queue.enqueue("fetch")
        assert main(["jobs", "cancel", str(job), "--url", queue_url]) == 0
        assert queue.get(job).state == JobState.CANCELLED
        assert main(["jobs", "retry", str(job), "--url", queue_url]) == 0
        assert queue.get(job).state == JobState.READY

    def test_stats_reports_counts_groups_and_workers(
        self, queue_url: str, queue: readyq.Queue, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`readyq stats --json` has counts per state, groups, and running per worker."""
        queue.enqueue("a", group="g1", weight=3)
        queue.enqueue("b", group="g2")
        queue.claim("worker-9", groups=["g2"])
        assert main(["stats", "--json", "--url", queue_url]) == 0
        stats = json.loads(capsys.readouterr().out)
        assert stats["counts"]["ready"] == 1
        assert stats["running_per_worker"] == {"worker-9": 1}
        assert {g["group"]: g["weight"] for g in stats["groups"]} == {"g1": 3.0, "g2": 1.0}

    def test_prune_deletes_old_finished_jobs_only(
        self,
        queue_url: str,
        make_queue,  # type: ignore[no-untyped-def]
        clock,
    ) -> None:
        """Retention: finished jobs older than the cutoff go; others stay."""
        q = make_queue(clock)
        old = q.enqueue("old")
        q.finalize(q.claim("w")[0])
        clock.advance(3 * 86400)
        recent = q.enqueue("recent")
        q.finalize(q.claim("w")[0])
        waiting = q.enqueue("waiting")
        assert q.prune(dt.timedelta(days=2)) == 1
        assert [j.id for j in q.list_jobs()] == [waiting, recent]
        assert old not in [j.id for j in q.list_jobs()]

    def test_prune_keeps_a_container_with_unfinished_children(self, queue: readyq.Queue) -> None:
        """A finished job still needed by unfinished jobs is kept."""
        a = queue.enqueue("a")
        queue.finalize(queue.claim("w")[0])
        queue.enqueue("b", after=[a])
        queue.claim("w")  # b is running: its dependency stays
        assert queue.prune(dt.timedelta(0)) == 0


class TestPruneInBatches:
    """prune() pages through each finished state in (finished_us, id) order, a batch per
    transaction; what it must keep does not stop it from reaching what follows."""

    def test_small_batches_delete_every_old_job_of_every_finished_state(
        self, queue: readyq.Queue
    ) -> None:
        for _ in range(7):
            queue.enqueue("done")
        for lease in queue.claim("w", limit=7):
            queue.finalize(lease)
        for _ in range(3):
            queue.cancel(queue.enqueue("cancelled"))
        failed = queue.enqueue("failed", max_attempts=1)
        queue.fail(queue.claim("w")[0], "boom", retry=False)
        assert queue.get(failed).state == JobState.FAILED
        assert (queue.prune(dt.timedelta(0), batch=2), queue.list_jobs()) == (11, [])

    def test_jobs_still_needed_are_kept_while_later_ones_go(self, queue: readyq.Queue) -> None:
        """The first batch holds only needed jobs: the next batches still run."""
        needed = [queue.enqueue("needed") for _ in range(2)]
        for lease in queue.claim("w", limit=2):
            queue.finalize(lease)
        waiting = queue.enqueue("waiting", after=needed)
        assert [lease.job_id for lease in queue.claim("w")] == [waiting]  # running: needs them
        for _ in range(3):
            queue.enqueue("rest")
        for lease in queue.claim("w", limit=3):
            queue.finalize(lease)
        assert queue.prune(dt.timedelta(0), batch=2) == 3
        assert sorted(j.id for j in queue.list_jobs()) == sorted([*needed, waiting])


def test_unknown_state_filter_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A bad --state says which states exist, with exit status 1."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["install", "--url", url]) == 0
    out = run("jobs", "list", "--state", "nope", "--url", url)
    assert out.returncode == 1
    assert "unknown state 'nope'" in out.stderr


def test_cli_never_prints_the_password_of_a_url(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Errors and banners show URLs with the password hidden."""
    out = run("install", "--url", "postgresql+psycopg://u:s3cret@127.0.0.1:1/db")
    assert out.returncode != 0
    assert "s3cret" not in out.stdout + out.stderr


def test_missing_job_id_is_a_usage_error() -> None:
    """`readyq jobs show` without an id exits 2 with a hint."""
    out = run("jobs", "show")
    assert (out.returncode, "give a job id" in out.stderr) == (2, True)
