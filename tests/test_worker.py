"""The Worker: ticks, handlers, limits, fair share, liveness and shutdown on real databases."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import worker_handlers

import readyq
from readyq import Concurrency, Handlers, InvalidJob, JobState, RateLimit, Worker
from readyq._scan import GroupStats

pytestmark = pytest.mark.backend
S = JobState


def ok(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
    return {"n": args.get("n")}


def settle(worker: Worker, timeout: float = 30) -> None:
    """Wait (wall clock) until every dispatched handler of ``worker`` has returned."""
    deadline = time.monotonic() + timeout
    while any(r.outcome is None for r in list(worker._runs.values())):
        assert time.monotonic() < deadline, "handlers did not return"
        time.sleep(0.005)


def drain(worker: Worker, ticks: int = 500) -> None:
    for _ in range(ticks):
        report = worker.tick()
        settle(worker)
        if not report.claimed and not worker.running and worker.queue.counts()["ready"] == 0:
            return


class TestHandlers:
    def test_results_are_stored_with_done(self, queue: readyq.Queue) -> None:
        """A handler's return value becomes the job's result."""
        job = queue.enqueue("ok", {"n": 7})
        drain(Worker(queue, {"ok": ok}, poll_interval=0.01))
        assert (queue.get(job).state, queue.get(job).result) == (S.DONE, {"n": 7})

    def test_raising_handler_is_retried_then_failed(self, queue: readyq.Queue) -> None:
        """Exceptions are failed attempts; the last one fails the job with the error text."""
        calls = []

        def boom(ctx: readyq.JobContext, args: dict[str, Any]) -> None:
            calls.append(ctx.attempt)
            raise RuntimeError("disk full")

        queue.backoff = readyq.Backoff(base=0.001, cap=0.001, jitter=0)
        job = queue.enqueue("boom", max_attempts=2)
        w = Worker(queue, {"boom": boom})
        for _ in range(50):
            w.tick()
            settle(w)
            if queue.get(job).state == S.FAILED:
                break
            time.sleep(0.002)
        info = queue.get(job)
        assert (info.state, info.error, calls) == (S.FAILED, "RuntimeError: disk full", [1, 2])

    def test_unknown_job_type_fails_the_job_and_the_worker_goes_on(
        self, queue: readyq.Queue
    ) -> None:
        """A job no handler knows fails at once with a clear error; other jobs still run."""
        stray = queue.enqueue("nobody-handles-this")
        fine = queue.enqueue("ok")
        drain(Worker(queue, {"ok": ok}))
        info = queue.get(stray)
        assert info.state == S.FAILED
        assert info.error is not None
        assert "no handler for job type 'nobody-handles-this'" in info.error
        assert queue.get(fine).state == S.DONE

    def test_handler_returning_a_non_dict_fails_the_job(self, queue: readyq.Queue) -> None:
        """A result must be a JSON object; anything else fails the job and says so."""
        job = queue.enqueue("bad")
        drain(Worker(queue, {"bad": lambda ctx, args: [1, 2]}))
        info = queue.get(job)
        assert info.state == S.FAILED
        assert "returned list" in (info.error or "")

    def test_handler_returning_non_json_fails_the_job(self, queue: readyq.Queue) -> None:
        """A result JSON cannot hold fails the job instead of crashing the worker."""
        job = queue.enqueue("bad")
        drain(Worker(queue, {"bad": lambda ctx, args: {"x": {1, 2}}}))
        assert queue.get(job).state == S.FAILED

    def test_handlers_registry_decorator_registers_by_type(self, queue: readyq.Queue) -> None:
        """@handlers("type") registers a function for that job type."""
        handlers = Handlers()

        @handlers("greet")
        def greet(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
            return {"hello": args["who"], "key": ctx.idempotency_key}

        job = queue.enqueue("greet", {"who": "world"})
        drain(Worker(queue, handlers))
        assert queue.get(job).result == {"hello": "world", "key": f"readyq:{job}:1"}


class TestConfiguration:
    def test_ttl_shorter_than_two_heartbeats_is_refused(self, queue: readyq.Queue) -> None:
        """lease_ttl < 2 x heartbeat_every is refused with the tradeoff explained."""
        with pytest.raises(InvalidJob, match="at least twice heartbeat_every"):
            Worker(queue, {}, lease_ttl=10, heartbeat_every=6)

    def test_unknown_executor_is_refused(self, queue: readyq.Queue) -> None:
        """Only the documented executors are accepted."""
        with pytest.raises(InvalidJob, match="executor"):
            Worker(queue, {}, executor="fibers")


class TestTick:
    def test_tick_reports_claims_per_group(self, queue: readyq.Queue) -> None:
        """One tick claims up to the free slots and says how many per group."""
        for g in ("a", "a", "b"):
            queue.enqueue("ok", group=g)
        w = Worker(queue, {"ok": ok}, limits=[Concurrency(8)])
        report = w.tick()
        settle(w)
        assert (report.claimed, report.dispatched) == ({"a": 2, "b": 1}, 3)

    def test_concurrency_caps_running_jobs(self, queue: readyq.Queue) -> None:
        """With Concurrency(2) a tick starts at most two jobs while they run."""
        release = threading.Event()
        for _ in range(5):
            queue.enqueue("wait")
        w = Worker(
            queue, {"wait": lambda ctx, args: release.wait(30) and None}, limits=[Concurrency(2)]
        )
        first, second = w.tick(), w.tick()
        release.set()
        settle(w)
        assert (first.dispatched, second.dispatched, w.running) == (2, 0, 2)

    def test_weighted_groups_share_a_saturated_worker_within_one_slot(
        self, queue: readyq.Queue
    ) -> None:
        """Weights 1:2:5, all backlogged: dispatches per group stay within one of the share."""
        weights = {"a": 1, "b": 2, "c": 5}
        with queue.graph() as g:
            for name, w in weights.items():
                for i in range(120):
                    g.add("ok", {"n": i}, group=name, weight=w)
        worker = Worker(queue, {"ok": ok}, limits=[Concurrency(4)])
        served: Counter[str] = Counter()
        worst = 0.0
        while sum(served.values()) < 160:
            report = worker.tick()
            settle(worker)
            served.update(report.claimed)
            total = sum(served.values())
            worst = max(worst, *(abs(served[n] - total * w / 8) for n, w in weights.items()))
        assert worst < 1.5, f"lag {worst:.2f} with {dict(served)}"
        assert served["c"] > served["b"] > served["a"] > 0


class TestEvents:
    def test_without_hooks_claims_and_finalizes_are_still_logged_at_info(
        self, queue: readyq.Queue, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Skipping the events nobody hears must not skip the log: at INFO each is logged."""
        job = queue.enqueue("ok", {"n": 1})
        w = Worker(queue, {"ok": ok}, executor="inline")
        with caplog.at_level("INFO", logger="readyq"):
            w.tick()
            w.tick()
        seen = [(r.readyq_event, r.readyq["job"]) for r in caplog.records]  # type: ignore[attr-defined]
        assert seen == [("claim", job), ("finalize", job)]

    def test_hooks_hear_every_claim_and_finalize_with_logging_off(
        self, queue: readyq.Queue, caplog: pytest.LogCaptureFixture
    ) -> None:
        """And the other way round: hooks hear the events while the log is quiet."""
        jobs = [queue.enqueue("ok", {"n": i}) for i in range(3)]
        heard: list[tuple[str, int]] = []
        w = Worker(
            queue, {"ok": ok}, executor="inline", hooks=[lambda e, f: heard.append((e, f["job"]))]
        )
        with caplog.at_level("WARNING", logger="readyq"):
            w.tick()
            w.tick()
        assert sorted(heard) == sorted(
            [("claim", j) for j in jobs] + [("finalize", j) for j in jobs]
        )
        assert caplog.records == []


class TestOneCommitPerTick:
    def test_results_commit_with_the_next_claim(self, queue: readyq.Queue) -> None:
        """A tick that finalizes returned results and claims new jobs commits once."""
        for i in range(4):
            queue.enqueue("ok", {"n": i}, group=f"g{i % 2}")
        w = Worker(queue, {"ok": ok}, limits=[Concurrency(2)], reclaim_every=3600)
        w.tick()  # claims two (and runs the first sweep)
        settle(w)
        commits: list[object] = []

        def commit(conn: object) -> None:
            commits.append(conn)

        sa.event.listen(queue.engine, "commit", commit)
        try:
            report = w.tick()
        finally:
            sa.event.remove(queue.engine, "commit", commit)
        settle(w)
        assert (report.finished, report.dispatched) == (2, 2)
        assert len(commits) == 1

    def test_results_of_a_failed_commit_are_finalized_on_the_next_tick(
        self, queue: readyq.Queue
    ) -> None:
        """If the tick's transaction fails nothing is lost: the results commit next tick,
        and each run's slot is given back once."""
        for i in range(4):
            queue.enqueue("ok", {"n": i})
        limit = Concurrency(2)
        w = Worker(queue, {"ok": ok}, limits=[limit], reclaim_every=3600)
        first = w.tick()
        settle(w)
        real = queue._finalize_encoded_and_claim  # what the tick commits through

        def cut(*args: Any, **kwargs: Any) -> Any:
            queue._finalize_encoded_and_claim = real  # type: ignore[method-assign]
            raise sa.exc.OperationalError("COMMIT", {}, ConnectionError("connection cut"))

        queue._finalize_encoded_and_claim = cut  # type: ignore[method-assign]
        with pytest.raises(sa.exc.OperationalError):
            w.tick()
        assert (limit.held, w.running) == (0, 2)  # returned: slots free, results pending
        report = w.tick()
        settle(w)
        assert (first.dispatched, report.finished, report.dispatched) == (2, 2, 2)
        assert (limit.held, w.running) == (2, 2)
        assert queue.counts()["done"] == 2

    def test_a_result_returned_before_its_deadline_is_not_timed_out(
        self,
        make_queue,
        clock,  # type: ignore[no-untyped-def]
    ) -> None:
        """A handler that returned in time is finalized even if the tick that commits its
        result comes after the deadline: no timeout event, the job is done."""
        q = make_queue(clock)
        job = q.enqueue("ok", timeout=1.0)
        events: list[str] = []
        w = Worker(q, {"ok": ok}, reclaim_every=3600, hooks=[lambda e, f: events.append(e)])
        w.tick()
        settle(w)
        clock.advance(5.0)
        w.tick()
        assert "timeout" not in events
        assert q.get(job).state == S.DONE


class TestLimits:
    def test_rate_limit_admits_its_rate_plus_burst(self) -> None:
        """A token bucket of 5/s, burst 2, admits 52 starts in 10 s when asked constantly."""
        limit = RateLimit(5, burst=2)
        started = 0
        for step in range(1001):  # every 10 ms from 0 s to 10 s inclusive
            now = step / 100
            while limit.available(now) > 0:
                limit.acquire(None, now)  # type: ignore[arg-type]
                started += 1
        assert started == 52

    def test_worker_under_rate_limit_starts_jobs_at_that_rate(
        self,
        make_queue,
        clock,  # type: ignore[no-untyped-def]
    ) -> None:
        """In 10 virtual seconds at 2 jobs/s (burst 1) the worker starts 21 jobs."""
        q = make_queue(clock)
        with q.graph() as g:
            for i in range(60):
                g.add("ok", {"n": i})
        w = Worker(
            q, {"ok": ok}, limits=[Concurrency(50), RateLimit(2, burst=1)], reclaim_every=1000
        )
        started = 0
        for _ in range(101):
            started += w.tick().dispatched
            settle(w)
            clock.advance(0.1)
        assert started == 21


class TestSlots:
    def test_slot_of_a_lost_lease_is_released_exactly_once(self, queue: readyq.Queue) -> None:
        """Cancelling a running job frees its slot once: at LeaseLost, not again at return."""
        release = threading.Event()
        job = queue.enqueue("wait")
        limit = Concurrency(1)
        w = Worker(
            queue,
            {"wait": lambda ctx, args: release.wait(30) and None},
            limits=[limit],
            lease_ttl=1,
            heartbeat_every=0.01,
        )
        w.tick()
        assert limit.held == 1
        queue.cancel(job)
        time.sleep(0.02)
        w.heartbeat_due()  # finds the lease gone
        held_after_loss = limit.held
        release.set()
        settle_deadline = time.monotonic() + 10
        while any(t.is_alive() for t in threading.enumerate() if t.name == f"readyq-job-{job}"):
            assert time.monotonic() < settle_deadline
            time.sleep(0.01)
        w.tick()
        assert (held_after_loss, limit.held, w.running) == (0, 0, 0)


class TestHandlerThreads:
    @staticmethod
    def _threads_of_a_run(queue: readyq.Queue, jobs: int, slots: int) -> list[threading.Thread]:
        """The thread each of ``jobs`` jobs ran on, in one ``run(until_idle=True)``."""
        seen: list[threading.Thread] = []
        with queue.graph() as g:
            for i in range(jobs):
                g.add("note", {"i": i})
        w = Worker(
            queue,
            {"note": lambda ctx, args: seen.append(threading.current_thread())},
            limits=[Concurrency(slots)],
            poll_interval=0.01,
        )
        w.run(until_idle=True)
        return seen

    def test_a_running_worker_reuses_its_handler_threads(self, queue: readyq.Queue) -> None:
        """40 jobs, 4 slots: run() starts a handler thread per slot, not per job (at most
        one more per slot, for a thread that has not yet parked when the next job comes)."""
        seen = self._threads_of_a_run(queue, 40, 4)
        assert queue.counts()["done"] == 40
        assert len({id(t) for t in seen}) <= 8

    def test_a_handler_runs_on_a_thread_named_after_its_job(self, queue: readyq.Queue) -> None:
        """A reused thread takes the name of the job it runs, as a new one did."""
        names: dict[int, str] = {}
        for _ in range(6):
            queue.enqueue("name")
        w = Worker(
            queue,
            {"name": lambda ctx, args: names.update({ctx.job_id: threading.current_thread().name})},
            limits=[Concurrency(2)],
            poll_interval=0.01,
        )
        w.run(until_idle=True)
        assert names == {job: f"readyq-job-{job}" for job in names}
        assert len(names) == 6

    def test_a_stopped_worker_leaves_no_handler_thread_behind(self, queue: readyq.Queue) -> None:
        """When run() returns, the threads it reused have ended (idle ones are told to)."""
        seen = self._threads_of_a_run(queue, 10, 3)
        for thread in seen:
            thread.join(10)
        assert seen
        assert not [t for t in seen if t.is_alive()]


class TestLiveness:
    def test_hung_handler_is_timed_out_while_heart_beating(self, queue: readyq.Queue) -> None:
        """A handler past its job's timeout is abandoned and the job fails, heartbeats or not."""
        hang = threading.Event()
        job = queue.enqueue("hang", timeout=0.3, max_attempts=1)
        w = Worker(
            queue,
            {"hang": lambda ctx, args: hang.wait(60) and None},
            lease_ttl=5,
            heartbeat_every=0.05,
            reclaim_every=0.05,
        )
        deadline = time.monotonic() + 20
        while queue.get(job).state in (S.RUNNING, S.READY) or w.running:
            assert time.monotonic() < deadline, "job was never timed out"
            w.tick()
            time.sleep(0.02)
        hang.set()
        info = queue.get(job)
        assert (info.state, w.running) == (S.FAILED, 0)
        assert (info.error or "").startswith("timed out after 0.3s")

    def test_graceful_stop_releases_running_jobs(self, queue: readyq.Queue) -> None:
        """stop(): running jobs get the grace period, then their leases are handed back."""
        hang = threading.Event()
        job = queue.enqueue("hang")
        w = Worker(
            queue, {"hang": lambda ctx, args: hang.wait(60) and None}, grace=0.2, poll_interval=0.01
        )
        runner = threading.Thread(target=w.run)
        runner.start()
        while queue.get(job).state != S.RUNNING:
            time.sleep(0.01)
        w.stop()
        runner.join(10)
        hang.set()
        info = queue.get(job)
        assert (runner.is_alive(), info.state, info.attempts) == (False, S.READY, 0)

    @pytest.mark.slow
    def test_killed_worker_process_job_is_finished_by_another_after_the_ttl(
        self, queue_url: str, queue: readyq.Queue
    ) -> None:
        """SIGKILL mid-job: after the lease TTL a second worker process runs the job again."""
        job = queue.enqueue("stall-first")
        env = worker_handlers.ENV
        cmd = worker_handlers.worker_command(
            queue_url, "--lease-ttl", "2", "--heartbeat-every", "0.5", "--poll-interval", "0.1"
        )
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while queue.get(job).state != S.RUNNING:
                assert time.monotonic() < deadline, "first worker never claimed the job"
                time.sleep(0.05)
            os.kill(first.pid, signal.SIGKILL)
            first.wait(10)
        finally:
            first.kill()
        second = subprocess.run(
            [*cmd, "--until-idle"], env=env, capture_output=True, text=True, timeout=90, check=False
        )
        info = queue.get(job)
        assert second.returncode == 0, second.stderr
        assert (info.state, info.attempts, info.result) == (S.DONE, 2, {"attempt": 2})


def test_readyq_worker_command_runs_user_handlers(queue_url: str, queue: readyq.Queue) -> None:
    """`readyq worker --handlers module:attr --until-idle` runs the jobs and exits 0."""
    jobs = [queue.enqueue("echo", {"i": i}) for i in range(3)]
    out = subprocess.run(
        worker_handlers.worker_command(queue_url, "--until-idle"),
        env=worker_handlers.ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert [queue.get(j).result for j in jobs] == [
        {"echo": {"i": i}, "attempt": 1} for i in range(3)
    ]


def test_a_signal_that_lands_inside_the_wait_for_work_still_stops_the_worker(
    queue: readyq.Queue,
) -> None:
    """SIGTERM can arrive while run()'s thread holds the wake Event's lock (inside
    Event.wait); the handler then runs in that thread. It must not take that lock
    itself: it once did, and the worker hung. Here the handler is called from a thread
    holding that lock, as the signal would call it."""
    w = Worker(queue, {})
    restore = w._install_signals()  # the test runs in the main thread
    try:
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler)

        def inside_the_wait() -> None:
            with w._wake._cond:  # held, as Event.wait holds it between its checks
                handler(signal.SIGTERM, None)

        caller = threading.Thread(target=inside_the_wait, daemon=True)
        caller.start()
        caller.join(5)
        assert not caller.is_alive(), "the signal handler blocked on the wake Event's lock"
        assert w._stopping.wait(5)
    finally:
        restore()


class TestWakeUp:
    def test_notify_wakes_a_sleeping_worker_long_before_its_poll(
        self,
        queue: readyq.Queue,
        make_queue,  # type: ignore[no-untyped-def]
    ) -> None:
        """With LISTEN/NOTIFY, a job enqueued while the worker sleeps runs within seconds."""
        if not queue.adapter.listen_notify:
            pytest.skip("needs capability listen_notify")
        ran = threading.Event()
        w = Worker(
            make_queue(),
            {"t": lambda ctx, args: ran.set() and None},
            listen=True,
            poll_interval=60,
            heartbeat_every=30,
            lease_ttl=90,
            reclaim_every=600,
        )
        runner = threading.Thread(target=w.run)
        runner.start()
        try:
            time.sleep(1.0)  # the worker has polled once and sleeps for up to 30 s now
            start = time.monotonic()
            queue.enqueue("t")
            woke = ran.wait(20)
            elapsed = time.monotonic() - start
        finally:
            w.stop()
            runner.join(30)
        assert woke
        assert elapsed < 10, f"took {elapsed:.1f}s: the notification did not wake the worker"

    def test_worker_that_cannot_listen_says_so_and_keeps_polling(self, queue: readyq.Queue) -> None:
        """listen=True on a database without LISTEN logs why, and jobs still run by polling."""
        if queue.adapter.listen_notify:
            pytest.skip("needs a database without capability listen_notify")
        events: list[str] = []
        done = threading.Event()
        job = queue.enqueue("t")
        w = Worker(
            queue,
            {"t": lambda ctx, args: done.set() and None},
            listen=True,
            poll_interval=0.05,
            hooks=[lambda event, fields: events.append(event)],
        )
        runner = threading.Thread(target=w.run, kwargs={"until_idle": True})
        runner.start()
        runner.join(30)
        assert "listen_unavailable" in events
        assert queue.get(job).state == S.DONE


class TestProcessExecutor:
    def test_handler_runs_in_another_process(self, queue: readyq.Queue) -> None:
        """executor='process' runs the handler in a child process and stores its result."""
        job = queue.enqueue("in-process")
        w = Worker(queue, worker_handlers.handlers, executor="process")
        drain(w)
        result = queue.get(job).result
        assert result is not None
        assert result["pid"] != os.getpid()
        assert result["key"] == f"readyq:{job}:1"

    def test_timed_out_handler_process_is_killed(self, queue: readyq.Queue, tmp_path: Path) -> None:
        """A hung handler in a process is killed at its job's timeout, not abandoned."""
        pid_file = tmp_path / "pid"
        # The timeout leaves a loaded machine time to spawn the child and write its pid.
        job = queue.enqueue("pid-then-hang", {"path": str(pid_file)}, timeout=5.0, max_attempts=1)
        w = Worker(queue, worker_handlers.handlers, executor="process", reclaim_every=0.1)
        deadline = time.monotonic() + 60
        while queue.get(job).state in (S.READY, S.RUNNING) or w.running:
            assert time.monotonic() < deadline, "the hung job was never timed out"
            w.tick()
            time.sleep(0.05)
        assert pid_file.exists(), "the handler process never started within its timeout"
        pid = int(pid_file.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert queue.get(job).state == S.FAILED


class TestInlineExecutor:
    def test_inline_handlers_run_on_the_thread_that_runs_the_worker(
        self, queue: readyq.Queue
    ) -> None:
        """executor='inline': no handler thread; every job runs where run() was called."""
        seen: list[threading.Thread] = []
        for i in range(12):
            queue.enqueue("note", {"i": i})
        w = Worker(
            queue,
            {"note": lambda ctx, args: seen.append(threading.current_thread())},
            executor="inline",
            limits=[Concurrency(4)],
            poll_interval=0.01,
        )
        w.run(until_idle=True)
        assert queue.counts()["done"] == 12
        assert [t is threading.current_thread() for t in seen] == [True] * 12

    def test_an_inline_tick_has_run_every_handler_it_dispatched_when_it_returns(
        self, queue: readyq.Queue
    ) -> None:
        """The tick itself runs the claimed handlers; the next tick commits their results."""
        jobs = [queue.enqueue("ok", {"n": n}) for n in range(3)]
        returned: list[int] = []

        def note(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
            returned.append(ctx.job_id)
            return ok(ctx, args)

        w = Worker(queue, {"ok": note}, executor="inline", limits=[Concurrency(5)])
        report = w.tick()
        assert (report.dispatched, returned) == (3, jobs)
        w.tick()
        assert [queue.get(j).result for j in jobs] == [{"n": 0}, {"n": 1}, {"n": 2}]

    def test_an_inline_handler_error_is_a_failed_attempt(self, queue: readyq.Queue) -> None:
        """A raising inline handler fails its job; the worker itself goes on."""

        def boom(ctx: readyq.JobContext, args: dict[str, Any]) -> None:
            raise RuntimeError("disk full")

        bad = queue.enqueue("boom", max_attempts=1)
        good = queue.enqueue("ok", {"n": 1})
        drain(Worker(queue, {"boom": boom, "ok": ok}, executor="inline", poll_interval=0.01))
        assert (queue.get(bad).state, queue.get(good).state) == (S.FAILED, S.DONE)
        assert "disk full" in (queue.get(bad).error or "")

    def test_the_late_result_of_a_hung_inline_handler_is_refused_after_the_sweep(
        self, queue: readyq.Queue
    ) -> None:
        """A hung inline handler stalls its worker, not the job: the sweep times the job
        out, and the result the handler returns afterwards does not overwrite that."""
        release = threading.Event()
        started = threading.Event()

        def hang(ctx: readyq.JobContext, args: dict[str, Any]) -> dict[str, Any]:
            started.set()
            release.wait(30)
            return {"late": True}

        job = queue.enqueue("hang", timeout=0.2, max_attempts=1)
        w = Worker(queue, {"hang": hang}, executor="inline", lease_ttl=30, heartbeat_every=5)
        ticking = threading.Thread(target=w.tick)
        ticking.start()
        assert started.wait(30), "the inline handler never started"
        deadline = time.monotonic() + 20
        while queue.get(job).state == S.RUNNING:
            assert time.monotonic() < deadline, "the sweep never timed the job out"
            time.sleep(0.05)
            queue.sweep()
        release.set()
        ticking.join(30)
        w.tick()  # collects the late result and tries to finalize it
        info = queue.get(job)
        assert (info.state, info.result, w.running) == (S.FAILED, None, 0)
        assert (info.error or "").startswith("timed out")

    def test_an_inline_job_whose_lease_is_lost_before_its_turn_never_runs(
        self, queue: readyq.Queue
    ) -> None:
        """A tick's jobs run one after another; one that a heartbeat found cancelled while
        the one before it ran is ended, and its handler is not called."""
        ran: list[int] = []

        def first(ctx: readyq.JobContext, args: dict[str, Any]) -> None:
            ran.append(ctx.job_id)
            queue.cancel(second)
            time.sleep(0.01)
            w.heartbeat_due()  # renews the leases it holds: the cancelled one is lost

        def other(ctx: readyq.JobContext, args: dict[str, Any]) -> None:
            ran.append(ctx.job_id)

        head = queue.enqueue("first", priority=-1)
        second = queue.enqueue("other")
        w = Worker(
            queue,
            {"first": first, "other": other},
            executor="inline",
            limits=[Concurrency(2)],
            heartbeat_every=0.001,
        )
        assert w.tick().dispatched == 2
        assert (ran, w.running, queue.get(second).state) == ([head], 1, S.CANCELLED)


class TestRankInput:
    def test_groups_out_of_order_rank_as_sorted_ones(self, queue: readyq.Queue) -> None:
        """rank() takes hand-made stats too: unsorted, they rank as the sorted ones."""
        stats = [GroupStats("b", 3, 0, 2.0), GroupStats("a", 3, 0, 1.0)]
        w = Worker(queue, {"ok": ok})
        assert w.rank(stats, 3) == Worker(queue, {"ok": ok}).rank(sorted(stats, key=str), 3)

    @pytest.mark.parametrize(
        ("stats", "match"),
        [
            ([("a", 1, 0, 0.0)], "weight must be finite and > 0"),
            ([("a", 1, 0, 1.0), ("a", 1, 0, 1.0)], "duplicate group name"),
            ([("a", -1, 0, 1.0)], "ready must be >= 0"),
        ],
        ids=["zero weight", "duplicate", "negative ready"],
    )
    def test_invalid_stats_are_refused_by_name(
        self, queue: readyq.Queue, stats: list[tuple[str, int, int, float]], match: str
    ) -> None:
        """Not a scan's groups: every field is checked, as fair_share checks it."""
        with pytest.raises(ValueError, match=match):
            Worker(queue, {"ok": ok}).rank([GroupStats(*s) for s in stats], 1)


def test_a_fault_free_run_reports_no_lost_lease(queue: readyq.Queue) -> None:
    """Heartbeats racing finalizes: a lease that ended by its own finalize is not "lost".

    Regression: the heartbeat thread renewed a job persist() had just finalized and
    reported a false lease_lost for it.
    """
    for i in range(150):
        queue.enqueue("t", {"i": i})
    events: list[str] = []
    w = Worker(
        queue,
        {"t": lambda ctx, args: time.sleep(0.002) and None},
        heartbeat_every=0.005,
        poll_interval=0.005,
        limits=[Concurrency(8)],
        hooks=[lambda event, fields: events.append(event)],
    )
    runner = threading.Thread(target=w.run, kwargs={"until_idle": True})
    runner.start()
    runner.join(120)
    assert queue.counts()["done"] == 150
    assert events.count("finalize") == 150
    assert "lease_lost" not in events
