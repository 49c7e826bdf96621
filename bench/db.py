"""The bench's own database: created per run, reset between measurements, dropped after.

Servers are shared, so a run never writes into the database its URL names: it creates
``readyq_bench_<random hex>`` on the same server (SQLite: a file in a temporary directory),
measures there and drops exactly that database at the end.
"""

from __future__ import annotations

import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

import readyq
from readyq.schema import deps, jobs, metadata

__all__ = [
    "REF_ROWS",
    "backend_name",
    "empty_queue",
    "fill_jobs",
    "reset_queue",
    "scratch_database",
]

_SAFE = re.compile(r"readyq_bench_[0-9a-f]{12}")
#: Rows of the reference table; each client updates its own rows, so none wait on a lock.
REF_ROWS = 1024
REF_TABLE = "readyq_bench_ref"
#: How far ahead the scaling section's deferred filler rows are due.
DEFERRED_US = 3600 * 1_000_000


def backend_name(url: str) -> str:
    """``sqlite``, ``postgresql``, ``mariadb`` or ``mysql`` (a guess for mysql URLs)."""
    return sa.make_url(url).get_backend_name()


def _render(url: sa.URL) -> str:
    return url.render_as_string(hide_password=False)


def _admin(url: str) -> Engine:
    return sa.create_engine(url, poolclass=NullPool).execution_options(isolation_level="AUTOCOMMIT")


@contextmanager
def scratch_database(url: str | None) -> Iterator[str]:
    """A URL to a new, empty database for this run; dropped (or deleted) afterwards."""
    if url is None or backend_name(url) == "sqlite":
        tmp = Path(tempfile.mkdtemp(prefix="readyq_bench_"))
        try:
            yield f"sqlite:///{tmp / 'bench.sqlite3'}"
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return
    name = f"readyq_bench_{secrets.token_hex(6)}"
    assert _SAFE.fullmatch(name), name
    parsed = sa.make_url(url)
    admin = _admin(url)
    pg = parsed.get_backend_name() == "postgresql"
    try:
        with admin.connect() as conn:
            if pg:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            else:
                conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
        yield _render(parsed.set(database=name))
    finally:
        with admin.connect() as conn:
            if pg:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def reset_queue(url: str) -> None:
    """readyq's tables, empty and freshly created (no dead rows, no statistics)."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        metadata.drop_all(engine)
    finally:
        engine.dispose()
    with readyq.Queue(url) as q:
        q.install()


def empty_queue(url: str) -> None:
    """readyq's tables emptied in place (TRUNCATE; SQLite: DELETE), cheaper than DDL."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            name = engine.dialect.name
            if name == "postgresql":
                conn.exec_driver_sql(f"TRUNCATE {deps.name}, {jobs.name} RESTART IDENTITY")
            elif name in ("mysql", "mariadb"):
                # InnoDB refuses to TRUNCATE a table that a foreign key references.
                conn.exec_driver_sql("SET SESSION foreign_key_checks = 0")
                conn.exec_driver_sql(f"TRUNCATE TABLE {deps.name}")
                conn.exec_driver_sql(f"TRUNCATE TABLE {jobs.name}")
                conn.exec_driver_sql("SET SESSION foreign_key_checks = 1")
            else:
                conn.exec_driver_sql(f"DELETE FROM {deps.name}")
                conn.exec_driver_sql(f"DELETE FROM {jobs.name}")
    finally:
        engine.dispose()


def create_reference_table(url: str) -> None:
    """The scratch table of the reference transaction: ``REF_ROWS`` rows, id and counter."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {REF_TABLE}")
            conn.exec_driver_sql(
                f"CREATE TABLE {REF_TABLE} (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)"
            )
            conn.execute(
                sa.text(f"INSERT INTO {REF_TABLE} (id, n) VALUES (:id, 0)"),
                [{"id": i} for i in range(REF_ROWS)],
            )
    finally:
        engine.dispose()


def _filler(state: str, now: int, pending: int) -> dict[str, Any]:
    """One row of ``readyq_jobs`` with every NOT NULL column filled."""
    done = state == "done"
    return {
        "type": "filler",
        "args": "{}",
        "result": "{}" if done else None,
        "state": state,
        "container": False,
        "group_key": "filler",
        "weight": 1.0,
        "priority": 0,
        "pending_deps": pending,
        "open_children": 0,
        "attempts": 1 if done else 0,
        "max_attempts": 3,
        "lease_token": 1 if done else 0,
        "settled_token": 1 if done else None,
        "run_after_us": now,
        "created_us": now,
        "started_us": now if done else None,
        "finished_us": now if done else None,
    }


def fill_jobs(
    engine: Engine, count: int, *, state: str, now: int, chunk: int = 5000, groups: int = 1
) -> Sequence[int]:
    """Bulk-insert ``count`` filler jobs (``done``, ``ready``, ``blocked`` on one open
    root job, or ``deferred``: ready, due in an hour, at priority -1, ahead of every
    job enqueued at the default 0 in claim order).

    Blocked rows wait on a root job that is itself blocked forever, with an edge each in
    ``readyq_job_deps``, like real jobs whose dependency has not finished. Ready rows are
    ``noop`` jobs spread over ``groups`` groups ``g0`` .. of weights 1 ..  Returns the
    root's id for blocked fillers (empty otherwise).
    """
    assert state in ("done", "blocked", "ready", "deferred"), state
    root: list[int] = []
    with engine.begin() as conn:
        if state == "blocked":
            r = conn.execute(jobs.insert().values(**_filler("blocked", now, 1)))
            assert r.inserted_primary_key is not None
            root.append(int(r.inserted_primary_key[0]))
    if state == "deferred":
        row = dict(_filler("ready", now, 0), run_after_us=now + DEFERRED_US, priority=-1)
    else:
        row = _filler(state, now, 1 if state == "blocked" else 0)
    left = count
    while left > 0:
        n = min(chunk, left)
        rows = [row] * n
        if state == "ready":
            rows = [
                dict(row, type="noop", group_key=f"g{k % groups}", weight=k % groups + 1)
                for k in range(count - left, count - left + n)
            ]
        with engine.begin() as conn:
            if root:
                first = conn.execute(sa.select(sa.func.max(jobs.c.id))).scalar_one()
                conn.execute(jobs.insert(), rows)
                last = conn.execute(sa.select(sa.func.max(jobs.c.id))).scalar_one()
                ids = conn.execute(
                    sa.select(jobs.c.id).where(jobs.c.id > first, jobs.c.id <= last)
                ).scalars()
                conn.execute(deps.insert(), [{"job_id": i, "depends_on": root[0]} for i in ids])
            else:
                conn.execute(jobs.insert(), rows)
        left -= n
    analyze(engine)
    return root


def refill_noops(url: str, n: int, *, groups: int = 1, analyze_after: bool = True) -> None:
    """Empty readyq's tables, then enqueue ``n`` ready ``noop`` jobs through the API (1,000
    per graph), in groups ``g0`` .. of weights 1 .., and ANALYZE unless told not to."""
    empty_queue(url)
    with readyq.Queue(url) as q:
        for start in range(0, n, 1000):
            with q.graph() as g:
                for i in range(start, min(n, start + 1000)):
                    k = i % groups
                    g.add("noop", {"i": i}, group=f"g{k}", weight=k + 1)
        if analyze_after:
            analyze(q.engine)


def analyze(engine: Engine) -> None:
    """Fresh planner statistics after a bulk fill (PostgreSQL; MySQL/MariaDB likewise)."""
    name = engine.dialect.name
    if name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql(f"ANALYZE {jobs.name}")
            conn.exec_driver_sql(f"ANALYZE {deps.name}")
    elif name in ("mysql", "mariadb"):
        with engine.connect() as conn:
            conn.exec_driver_sql(f"ANALYZE TABLE {jobs.name}, {deps.name}").all()
            conn.commit()


def server_version(url: str) -> str:
    """The server's version string (SQLite: the library's)."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            name = engine.dialect.name
            if name == "sqlite":
                return "SQLite " + str(conn.exec_driver_sql("select sqlite_version()").scalar())
            return str(conn.exec_driver_sql("select version()").scalar())
    finally:
        engine.dispose()
