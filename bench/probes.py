"""What the bench observes beside the clock: statements, commits and driver round
trips; PostgreSQL's tuple counters and WAL; where a profile's time went."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from readyq.schema import jobs

from . import db

__all__ = [
    "PIPELINED",
    "StatementCounter",
    "driver_round_trips",
    "no_autovacuum",
    "package_of",
    "pg_stats",
    "reference_wal",
    "where",
]


class StatementCounter:
    """Counts cursor executions and commits on one engine (SQLAlchemy events)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.statements = 0
        self.commits = 0
        self.texts: dict[str, int] = {}

    def _on_execute(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        self.statements += 1
        head = " ".join(statement.split())[:60]
        self.texts[head] = self.texts.get(head, 0) + 1

    def _on_commit(self, conn: Any) -> None:
        self.commits += 1

    def __enter__(self) -> StatementCounter:
        sa.event.listen(self.engine, "before_cursor_execute", self._on_execute)
        sa.event.listen(self.engine, "commit", self._on_commit)
        return self

    def __exit__(self, *exc: object) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._on_execute)
        sa.event.remove(self.engine, "commit", self._on_commit)


#: Marks a statement sent in a psycopg pipeline in :func:`driver_round_trips`' counts.
PIPELINED = "(pipelined) "


@contextmanager
def driver_round_trips(backend: str) -> Iterator[dict[str, int]]:
    """Counts the driver's requests to the server while the block runs (one thread only).

    Statement events miss what the dialect sends on its own: BEGIN/COMMIT (psycopg), the
    isolation level SET + COMMIT on each checkout and the ROLLBACK of the pool's reset
    (PyMySQL), and statements readyq sends in a psycopg pipeline. On PostgreSQL this
    counts every wait for the server: a statement, a command (BEGIN, COMMIT) and a
    pipeline (which carries all of its statements); PyMySQL: every request.
    SQLite has no server (empty).
    """
    got: dict[str, int] = {}
    spies: list[tuple[Any, str, Callable[..., str | None]]] = []

    def text_of(conn: Any, command: Any, *args: Any) -> str:
        text = args[0] if args and isinstance(args[0], (str, bytes)) else command
        if isinstance(text, bytes):
            text = text.decode(errors="replace")
        return " ".join(str(text).split()[:4])[:48]

    if backend == "postgresql":
        base = importlib.import_module("psycopg._connection_base").BaseConnection
        # In a pipeline a command only joins the queue; the pipeline's sync waits.
        spies.append(
            (base, "_exec_command", lambda c, cmd, *a: None if c._pipeline else text_of(c, cmd))
        )
        spies.append(
            (importlib.import_module("psycopg._cursor_base"), "execute", lambda *a: "statement")
        )
        # A pipeline sends as it goes and waits for the server once, when it ends.
        spies.append(
            (importlib.import_module("psycopg").Connection, "pipeline", lambda *a: "pipeline")
        )
        # Statements sent in a pipeline pass no SQLAlchemy event: counted here, apart.
        spies.append(
            (
                importlib.import_module("psycopg").Cursor,
                "execute",
                lambda cur, query, *a, **k: (
                    PIPELINED + text_of(cur, query) if cur.connection._pipeline else None
                ),
            )
        )
    elif backend in ("mysql", "mariadb"):
        conn_cls = importlib.import_module("pymysql.connections").Connection
        spies.append((conn_cls, "_execute_command", text_of))
    originals = [(target, name, getattr(target, name)) for target, name, _ in spies]

    def spy(original: Callable[..., Any], label: Callable[..., str | None]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            head = label(*args)
            if head is not None:
                got[head] = got.get(head, 0) + 1
            return original(*args, **kwargs)

        return call

    for (target, name, label), (_, _, original) in zip(spies, originals, strict=True):
        setattr(target, name, spy(original, label))
    try:
        yield got
    finally:
        for target, name, original in originals:
            setattr(target, name, original)


# -- PostgreSQL statistics ------------------------------------------------------------


def no_autovacuum(url: str) -> None:
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"ALTER TABLE {jobs.name} SET (autovacuum_enabled = false)")
    finally:
        engine.dispose()


def _pg_read(engine: Engine) -> dict[str, float]:
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
        row = (
            conn.execute(
                sa.text(
                    "SELECT n_tup_ins, n_tup_upd, n_tup_hot_upd, n_dead_tup, "
                    "pg_current_wal_lsn()::text AS lsn "
                    "FROM pg_stat_user_tables WHERE relname = :t"
                ),
                {"t": jobs.name},
            )
            .mappings()
            .one()
        )
        conn.rollback()
    return dict(row)


@contextmanager
def pg_stats(url: str, enabled: bool, wait: float) -> Iterator[dict[str, float]]:
    """Deltas of readyq_jobs' tuple counters and of the WAL position across the block."""
    out: dict[str, float] = {}
    if not enabled:
        yield out
        return
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        time.sleep(wait)  # the preparing connections' counters reach the stats first
        before = _pg_read(engine)
        yield out
        time.sleep(wait)  # ... and so do those of the connections just closed
        after = _pg_read(engine)
        with engine.connect() as conn:
            wal = conn.execute(
                sa.text("SELECT pg_wal_lsn_diff(CAST(:a AS pg_lsn), CAST(:b AS pg_lsn))"),
                {"a": after["lsn"], "b": before["lsn"]},
            ).scalar_one()
        out["wal_bytes"] = float(wal)
        for k in ("n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_dead_tup"):
            out["dead_tuples" if k == "n_dead_tup" else k.removeprefix("n_tup_")] = float(
                after[k] - before[k]
            )
    finally:
        engine.dispose()


def reference_wal(url: str, n: int) -> float:
    """WAL bytes of one reference transaction (one-row UPDATE + commit), for scale."""
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            a = conn.exec_driver_sql("SELECT pg_current_wal_lsn()::text").scalar_one()
            conn.rollback()
            for i in range(n):
                conn.execute(
                    sa.text(f"UPDATE {db.REF_TABLE} SET n = n + 1 WHERE id = :id"),
                    {"id": i % db.REF_ROWS},
                )
                conn.commit()
            wal = conn.execute(
                sa.text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:a AS pg_lsn))"),
                {"a": a},
            ).scalar_one()
            conn.rollback()
    finally:
        engine.dispose()
    return float(wal) / n


def where(path: str, line: int, fn: str) -> str:
    if path == "~":
        return fn
    for marker in ("site-packages/", "/readyq/", "/bench/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker != "site-packages/":
                path = marker.strip("/") + "/" + path
            break
    return f"{path}:{line}({fn})"


def package_of(path: str, fn: str) -> str:
    if path == "~":
        if "sqlite3" in fn or "psycopg" in fn or "pymysql" in fn:
            return "driver (C calls)"
        return "builtins"
    for name in ("sqlalchemy", "psycopg", "pymysql", "readyq", "bench"):
        if f"/{name}/" in path:
            return name
    if "/sqlite3/" in path:
        return "sqlite3"
    return "other"
