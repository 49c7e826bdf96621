"""The measurements, one method per section of the report.

Every figure is measured in the same run as the reference it is divided by. Each
repetition of a drain starts from freshly created tables holding exactly its jobs.
"""

from __future__ import annotations

import cProfile
import pstats
import random
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

import readyq

from . import cpu, db, loops, probes
from .config import Config
from .runner import BenchError, Clients, rate, summarize

__all__ = ["Bench"]

Stats = dict[str, Any]
Log = Callable[[str], None]


def _ms(seconds: float) -> float:
    return seconds * 1000.0


def _pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


class Bench:
    def __init__(self, cfg: Config, url: str, clients: Clients, log: Log) -> None:
        self.cfg = cfg
        self.url = url
        self.clients = clients
        self.log = log
        self.backend = db.backend_name(url)
        self.reference_rates: dict[str, dict[int, float]] = {}
        self.cpu = cpu.CpuMeter(url)
        #: The CPU split of each drain run, in order (see :meth:`_drain_run`).
        self._cpu_runs: list[dict[str, Any]] = []

    # -- helpers ------------------------------------------------------------------------

    def ref(self, mode: str = "thread", clients: int = 1) -> float:
        """The reference rate (median) for this many clients of this kind."""
        by_mode = self.reference_rates.get(mode) or self.reference_rates["thread"]
        return by_mode.get(clients) or by_mode[1]

    def _repeat(self, measure: Callable[[], float], warm: Callable[[], object] | None) -> Stats:
        if warm is not None:
            warm()
        return summarize([measure() for _ in range(self.cfg.repeat)])

    def _prefill(self, n: int, groups: int = 1) -> None:
        """Emptied tables holding ``n`` ready no-op jobs (in ``groups`` weighted groups),
        analyzed unless ``--no-analyze``."""
        db.refill_noops(self.url, n, groups=groups, analyze_after=self.cfg.analyze)

    def _drain_run(self, n: int, mode: str, loop: Callable[..., Any], args: list[Any]) -> float:
        """One drain of the ``n`` jobs in the table: its rate, and its CPU split noted."""
        before = self.cpu.sample()
        results = self.clients.run(mode, loop, args)
        self._cpu_runs.append(self.cpu.split(before, self.cpu.sample(), n))
        self._check_drained(n, results)
        return rate(results)

    def _cpu_of_repeats(self) -> Stats:
        """Median CPU split of the measured repetitions (the warm-up's is left out)."""
        runs = [r for r in self._cpu_runs[-self.cfg.repeat :] if r]
        out: Stats = {}
        for key in ("server_ms_per_job", "rest_ms_per_job", "busy"):
            values = [r[key] for r in runs if r.get(key) is not None]
            if values:
                out[key] = statistics.median(values)
        return out

    def _check_drained(self, n: int, results: list[loops.Result]) -> None:
        total = sum(int(r["count"]) for r in results)
        with readyq.Queue(self.url) as q:
            counts = q.counts()
        if total != n or counts["done"] != n:
            raise BenchError(f"drain of {n} jobs finished {total}; counts {counts}")

    # -- reference ----------------------------------------------------------------------

    def reference(self) -> Stats:
        cfg = self.cfg
        db.create_reference_table(self.url)
        out: Stats = {}
        for mode in cfg.modes:
            out[mode] = {}
            self.reference_rates[mode] = {}
            for n in cfg.client_counts(mode):

                def once(n: int = n, mode: str = mode, seconds: float = cfg.ref_seconds) -> float:
                    args = [(self.url, i, n, seconds) for i in range(n)]
                    return rate(self.clients.run(mode, loops.reference_loop, args))

                stats = self._repeat(once, partial(once, n, mode, min(0.1, cfg.ref_seconds / 2)))
                out[mode][str(n)] = stats
                self.reference_rates[mode][n] = stats["median"]
                self.log(f"reference {mode:7} x{n:<3} {stats['median']:9.0f} tx/s")
        return out

    # -- enqueue ------------------------------------------------------------------------

    def enqueue(self) -> Stats:
        cfg = self.cfg
        db.reset_queue(self.url)
        out: Stats = {}
        with readyq.Queue(self.url) as q:

            def single(n: int = cfg.enqueue_single) -> float:
                t = time.perf_counter()
                for i in range(n):
                    q.enqueue("noop", {"i": i})
                return n / (time.perf_counter() - t)

            out["single"] = self._repeat(single, lambda: single(10))
            for size, count in sorted(cfg.enqueue_batches.items()):

                def batch(size: int = size, count: int = count) -> float:
                    t = time.perf_counter()
                    for _ in range(count):
                        with q.graph() as g:
                            for i in range(size):
                                g.add("noop", {"i": i})
                    return size * count / (time.perf_counter() - t)

                out[f"batch_{size}"] = self._repeat(batch, partial(batch, min(size, 100), 1))

            def dag(count: int = cfg.dag_graphs) -> float:
                t = time.perf_counter()
                for _ in range(count):
                    with q.graph() as g:
                        _dag(g)
                return DAG_JOBS * count / (time.perf_counter() - t)

            out["dag"] = self._repeat(dag, lambda: dag(1))
            out["dag_shape"] = {"jobs": DAG_JOBS, "edges": DAG_EDGES}
        for name, stats in out.items():
            if name != "dag_shape":
                stats["ratio"] = stats["median"] / self.ref()
                self.log(f"enqueue {name:11} {stats['median']:9.0f} jobs/s")
        return out

    # -- drain --------------------------------------------------------------------------

    def drain(self) -> list[Stats]:
        cfg = self.cfg
        db.reset_queue(self.url)
        rows: list[Stats] = []
        for mode in cfg.modes:
            for workers in cfg.counts(mode):
                for limit, finish in cfg.drain_variants():

                    def once(
                        n: int,
                        mode: str = mode,
                        w: int = workers,
                        lb: tuple[int, str] = (limit, finish),
                    ) -> float:
                        self._prefill(n)
                        args = [(self.url, f"{mode[0]}{i}", *lb) for i in range(w)]
                        return self._drain_run(n, mode, loops.drain_loop, args)

                    # Quick: one warm-up for the whole section, not one per configuration.
                    warm = None if cfg.quick and rows else partial(once, cfg.warm_jobs)
                    stats = self._repeat(partial(once, cfg.jobs), warm)
                    row = {
                        "runner": "raw",
                        "mode": mode,
                        "workers": workers,
                        "limit": limit,
                        "finalize": finish,
                        "jobs": cfg.jobs,
                        "jobs_per_s": stats,
                        "ratio": stats["median"] / self.ref(mode, workers),
                        "cpu": self._cpu_of_repeats(),
                    }
                    rows.append(row)
                    self.log(
                        f"drain raw {mode:7} x{workers:<3} limit {limit:<3} "
                        f"{finish:5} {stats['median']:9.0f} jobs/s"
                    )
        rows += self._fair(rows)
        return rows

    def _fair(self, raw: list[Stats]) -> list[Stats]:
        """``readyq.Worker`` over 10 weighted groups, in each mode, beside the raw loop at
        the same size (a deployment runs one Worker per process: threads share the GIL)."""
        cfg = self.cfg
        slots = max(cfg.limits)
        rows: list[Stats] = []
        for mode, workers, executor in (
            (m, w, e) for m in cfg.modes for w in cfg.fair_counts(m) for e in cfg.fair_executors
        ):

            def once(n: int, w: int = workers, mode: str = mode, executor: str = executor) -> float:
                self._prefill(n, groups=cfg.fair_groups)
                args = [
                    (self.url, f"f{i}", slots, cfg.poll_interval, cfg.scan_max_age, executor)
                    for i in range(w)
                ]
                return self._drain_run(n, mode, loops.worker_loop, args)

            stats = self._repeat(partial(once, cfg.jobs), partial(once, cfg.warm_jobs))
            same = [
                r
                for r in raw
                if (r["mode"], r["workers"], r["limit"], r["finalize"])
                == (mode, workers, slots, "batch")
            ]
            rows.append(
                {
                    "runner": "worker",
                    "executor": executor,
                    "mode": mode,
                    "workers": workers,
                    "limit": slots,
                    "groups": cfg.fair_groups,
                    "jobs": cfg.jobs,
                    "jobs_per_s": stats,
                    "ratio": stats["median"] / self.ref(mode, workers),
                    "vs_raw": (stats["median"] / same[0]["jobs_per_s"]["median"]) if same else None,
                    "cpu": self._cpu_of_repeats(),
                }
            )
            self.log(
                f"drain Worker {mode:7} x{workers:<3} fair {executor:6} "
                f"{stats['median']:9.0f} jobs/s"
            )
        return rows

    # -- end-to-end latency -------------------------------------------------------------

    def latency(self) -> Stats:
        """Polling always; LISTEN/NOTIFY too where the adapter has it (PostgreSQL)."""
        cfg = self.cfg
        out: Stats = {"polling": self._latency(listen=False)}
        with readyq.Queue(self.url) as q:
            can_listen = q.adapter.listen_notify
        if can_listen:
            out["listen_notify"] = self._latency(listen=True)
        out["poll_interval_s"] = cfg.poll_interval
        out["samples"] = cfg.latency_samples
        out["reference_tx_ms"] = _ms(1 / self.ref())
        return out

    def _latency(self, *, listen: bool) -> Stats:
        cfg = self.cfg
        db.reset_queue(self.url)
        started: dict[int, float] = {}
        all_started = threading.Event()
        expect = [0]

        def handler(ctx: readyq.JobContext, args: dict[str, Any]) -> None:
            started[ctx.job_id] = time.time()
            if len(started) >= expect[0]:
                all_started.set()

        rng = random.Random(6)  # noqa: S311 -- jitter between enqueues, not a secret
        reps: dict[str, list[float]] = {"p50": [], "p95": [], "p99": [], "enqueue": []}
        with readyq.Queue(self.url) as wq, readyq.Queue(self.url) as pq:
            worker = readyq.Worker(
                wq,
                {"e2e": handler},
                limits=[readyq.Concurrency(4)],
                # With LISTEN the notification wakes the worker; polling is the backstop.
                poll_interval=1.0 if listen else cfg.poll_interval,
                heartbeat_every=5.0,
                lease_ttl=30.0,
                listen=listen,
            )
            thread = threading.Thread(target=worker.run, daemon=True)
            thread.start()
            try:
                for rep in range(cfg.repeat + 1):  # the first pass is the warm-up
                    n = 5 if rep == 0 else cfg.latency_samples
                    sent: dict[int, float] = {}
                    calls: list[float] = []
                    all_started.clear()
                    expect[0] = len(started) + n
                    for _ in range(n):
                        t0 = time.time()
                        sent[pq.enqueue("e2e")] = t0
                        calls.append(time.time() - t0)
                        time.sleep(cfg.latency_gap * rng.uniform(0.5, 1.5))
                    if not all_started.wait(60):
                        raise BenchError("latency: jobs did not start within 60 s")
                    if rep == 0:
                        continue
                    lat = [started[j] - t for j, t in sent.items()]
                    reps["p50"].append(_ms(_pct(lat, 0.50)))
                    reps["p95"].append(_ms(_pct(lat, 0.95)))
                    reps["p99"].append(_ms(_pct(lat, 0.99)))
                    reps["enqueue"].append(_ms(statistics.median(calls)))
            finally:
                worker.stop()
                thread.join(30)
        out: Stats = {f"{k}_ms": summarize(v) for k, v in reps.items()}
        how = "LISTEN/NOTIFY" if listen else f"polling {cfg.poll_interval}s"
        self.log(
            f"latency ({how}) p50 {out['p50_ms']['median']:.1f} ms  "
            f"p95 {out['p95_ms']['median']:.1f} ms  p99 {out['p99_ms']['median']:.1f} ms"
        )
        return out

    # -- scaling ------------------------------------------------------------------------

    def scaling(self) -> Stats:
        cfg = self.cfg
        out: Stats = {}
        kinds = (
            ("done", cfg.finished_sizes),
            ("blocked", cfg.blocked_sizes),
            ("deferred", cfg.deferred_sizes),
        )
        for state, sizes in kinds:
            per: Stats = {}
            with self._fresh_tables() as engine, readyq.Queue(self.url) as q:
                # Without filler: the baseline blocked and deferred rows are compared with.
                if state != "done":
                    per["0"] = self._claim_latency(q, engine)
                for size, fill_s in _filled_to(engine, sizes, state=state, now=q.clock.now_us()):
                    per[str(size)] = self._claim_latency(q, engine)
                    per[str(size)]["fill_s"] = fill_s
                    self.log(
                        f"claim+finalize with {size:>9,} {state:7} rows "
                        f"{per[str(size)]['claim_finalize_ms']['median']:.2f} ms "
                        f"(filled in {fill_s:.1f} s)"
                    )
            medians = [v["claim_finalize_ms"]["median"] for v in per.values()]
            claims = [v["claim_ms"]["median"] for v in per.values()]
            key = "finished" if state == "done" else state
            out[key] = {
                "sizes": per,
                "ratio_largest_smallest": medians[-1] / medians[0],
                "claim_ratio_largest_smallest": claims[-1] / claims[0],
            }
        return out

    @contextmanager
    def _fresh_tables(self) -> Iterator[Engine]:
        """readyq's tables recreated empty, and an engine for bulk fills into them."""
        db.reset_queue(self.url)
        engine = sa.create_engine(self.url, poolclass=NullPool)
        try:
            yield engine
        finally:
            engine.dispose()

    def _claim_latency(self, q: readyq.Queue, engine: Engine) -> Stats:
        cfg = self.cfg
        m = cfg.scaling_claims
        need = cfg.repeat * m + 5
        with q.graph() as g:
            for i in range(need):
                g.add("noop", {"i": i})
        db.analyze(engine)
        claim_reps: list[float] = []
        both_reps: list[float] = []
        for rep in range(cfg.repeat + 1):
            n = 5 if rep == 0 else m
            c_times: list[float] = []
            b_times: list[float] = []
            for _ in range(n):
                t0 = time.perf_counter()
                leases = q.claim("scale", ttl=60, limit=1)
                t1 = time.perf_counter()
                if len(leases) != 1:
                    raise BenchError("scaling: the claim found no ready job")
                q.finalize(leases[0], None)
                t2 = time.perf_counter()
                c_times.append(t1 - t0)
                b_times.append(t2 - t0)
            if rep:
                claim_reps.append(_ms(statistics.median(c_times)))
                both_reps.append(_ms(statistics.median(b_times)))
        return {"claim_ms": summarize(claim_reps), "claim_finalize_ms": summarize(both_reps)}

    # -- backlog ------------------------------------------------------------------------

    def backlog(self) -> Stats:
        """One fair-share Worker draining ``backlog_jobs`` jobs off each ready backlog
        (topped up between repetitions): its tick must not slow down with the backlog."""
        cfg = self.cfg
        slots = max(cfg.limits)
        per: Stats = {}
        with self._fresh_tables() as engine:
            with readyq.Queue(self.url) as q:
                fill: dict[str, Any] = {
                    "state": "ready",
                    "now": q.clock.now_us(),
                    "groups": cfg.fair_groups,
                }
            for size, _ in _filled_to(engine, cfg.backlog_sizes, **fill):
                runs = []
                for rep in range(cfg.repeat + 1):  # the first is a discarded warm-up
                    got = loops.worker_stages(
                        self.url, slots, cfg.poll_interval, cfg.backlog_jobs, cfg.scan_max_age
                    )
                    if got["done"] < cfg.backlog_jobs:
                        raise BenchError(f"backlog: the Worker finished {got['done']} jobs")
                    db.fill_jobs(engine, int(got["done"]), **fill)  # back to ``size``
                    if rep:
                        runs.append(got)
                per[str(size)] = {
                    "jobs_per_s": summarize([r["done"] / r["wall_s"] for r in runs]),
                    "scan_ms": summarize(
                        [1000 * r["stages_s"]["scan"] / max(1, r["scans"]) for r in runs]
                    ),
                }
                self.log(
                    f"Worker beside {size:>9,} ready jobs: "
                    f"{per[str(size)]['jobs_per_s']['median']:.0f} jobs/s"
                )
        rates = [v["jobs_per_s"]["median"] for v in per.values()]
        scans = [v["scan_ms"]["median"] for v in per.values()]
        return {
            "sizes": per,
            "jobs": cfg.backlog_jobs,
            "slots": slots,
            "groups": cfg.fair_groups,
            "ratio_smallest_largest": rates[0] / rates[-1],
            "scan_ratio_largest_smallest": scans[-1] / scans[0],
        }

    # -- write cost ---------------------------------------------------------------------

    def write_cost(self) -> Stats:
        cfg = self.cfg
        n = cfg.cost_jobs
        pg = self.backend == "postgresql"
        out: Stats = {}

        def measure(
            name: str, prepare: Callable[[], None], act: Callable[[readyq.Queue], None]
        ) -> None:
            prepare()
            if pg:
                probes.no_autovacuum(self.url)
            with (
                probes.pg_stats(self.url, pg, cfg.stats_wait) as stats,
                readyq.Queue(self.url) as q,
                probes.StatementCounter(q.engine) as counter,
                probes.driver_round_trips(self.backend) as sent,
            ):
                act(q)
            pipelined = {k: v for k, v in sent.items() if k.startswith(probes.PIPELINED)}
            sent = {k: v for k, v in sent.items() if k not in pipelined}
            counter.texts.update(pipelined)
            row: Stats = {
                "jobs": n,
                "statements_per_job": (counter.statements + sum(pipelined.values())) / n,
                "transactions_per_job": counter.commits / n,
                "statements": dict(sorted(counter.texts.items(), key=lambda kv: -kv[1])),
            }
            if sent:
                trips = sum(sent.values())  # every wait for the server
                row["driver_commands"] = sent
            else:
                trips = counter.statements + counter.commits  # SQLite: calls, no network
            row["round_trips_per_job"] = trips / n
            for k, v in stats.items():
                row[f"{k}_per_job"] = v / n
            out[name] = row
            self.log(
                f"write cost {name:16} {row['statements_per_job']:5.1f} statements/job "
                f"{row['transactions_per_job']:4.2f} tx/job"
                + (
                    f"  {row['dead_tuples_per_job']:.1f} dead/job  "
                    f"{row['wal_bytes_per_job']:.0f} WAL B/job"
                    if pg
                    else ""
                )
            )

        def single(q: readyq.Queue) -> None:
            for i in range(n):
                q.enqueue("noop", {"i": i})

        def batch(q: readyq.Queue) -> None:
            for start in range(0, n, 100):
                with q.graph() as g:
                    for i in range(start, min(n, start + 100)):
                        g.add("noop", {"i": i})

        def drainer(limit: int, finish: str) -> Callable[[readyq.Queue], None]:
            def act(q: readyq.Queue) -> None:
                loops.drain(q, "cost", limit, finish)

            return act

        def reset() -> None:
            db.reset_queue(self.url)

        measure("enqueue_single", reset, single)
        measure("enqueue_batch_100", reset, batch)
        for limit, finish in cfg.drain_variants():
            name = f"drain_limit_{limit}" + ("" if finish == "each" else f"_{finish}")
            measure(name, lambda: self._prefill(n), drainer(limit, finish))
        if pg:
            out["reference_wal_bytes_per_tx"] = probes.reference_wal(self.url, n)
            out["note"] = (
                "PostgreSQL statistics lag: they are read after the queue's connections "
                "closed (a backend flushes its counters at exit); autovacuum is off on "
                "readyq_jobs in the bench database. WAL is server-wide: other databases' "
                "writes on a shared server are counted too."
            )
        return out

    # -- profile ------------------------------------------------------------------------

    def profile(self) -> Stats:
        """cProfile of the single-worker raw drain (claim limit 1), in this process."""
        cfg = self.cfg
        n = cfg.profile_jobs
        db.reset_queue(self.url)
        self._prefill(n)
        prof = cProfile.Profile()
        with readyq.Queue(self.url) as q:
            q.counts()
            t = time.perf_counter()
            prof.enable()
            while leases := q.claim("profile", ttl=60, limit=1):
                for lease in leases:
                    q.finalize(lease, None)
            prof.disable()
            wall = time.perf_counter() - t
        st = pstats.Stats(prof)
        total = float(st.total_tt)  # type: ignore[attr-defined]
        entries: list[tuple[str, int, float, float]] = []
        by_package: dict[str, float] = {}
        for (path, line, fn), (_cc, calls, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
            name = probes.where(path, line, fn)
            entries.append((name, calls, tt, ct))
            pkg = probes.package_of(path, fn)
            by_package[pkg] = by_package.get(pkg, 0.0) + tt

        def top(idx: int) -> list[Stats]:
            ranked = sorted(entries, key=lambda e: -float(e[idx]))[: cfg.profile_top]
            return [
                {
                    "function": e[0],
                    "calls_per_job": e[1] / n,
                    "self_share": e[2] / total,
                    "cumulative_share": e[3] / total,
                }
                for e in ranked
            ]

        out: Stats = {
            "jobs": n,
            "wall_s": wall,
            "jobs_per_s_profiled": n / wall,
            "by_self_time": top(2),
            "by_cumulative_time": top(3),
            "self_time_by_package": {
                k: v / total for k, v in sorted(by_package.items(), key=lambda kv: -kv[1])
            },
        }
        self.log(f"profile: {n} jobs in {wall:.2f} s under cProfile")
        out["worker"] = self._worker_stages()
        return out

    def _worker_stages(self) -> Stats:
        """Where a ``readyq.Worker``'s time goes: each tick stage's wall time per tick."""
        cfg = self.cfg
        slots = max(cfg.limits)
        self._prefill(cfg.profile_jobs, groups=cfg.fair_groups)
        got = loops.worker_stages(self.url, slots, cfg.poll_interval, scan_max_age=cfg.scan_max_age)
        if got["done"] != cfg.profile_jobs:
            raise BenchError(f"Worker stages: {got['done']} of {cfg.profile_jobs} jobs done")
        ticks = max(1, int(got["ticks"]))
        stages = {
            name: {"ms_per_tick": 1000 * s / ticks, "share": s / got["wall_s"]}
            for name, s in got["stages_s"].items()
        }
        self.log(f"Worker stages: {cfg.profile_jobs} jobs in {ticks} ticks, {got['wall_s']:.2f} s")
        return {
            "jobs": cfg.profile_jobs,
            "slots": slots,
            "groups": cfg.fair_groups,
            "ticks": ticks,
            "jobs_per_s": cfg.profile_jobs / got["wall_s"],
            "stages": stages,
        }


# -- DAG shape ------------------------------------------------------------------------

CHAINS, CHAIN_LEN, FAN = 10, 10, 50
DAG_JOBS = CHAINS * CHAIN_LEN + 1 + FAN + 1
DAG_EDGES = CHAINS * (CHAIN_LEN - 1) + FAN + FAN


def _filled_to(engine: Engine, sizes: list[int], **fill: Any) -> Iterator[tuple[int, float]]:
    """Fill jobs up to each of ``sizes`` in turn (cumulatively, ``db.fill_jobs(**fill)``);
    yield each size and the seconds its fill took."""
    filled = 0
    for size in sizes:
        t = time.perf_counter()
        db.fill_jobs(engine, size - filled, **fill)
        filled = size
        yield size, time.perf_counter() - t


def _dag(g: readyq.Graph) -> None:
    """10 chains of 10 jobs; a root fanning out to 50 jobs that fan in to one sink."""
    for c in range(CHAINS):
        prev = g.add("noop", {"chain": c, "step": 0})
        for s in range(1, CHAIN_LEN):
            prev = g.add("noop", {"chain": c, "step": s}, after=[prev])
    root = g.add("noop", {"fan": "root"})
    mids = [g.add("noop", {"fan": i}, after=[root]) for i in range(FAN)]
    g.add("noop", {"fan": "sink"}, after=mids)
