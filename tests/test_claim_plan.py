"""The claim's plan reads about ``limit`` rows, whatever else the table holds (PostgreSQL).

The scaling promise (a claim does not slow down with finished or blocked jobs) checked by
counting the rows PostgreSQL's executor actually reads (``EXPLAIN (ANALYZE, FORMAT
JSON)``), not by timing: exact, and the same on a loaded machine. Session 3 found a plan
that walked every ready row on every claim after statistics were taken while few jobs
were ready; the third test keeps it found.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from readyq_bench.db import fill_jobs

import readyq
from readyq import _guards, _store
from readyq.schema import jobs

pytestmark = pytest.mark.backend

FILLER = 3000
LIMIT = 10
#: Rows a claim of LIMIT may read: the picked index entries, the rows it updates by key,
#: and slack for a row skipped as locked or re-checked. Far below FILLER.
BOUND = 6 * LIMIT


@pytest.fixture
def pg(queue: readyq.Queue) -> readyq.Queue:
    if queue.engine.dialect.name != "postgresql":
        pytest.skip("counts rows with EXPLAIN (ANALYZE, FORMAT JSON), PostgreSQL's")
    return queue


def _ready(q: readyq.Queue, n: int, group: str = "default") -> None:
    with q.graph() as g:
        for i in range(n):
            g.add("t", {"i": i}, group=group)


def _analyze(q: readyq.Queue) -> None:
    with q.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql(f"ANALYZE {jobs.name}")


def _rows_read(q: readyq.Queue, stmt: Any, params: dict[str, Any]) -> int:
    """Rows the executor read from readyq_jobs running ``stmt`` (rolled back)."""
    with q.engine.connect() as conn, conn.begin() as tx:
        compiled = stmt.compile(dialect=conn.dialect)
        explain = "EXPLAIN (ANALYZE, FORMAT JSON) " + compiled.string
        (plan,) = conn.exec_driver_sql(explain, compiled.construct_params(params)).scalar_one()
        tx.rollback()
    if isinstance(plan, str):  # pragma: no cover - a driver that returns the JSON as text
        plan = json.loads(plan)[0]
    return _walk(plan["Plan"])


def _walk(node: dict[str, Any]) -> int:
    own = 0
    if node.get("Relation Name") == jobs.name and "Scan" in node["Node Type"]:
        own = node["Actual Rows"] * node["Actual Loops"]
        own += node.get("Rows Removed by Filter", 0) + node.get("Rows Removed by Index Recheck", 0)
    return own + sum(_walk(child) for child in node.get("Plans", []))


def _claim(q: readyq.Queue) -> int:
    stmt = _store._claim_one_statement(q.adapter, _guards.guard)
    params = _store._claim_params("plan", q.clock.now_us(), 10**7, LIMIT)
    return _rows_read(q, stmt, params)


def test_claim_reads_about_limit_rows_beside_many_finished_jobs(pg: readyq.Queue) -> None:
    _ready(pg, 3 * LIMIT)
    fill_jobs(pg.engine, FILLER, state="done", now=pg.clock.now_us())
    assert _claim(pg) <= BOUND


def test_claim_reads_about_limit_rows_beside_many_blocked_jobs(pg: readyq.Queue) -> None:
    _ready(pg, 3 * LIMIT)
    fill_jobs(pg.engine, FILLER, state="blocked", now=pg.clock.now_us())
    assert _claim(pg) <= BOUND


def test_claim_reads_about_limit_rows_when_statistics_predate_the_backlog(
    pg: readyq.Queue,
) -> None:
    """Statistics from a quiet spell (thousands of finished jobs, two ready), then a
    backlog of thousands, before autovacuum analyzes again. (With statistics from a
    table of a row or two, any plan may scan it: docs/databases.md.)"""
    with pg.engine.begin() as conn:
        conn.exec_driver_sql(f"ALTER TABLE {jobs.name} SET (autovacuum_enabled = false)")
    fill_jobs(pg.engine, FILLER, state="done", now=pg.clock.now_us())
    _ready(pg, 2)
    _analyze(pg)
    _ready(pg, FILLER)
    assert _claim(pg) <= BOUND


def test_grouped_claim_select_reads_about_its_share_beside_other_groups(
    pg: readyq.Queue,
) -> None:
    """One group's locked select skips the other groups' ready rows by its index."""
    _ready(pg, 3 * LIMIT, group="mine")
    _ready(pg, FILLER, group="others")
    _analyze(pg)
    select = _store._claim_select(pg.adapter, True)
    params = {"now": pg.clock.now_us(), "n": LIMIT, "group": "mine"}
    assert _rows_read(pg, select, params) <= BOUND


def test_rows_read_counts_a_full_scan(pg: readyq.Queue) -> None:
    """The counter itself: a filter on an unindexed column reads every row."""
    _ready(pg, 50)
    stmt = sa.select(jobs.c.id).where(jobs.c.type == sa.bindparam("t"))
    assert _rows_read(pg, stmt, {"t": "t"}) >= 50
