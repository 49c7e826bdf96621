"""One simulator run: fresh database, actors, phases (faults, heal, until quiet), final read."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

import readyq
from readyq.schema import jobs as jobs_table

from .actors import enqueuer, sweeper, worker
from .clock import VirtualClock
from .config import SimConfig
from .driver import Driver, DriverStuck, backend_kind
from .rng import Streams
from .workload import make_workload
from .world import Hooks, World

__all__ = ["RunResult", "fresh_database", "run"]


@dataclass
class RunResult:
    cfg: SimConfig
    url: str
    world: World
    final: dict[int, dict[str, Any]]
    digest: str
    steps: int
    wall_s: float
    virtual_s: float
    phases: dict[str, str]
    live: bool
    server_version: str
    trace: list[str] = field(default_factory=list)
    stuck: str | None = None
    actor_errors: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def fresh_database(url: str | None) -> Iterator[str]:
    """A new, empty database for one run, dropped afterwards.

    SQLite: a new file in a temporary directory (next to ``url``'s file if given). A server:
    ``readyq_sim_<hex>`` created on the server ``url`` points at; nothing else is touched.
    """
    if url is None or backend_kind(url) == "sqlite":
        parent = None
        if url is not None:
            db = sa.make_url(url).database
            parent = os.path.dirname(os.path.abspath(db)) if db else None
        tmp = tempfile.mkdtemp(prefix="readyq-sim-", dir=parent)
        try:
            yield f"sqlite:///{os.path.join(tmp, 'sim.sqlite3')}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    name = f"readyq_sim_{secrets.token_hex(6)}"
    kind = backend_kind(url)
    admin = sa.create_engine(url, poolclass=NullPool).execution_options(
        isolation_level="AUTOCOMMIT"
    )
    quoted = f'"{name}"' if kind == "postgresql" else f"`{name}`"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
        try:
            yield sa.make_url(url).set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                force = " WITH (FORCE)" if kind == "postgresql" else ""
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted}{force}")
    finally:
        admin.dispose()


def _install(url: str, clock: VirtualClock) -> str:
    with readyq.Queue(url, clock) as q:
        q.install()
        with q.engine.connect() as conn:
            version = ".".join(str(v) for v in (conn.dialect.server_version_info or ()))
            if conn.dialect.name == "postgresql":
                # Autovacuum's truncation takes a brief exclusive lock: a spurious lock wait.
                for table in ("readyq_jobs", "readyq_job_deps"):
                    conn.exec_driver_sql(
                        f"ALTER TABLE {table} SET (autovacuum_enabled = false, "
                        "vacuum_truncate = false)"
                    )
                conn.commit()
        return f"{q.adapter.product} {version}"


def _open_jobs(url: str | Engine) -> int:
    eng = sa.create_engine(url, poolclass=NullPool) if isinstance(url, str) else url
    try:
        with eng.connect() as conn:
            c = jobs_table.c
            open_states = ["blocked", "ready", "running", "waiting"]
            return int(
                conn.execute(sa.select(sa.func.count()).where(c.state.in_(open_states))).scalar()
                or 0
            )
    finally:
        if isinstance(url, str):
            eng.dispose()


def _final_read(url: str) -> dict[int, dict[str, Any]]:
    eng = sa.create_engine(url, poolclass=NullPool)
    try:
        with eng.connect() as conn:
            rows = conn.execute(sa.select(jobs_table).order_by(jobs_table.c.id)).mappings().all()
            return {int(r["id"]): dict(r) for r in rows}
    finally:
        eng.dispose()


def run(
    cfg: SimConfig,
    url: str | None = None,
    hooks: Hooks | None = None,
    *,
    script: Sequence[str] | None = None,
    fault_script: dict[tuple[str, int], str] | None = None,
) -> RunResult:
    """Run ``cfg`` on a fresh database on ``url``'s server (default: a temporary SQLite).

    ``script``/``fault_script``: replay recorded decisions instead of drawing them from the
    seed (see :mod:`readyq_sim.shrink`).
    """
    with fresh_database(url) as db_url, warnings.catch_warnings():
        # Killed sessions make SQLAlchemy warn while it discards them; that is the point.
        warnings.simplefilter("ignore", sa.exc.SAWarning)
        warnings.simplefilter("ignore", ResourceWarning)
        return _run(cfg, db_url, hooks or Hooks(), script, fault_script)


def _run(
    cfg: SimConfig,
    url: str,
    hooks: Hooks,
    script: Sequence[str] | None = None,
    fault_script: dict[tuple[str, int], str] | None = None,
) -> RunResult:
    started = time.perf_counter()
    clock = VirtualClock()
    start_us = clock.now_us()
    server = _install(url, clock)
    streams = Streams(cfg.seed)
    driver = Driver(url, clock, streams["schedule"], step_us=cfg.step_us, watchdog=cfg.watchdog)
    world = World(cfg, clock, streams, driver, hooks)
    if script is not None:
        driver.script = list(script)
    world.fault_script = fault_script
    batches = make_workload(cfg, streams["workload"])
    driver.spawn("enqueuer", enqueuer(world, batches))
    driver.spawn("sweeper", sweeper(world))
    for i in range(cfg.workers):
        driver.spawn(f"w{i + 1}", worker(world))

    probe = sa.create_engine(url, pool_size=1)  # one pooled connection for every quiet check

    def quiet() -> bool:
        return world.enqueuer_done and _open_jobs(probe) == 0

    phases: dict[str, str] = {}
    stuck: str | None = None
    live = False
    try:
        every = round(cfg.quiet_check_s * 1e6)
        phases["faults"] = driver.run(max_steps=cfg.steps, until=quiet, check_every_us=every)
        world.faults_active = False
        world.heal_us = clock.now_us()
        world.log("driver", "note", "heal", clock.now_us())
        if phases["faults"] == "until":
            phases["liveness"] = "already quiet"
            live = True
        else:
            deadline = clock.now_us() + round(cfg.liveness_budget * 1e6)
            phases["liveness"] = driver.run(
                max_steps=10**9, until=quiet, deadline_us=deadline, check_every_us=every // 4
            )
            live = phases["liveness"] == "until"
    except DriverStuck as exc:
        stuck = str(exc)
    finally:
        world.log("driver", "note", "stop", clock.now_us())
        if stuck is None:
            driver.stop()
        driver.close()
        probe.dispose()
    errors = {a.name: repr(a.error) for a in driver.actors if a.error is not None}
    final = _final_read(url)
    return RunResult(
        cfg=cfg,
        url=url,
        world=world,
        final=final,
        digest=driver.digest,
        steps=driver.step,
        wall_s=time.perf_counter() - started,
        virtual_s=(clock.now_us() - start_us) / 1e6,
        phases=phases,
        live=live,
        server_version=server,
        trace=driver.trace,
        stuck=stuck,
        actor_errors=errors,
    )
