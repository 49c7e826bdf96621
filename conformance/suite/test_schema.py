"""Schema: readyq's tables and indexes exist, and installing is idempotent."""

from __future__ import annotations

import sqlalchemy as sa
from readyq_conformance.env import Env

import readyq
from readyq.schema import metadata

INDEXES = {
    "readyq_jobs": {
        ("state", "group_key", "priority", "run_after_us", "id"),
        ("state", "priority", "run_after_us", "id"),
        ("state", "lease_expires_us"),
        ("state", "deadline_us"),
        ("parent_id",),
        ("state", "finished_us"),
    },
    "readyq_job_deps": {("depends_on",)},
}


def test_tables_and_columns_exist(env: Env) -> None:
    """Both tables exist with every column readyq declares."""
    insp = sa.inspect(env.engine)
    for table in metadata.sorted_tables:
        cols = {col["name"] for col in insp.get_columns(table.name)}
        assert set(table.c.keys()) <= cols, f"{table.name} lacks {set(table.c.keys()) - cols}"


def test_claim_and_sweeper_indexes_exist(env: Env) -> None:
    """The claim, sweeper, container and dependency lookups have their indexes (an index
    whose columns start with the wanted ones serves too: retention's gained ``id``)."""
    insp = sa.inspect(env.engine)
    for table, wanted in INDEXES.items():
        have = {tuple(ix["column_names"]) for ix in insp.get_indexes(table)}
        missing = {w for w in wanted if not any(h[: len(w)] == w for h in have)}
        assert not missing, f"{table} is missing indexes on {sorted(missing)}"


def test_install_is_idempotent(env: Env) -> None:
    """Installing again over an installed schema changes nothing and keeps the rows."""
    q = env.queue()
    job = q.enqueue("t")
    q.install()
    q.install()
    assert q.get(job).type == "t"


def test_reinstall_after_drop(env: Env) -> None:
    """The schema can be dropped and created again from readyq's metadata."""
    env.site.drop_tables()
    try:
        assert not set(sa.inspect(env.engine).get_table_names()) & set(metadata.tables)
    finally:
        env.install()
    with readyq.Queue(env.url) as q:
        assert q.counts()["ready"] == 0
