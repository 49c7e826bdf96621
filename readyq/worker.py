"""The Worker: reclaim -> scan -> rank -> lease -> dispatch -> persist, tick after tick.

Each stage is one method, so tests can drive them one at a time; a tick commits the
results of the last round (persist) with the claim of the next (lease), in one
transaction. All time comes from the queue's :class:`~readyq.clock.Clock`.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import sqlalchemy as sa

from . import _process
from ._scan import GroupStats, RecentScan
from ._threads import HandlerThreads
from .errors import InvalidJob, LeaseLost, ReadyqError
from .fairshare import GroupDemand, _rank_checked, fair_share  # internal seam: see rank()
from .handlers import Handler, Handlers, JobContext
from .job import Lease, encode_payload
from .limits import Concurrency, Limit
from .queue import Queue

__all__ = ["TickReport", "Worker"]

log = logging.getLogger("readyq")

#: Where a Worker runs handlers: ``"thread"`` (default) a thread per running job;
#: ``"process"`` a child process per job, killed on timeout or a lost lease; ``"inline"``
#: the tick's own thread, one job after another (short handlers: no handoff per job, but a
#: handler that hangs stalls this worker until the sweep of another frees its job).
EXECUTORS = ("thread", "process", "inline")
Hook = Callable[[str, dict[str, Any]], None]


@dataclass
class _Run:
    ctx: JobContext
    thread: threading.Thread | None = None
    outcome: tuple[str, Any] | None = None  # ("ok", the result's JSON) | ("error", exc)
    settled: bool = False
    #: Its slots are back in the limits: its handler returned (its result waits for the
    #: tick's commit) or it ended.
    released: bool = False


@dataclass(frozen=True)
class TickReport:
    """What one tick did."""

    reclaimed: int = 0
    claimed: dict[str, int] = field(default_factory=dict)
    dispatched: int = 0
    finished: int = 0
    lost: int = 0


class Worker:
    """Runs handlers for claimed jobs, within limits, sharing slots fairly across groups."""

    def __init__(
        self,
        queue: Queue,
        handlers: Handlers | Mapping[str, Handler],
        *,
        worker_id: str | None = None,
        lease_ttl: float = 30.0,
        heartbeat_every: float = 10.0,
        limits: Iterable[Limit] = (),
        poll_interval: float = 1.0,
        executor: str = "thread",
        reclaim_every: float | None = None,
        grace: float = 30.0,
        group_caps: Mapping[str, int] | None = None,
        hooks: Iterable[Hook] = (),
        listen: bool = False,
        scan_max_age: float = 0.2,
    ) -> None:
        for name, value in (
            ("lease_ttl", lease_ttl),
            ("heartbeat_every", heartbeat_every),
            ("poll_interval", poll_interval),
            ("grace", grace),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise InvalidJob(f"{name} must be a positive number of seconds, not {value!r}")
        if lease_ttl < 2 * heartbeat_every:
            raise InvalidJob(
                f"lease_ttl ({lease_ttl}s) must be at least twice heartbeat_every "
                f"({heartbeat_every}s): one late heartbeat would let another worker reclaim "
                "a live job. Raise lease_ttl (slower crash recovery) or heartbeat more "
                "often (more writes); lease_ttl = 3-4 x heartbeat_every is a good default."
            )
        if not isinstance(queue, Queue):
            raise InvalidJob(f"Worker needs a readyq.Queue, not {type(queue).__name__}")
        if not isinstance(handlers, (Handlers, Mapping)):
            raise InvalidJob(
                "handlers must be a readyq.Handlers or a mapping of job type to function, "
                f"not {type(handlers).__name__}"
            )
        limits = list(limits)
        for limit in limits:
            if not isinstance(limit, Limit):
                raise InvalidJob(
                    f"limits must be readyq.Limit objects (Concurrency, RateLimit, Budget or "
                    f"your subclass), not {limit!r:.60}"
                )
        if reclaim_every is not None and (
            isinstance(reclaim_every, bool)
            or not isinstance(reclaim_every, (int, float))
            or not reclaim_every > 0
        ):
            raise InvalidJob(
                f"reclaim_every must be a positive number of seconds, not {reclaim_every!r}"
            )
        if (
            isinstance(scan_max_age, bool)
            or not isinstance(scan_max_age, (int, float))
            or not 0 <= scan_max_age < float("inf")
        ):
            raise InvalidJob(
                f"scan_max_age must be a number of seconds >= 0 (0: scan on every tick), "
                f"not {scan_max_age!r}"
            )
        for group, cap in (group_caps or {}).items():
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
                raise InvalidJob(f"group_caps[{group!r}] must be a non-negative int, not {cap!r}")
        if executor not in EXECUTORS:
            raise InvalidJob(
                f"executor must be one of {', '.join(map(repr, EXECUTORS))}, not {executor!r}"
            )
        self.executor = executor
        self.queue = queue
        self.handlers = handlers if isinstance(handlers, Handlers) else Handlers(handlers)
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.lease_ttl = float(lease_ttl)
        self.heartbeat_every = float(heartbeat_every)
        self.limits: list[Limit] = limits or [Concurrency(8)]
        self.poll_interval = float(poll_interval)
        self.reclaim_every = float(reclaim_every if reclaim_every is not None else lease_ttl / 2)
        self.grace = float(grace)
        self.group_caps = dict(group_caps or {})
        self.hooks = list(hooks)
        self._clock = queue.clock
        self._runs: dict[int, _Run] = {}
        self._served: dict[str, int] = {}
        #: The last scan, reused by ticks for ``scan_max_age`` seconds (under ``_lock``).
        self._recent = RecentScan(float(scan_max_age))
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._last_reclaim: float | None = None
        self._last_heartbeat = self._clock.monotonic()
        self.listen = listen
        self._listener: threading.Thread | None = None
        self._heartbeats: threading.Thread | None = None
        self._done = threading.Event()
        #: While :meth:`run` runs: handler threads it reuses (else a thread per job).
        self._handler_threads: HandlerThreads[_Run] | None = None

    # -- events -----------------------------------------------------------------------

    def _listened(self) -> bool:
        """Whether an event would reach anyone (a hook, or the log at INFO): when not,
        building each event's fields would be all it costs, a few per job."""
        return bool(self.hooks) or log.isEnabledFor(logging.INFO)

    def _emit(self, event: str, **fields: Any) -> None:
        if not self._listened():
            return
        fields = {"worker": self.worker_id, **fields}
        if log.isEnabledFor(logging.INFO):  # formatting costs more than the event, per job
            log.info(
                "%s %s",
                event,
                " ".join(f"{k}={v}" for k, v in fields.items()),
                extra={"readyq_event": event, "readyq": fields},
            )
        for hook in self.hooks:
            hook(event, fields)

    # -- the tick -----------------------------------------------------------------------

    def tick(self) -> TickReport:
        """One pass of every stage; returns what it did.

        A tick commits once: the results of the handlers that returned are finalized in
        the transaction that claims the next jobs (:meth:`persist_and_lease`). Their
        slots are free for this tick's ranking, and the scan still counts their jobs as
        running: with ``served`` not yet counting them, fair share sees each once.
        """
        finished, lost = self.collect()
        self.check_timeouts()
        if self._heartbeats is None:  # run() heart-beats from its own thread
            self.heartbeat_due()
        reclaimed = self.reclaim_due()
        claimed: dict[str, int] = {}
        ranking: list[str] = []
        if not self._stopping.is_set():
            free = self.free_slots()  # once: the scan's cap must be the slots ranked
            ranking = self.rank(self._ready_set(free), free)
        try:
            done, gone, leases = self.persist_and_lease(ranking)
        except BaseException:
            self._forget_scan()  # what was claimed and finished is unknown: scan again
            raise
        for lease in leases:
            claimed[lease.group] = claimed.get(lease.group, 0) + 1
        asked: dict[str, int] = {}
        for g in ranking:
            asked[g] = asked.get(g, 0) + 1
        short = [g for g, n in asked.items() if claimed.get(g, 0) < n]
        if short:
            # A ranked group had fewer ready jobs than the scan showed (another worker
            # took them, or the scan was reused): the next tick must not rank it again.
            # Only that group: forgetting the whole scan made each group that ran dry
            # cost every worker a scan (a third of an x8 drain's scans: benchmarks.md).
            with self._lock:
                for g in short:
                    self._recent.ran_out(g)
        dispatched = self.dispatch(leases)
        return TickReport(reclaimed, claimed, dispatched, finished + done, lost + gone)

    def reclaim_due(self) -> int:
        """Stage 1: sweep expired leases and hung jobs, every ``reclaim_every`` seconds."""
        now = self._clock.monotonic()
        if self._last_reclaim is not None and now - self._last_reclaim < self.reclaim_every:
            return 0
        self._last_reclaim = now
        counts = self.queue.sweep()
        if counts.total:
            self._forget_scan()  # jobs ready again, and fewer running
            self._emit(
                "reclaim", expired=counts.expired, timed_out=counts.timed_out, failed=counts.failed
            )
        return counts.total

    def free_slots(self) -> int:
        now = self._clock.monotonic()
        return max(0, min(limit.available(now) for limit in self.limits))

    def _ready_set(self, free: int) -> list[GroupStats]:
        """The tick's scan: the last one, brought up to date, if it is younger than
        ``scan_max_age`` and still shows a ready job (see :class:`readyq._scan.RecentScan`),
        else a fresh :meth:`scan`."""
        now = self._clock.monotonic()
        with self._lock:
            recent = self._recent.view(free, now)
        if recent is not None:
            return recent
        stats = self.scan(free)
        with self._lock:
            self._recent.took(stats, free, now)
        return stats

    def _forget_scan(self) -> None:
        with self._lock:
            self._recent.forget()

    def scan(self, free: int | None = None) -> list[GroupStats]:
        """Stage 2: the ready set per group, read up to ``free`` (default: the free slots
        now) ready jobs per group; nothing when no slot is free."""
        free = self.free_slots() if free is None else free
        # Counting past ``free`` cannot change the ranking (readyq.fairshare, "Capped
        # ready counts"), and would make every tick cost O(backlog).
        return self.queue.scan(limit=free) if free > 0 else []

    def rank(self, stats: list[GroupStats], free: int | None = None) -> list[str]:
        """Stage 3: fair share of ``free`` slots (default: the free slots now), counting
        slots groups already hold. Pass the ``free`` the stats were scanned with: ready
        counts capped below the slots ranked could change the ranking."""
        free = self.free_slots() if free is None else free
        if free <= 0 or not stats:
            return []
        with self._lock:
            local: dict[str, int] = {}
            for run in self._runs.values():
                if not run.released:  # a returned run's slot is free this tick
                    local[run.ctx.lease.group] = local.get(run.ctx.lease.group, 0) + 1
        active = {s.group for s in stats}
        # A group that left the backlog forgets its history; one that joins starts at the
        # current virtual time of the others, neither owed a burst nor penalized.
        self._served = {g: n for g, n in self._served.items() if g in active}
        if self._served:
            level = min(self._served[s.group] / s.weight for s in stats if s.group in self._served)
        else:
            level = 0.0
        names: list[str] = []
        readies: list[int] = []
        usage: list[int] = []
        for s in stats:
            served = self._served.setdefault(s.group, int(level * s.weight))
            ready = s.ready
            cap = self.group_caps.get(s.group)
            if cap is not None:
                ready = max(0, min(ready, cap - local.get(s.group, 0)))
            names.append(s.group)
            readies.append(ready)
            usage.append(s.running + served)
        weights = tuple(s.weight for s in stats)
        checked = all(a < b for a, b in pairwise(names)) and all(0 < w < math.inf for w in weights)
        if not checked or min(usage, default=0) < 0 or min(readies, default=0) < 0:
            # Not a scan's (sorted, distinct, valid) groups: fair_share checks every field.
            return fair_share(
                [
                    GroupDemand(s.group, s.weight, s.running, r, self._served[s.group])
                    for s, r in zip(stats, readies, strict=True)
                ],
                free,
            )
        # A scan's groups, as readyq wrote them: rank without a checked object per group.
        return _rank_checked(names, weights, usage, readies, free)

    def lease(self, ranking: list[str]) -> list[Lease]:
        """Stage 4: claim the ranked jobs atomically, falling through taken groups."""
        if not ranking:
            return []
        leases = self.queue.claim(
            self.worker_id, ttl=self.lease_ttl, limit=len(ranking), groups=ranking
        )
        self._claimed(leases)
        return leases

    def _claimed(self, leases: list[Lease]) -> None:
        if not self._listened():
            return  # not even each event's fields
        for lease in leases:
            self._emit(
                "claim",
                job=lease.job_id,
                token=lease.token,
                type=lease.type,
                group=lease.group,
                attempt=lease.attempt,
            )

    def dispatch(self, leases: list[Lease]) -> int:
        """Stage 5: start a handler for each lease."""
        now = self._clock.monotonic()
        runs = []
        for lease in leases:
            runs.append(_Run(JobContext(lease, self.queue, self.lease_ttl)))
            for limit in self.limits:
                limit.acquire(lease, now)
        with self._lock:
            for run in runs:
                self._runs[run.ctx.lease.job_id] = run
                self._recent.claimed(run.ctx.lease.group)
        for run in runs:
            if self.executor == "inline":
                if not run.settled:  # not lost (to a heartbeat) while the ones before ran
                    self._call(run)  # now, in this thread; the next tick collects it
                continue
            name = f"readyq-job-{run.ctx.lease.job_id}"
            if self._handler_threads is not None:
                run.thread = self._handler_threads.start(run, name)
            else:
                run.thread = threading.Thread(
                    target=self._call, args=(run,), daemon=True, name=name
                )
                run.thread.start()
        return len(leases)

    def _call(self, run: _Run) -> None:
        lease = run.ctx.lease
        fn = self.handlers.get(lease.type)
        try:
            if fn is None:
                raise InvalidJob(
                    f"no handler for job type {lease.type!r} (this worker has "
                    f"{', '.join(self.handlers.types()) or 'none'})"
                )
            if self.executor == "process":
                kind, result = _process.run(fn, lease, run.ctx.lost)
                if kind == "error":
                    raise result
            else:
                result = fn(run.ctx, dict(lease.args))
            if result is not None and not isinstance(result, dict):
                raise InvalidJob(
                    f"handler for {lease.type!r} returned {type(result).__name__}; "
                    "return a dict (JSON object) or None"
                )
            # Checked and encoded here, once, in the handler's thread rather than the tick's.
            run.outcome = ("ok", encode_payload(result, "result") if result else "{}")
        except BaseException as exc:
            run.outcome = ("error", exc)
        if self.executor != "inline":  # inline: the tick itself collects it next
            self._wake.set()

    def collect(self) -> tuple[int, int]:
        """Stage 0: settle the runs that returned an error or lost their lease (each its
        own write), and free the slots of those that returned a result: the result waits
        for :meth:`persist_and_lease`. Returns (finished, lost)."""
        with self._lock:
            done = [r for r in self._runs.values() if r.outcome is not None and not r.released]
        finished = lost = 0
        returned = []
        for run in done:
            lease = run.ctx.lease
            assert run.outcome is not None
            kind, value = run.outcome
            try:
                if run.ctx.lost.is_set():
                    raise LeaseLost(
                        f"job {lease.job_id}: {run.ctx.reason}", lease.job_id, lease.token
                    )
                if kind == "ok":
                    returned.append(run)
                    continue
                permanent = isinstance(value, ReadyqError)
                outcome = self.queue.fail(lease, value, retry=not permanent)
                self._emit(
                    "fail",
                    job=lease.job_id,
                    token=lease.token,
                    state=outcome.state.value,
                    error=repr(value)[:200],
                )
                finished += 1
            except LeaseLost as exc:
                lost += 1
                self._emit("lease_lost", job=lease.job_id, token=lease.token, reason=str(exc))
            self._end(run)
        self._release(*returned)
        return finished, lost

    def persist_and_lease(self, ranking: list[str]) -> tuple[int, int, list[Lease]]:
        """Stages 6 and 4 in one transaction: finalize the results :meth:`collect` set
        aside and claim the ranked jobs (:meth:`Queue.finalize_and_claim`).

        If the transaction fails it raises, nothing is recorded or claimed, and the
        results wait for the next tick (a finalize that did commit comes back replayed).
        Returns (finished, lost, leases).
        """
        with self._lock:
            results = [r for r in self._runs.values() if r.released and not r.settled]
        if not results:
            return 0, 0, self.lease(ranking)
        # Released with an "ok" outcome only: its value is the result, encoded.
        items = [(run.ctx.lease, run.outcome[1] if run.outcome else "{}") for run in results]
        # Without a ranking, claim nothing: an empty group list.
        outcomes, leases = self.queue._finalize_encoded_and_claim(
            items, self.worker_id, self.lease_ttl, max(1, len(ranking)), ranking
        )
        lost = sum(isinstance(got, LeaseLost) for got in outcomes)
        finished = len(outcomes) - lost
        if self._listened():
            for run, got in zip(results, outcomes, strict=True):
                lease = run.ctx.lease
                if isinstance(got, LeaseLost):
                    self._emit("lease_lost", job=lease.job_id, token=lease.token, reason=str(got))
                else:
                    self._emit("finalize", job=lease.job_id, token=lease.token)
        self._end(*results)
        self._claimed(leases)
        return finished, lost, leases

    def persist(self) -> tuple[int, int]:
        """Stage 6 alone: finalize (in one transaction) or fail the runs whose handler
        returned. Returns (finished, lost)."""
        finished, lost = self.collect()
        done, gone, _ = self.persist_and_lease([])
        return finished + done, lost + gone

    def _release(self, *runs: _Run) -> None:
        """Give each run's slots back to the limits, once."""
        with self._lock:
            freed = [run for run in runs if not run.released]
            for run in freed:
                run.released = True
        if not freed:
            return
        now = self._clock.monotonic()
        for run in freed:
            for limit in self.limits:
                limit.release(run.ctx.lease, now)

    def _end(self, *runs: _Run) -> None:
        """Each run's slot ends exactly once, whatever happened to its lease."""
        with self._lock:
            ending = [run for run in runs if not run.settled]
            for run in ending:
                run.settled = True
                self._runs.pop(run.ctx.lease.job_id, None)
                group = run.ctx.lease.group
                self._served[group] = self._served.get(group, 0) + 1
                self._recent.ended(group)
        self._release(*ending)

    def check_timeouts(self) -> None:
        """Abandon runs past their hang deadline: their late result will be rejected."""
        now_us = self._clock.now_us()
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            deadline = run.ctx.lease.deadline_us
            if run.released:
                continue  # it returned in time; its result commits this tick
            if deadline is not None and now_us > deadline and not run.ctx.lost.is_set():
                run.ctx.lose("timed out")
                self._emit("timeout", job=run.ctx.job_id, token=run.ctx.token)
                if run.outcome is None:
                    self._end(run)  # the thread is abandoned; its slot is free now

    def heartbeat_due(self) -> None:
        """Renew every live lease once ``heartbeat_every`` has passed."""
        now = self._clock.monotonic()
        if now - self._last_heartbeat < self.heartbeat_every:
            return
        self._last_heartbeat = now
        with self._lock:
            runs = [r for r in self._runs.values() if not r.ctx.lost.is_set()]
        for run in runs:
            try:
                self.queue.heartbeat(run.ctx.lease, ttl=self.lease_ttl)
            except LeaseLost as exc:
                if run.outcome is not None:
                    # The handler returned: persist settles it (maybe finalized just now)
                    # and reports a real loss itself, when its finalize is refused.
                    continue
                run.ctx.lose("lease lost")
                self._emit("lease_lost", job=run.ctx.job_id, token=run.ctx.token, reason=str(exc))
                if run.outcome is None:
                    self._end(run)

    # -- running ------------------------------------------------------------------------

    @property
    def running(self) -> int:
        with self._lock:
            return len(self._runs)

    def stop(self) -> None:
        """Stop claiming; ``run`` then drains and returns."""
        self._stopping.set()
        self._wake.set()

    def run(self, *, until_idle: bool = False) -> None:
        """Tick until :meth:`stop` (or SIGINT/SIGTERM); ``until_idle`` also stops when the
        queue has nothing ready or running for this worker."""
        restore = self._install_signals()
        if self.listen:
            self._start_listener()
        self._done.clear()
        self._heartbeats = threading.Thread(
            target=self._heartbeat_loop, daemon=True, name="readyq-heartbeat"
        )
        self._heartbeats.start()
        self._handler_threads = HandlerThreads(self._call)
        try:
            while not self._stopping.is_set():
                try:
                    report = self.tick()
                except (sa.exc.DBAPIError, ReadyqError) as exc:
                    # A lost connection, a restarting server, a busy database: the leases
                    # are safe in the table; log, wait a poll interval, and tick again.
                    self._emit("tick_error", error=repr(exc)[:300])
                    self._clock.wait(self._stopping, self.poll_interval)
                    continue
                if until_idle and not self.running and not report.claimed and self._idle():
                    break
                if report.claimed or report.finished:
                    continue
                self._clock.wait(self._wake, min(self.poll_interval, self.heartbeat_every))
                self._wake.clear()
            self._drain()
        finally:
            self._stopping.set()
            self._done.set()
            if self._handler_threads is not None:
                self._handler_threads.close()
                self._handler_threads = None
            for thread in (self._listener, self._heartbeats):
                if thread is not None:
                    thread.join(5)
            self._heartbeats = None
            restore()

    def _heartbeat_loop(self) -> None:
        """Renew leases on time even while a tick is busy (a slow claim, a slow server)."""
        while not self._done.is_set():
            self._clock.wait(self._done, self.heartbeat_every / 4)
            try:
                self.heartbeat_due()
            except Exception as exc:
                self._emit("heartbeat_error", error=repr(exc)[:200])

    def _start_listener(self) -> None:
        """LISTEN for enqueues and finalizes (PostgreSQL); polling stays the backstop."""

        def loop() -> None:
            try:
                self.queue.adapter.listen(
                    self.queue.engine, self.queue.channel, self._wake.set, self._stopping
                )
            except ReadyqError as exc:
                self._emit("listen_unavailable", reason=str(exc))

        self._listener = threading.Thread(target=loop, daemon=True, name="readyq-listen")
        self._listener.start()

    def _idle(self) -> bool:
        return not self.queue.has_open_jobs()

    def _drain(self) -> None:
        """Graceful shutdown: let running jobs finish within ``grace``, then hand back the rest."""
        deadline = self._clock.monotonic() + self.grace
        while self.running and self._clock.monotonic() < deadline:
            self.persist()
            self.check_timeouts()
            if self.running:
                self._clock.wait(self._wake, min(0.05, self.heartbeat_every))
                self._wake.clear()
        self.persist()
        with self._lock:
            left = list(self._runs.values())
        for run in left:
            run.ctx.lose("worker stopping")
            try:
                self.queue.release(run.ctx.lease)
                self._emit("release", job=run.ctx.job_id, token=run.ctx.token)
            except LeaseLost:
                pass
            self._end(run)

    def _stop_from_signal(self) -> None:
        # A signal handler runs in the main thread between two bytecodes, possibly while
        # that thread holds the lock of the very Event stop() sets (inside Event.wait):
        # setting it here deadlocked a worker on SIGTERM. Another thread sets it.
        threading.Thread(target=self.stop, daemon=True, name="readyq-stop").start()

    def _install_signals(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for s in old:
            signal.signal(s, lambda *_: self._stop_from_signal())

        def restore() -> None:
            for s, handler in old.items():
                signal.signal(s, handler)

        return restore
