"""Choosing the adapter: one place, capability flags, refusal of unsupported servers."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

import readyq
from readyq import UnsupportedDatabase, dialects
from readyq.dialects.mysql import MariaDBAdapter, MySQLAdapter
from readyq.dialects.postgresql import PostgreSQLAdapter
from readyq.dialects.sqlite import SQLiteAdapter
from readyq.schema import jobs

CLAIM = sa.select(jobs.c.id).where(jobs.c.state == "ready").limit(1)


@pytest.mark.parametrize(
    ("adapter", "version", "minimum"),
    [
        (PostgreSQLAdapter, (12, 9), "PostgreSQL >= 13"),
        (MySQLAdapter, (8, 0, 0), "MySQL >= 8.0.1"),
        (MariaDBAdapter, (10, 5, 20), "MariaDB >= 10.6"),
        (SQLiteAdapter, (3, 34, 1), "SQLite >= 3.35"),
    ],
)
def test_too_old_server_is_refused_naming_the_minimum(adapter, version, minimum) -> None:  # type: ignore[no-untyped-def]
    """An unsupported server version raises UnsupportedDatabase with the minimum version."""
    with pytest.raises(UnsupportedDatabase, match=minimum):
        adapter(version)


def test_supported_versions_are_accepted() -> None:
    """The oldest supported version of each server gets its adapter."""
    for adapter, version in [
        (PostgreSQLAdapter, (13, 0)),
        (MySQLAdapter, (8, 0, 1)),
        (MariaDBAdapter, (10, 6, 0)),
        (SQLiteAdapter, (3, 35, 0)),
    ]:
        assert adapter(version).server_version == version


def test_unknown_dialect_is_refused_with_a_hint() -> None:
    """A URL for a database readyq has no adapter for says how to add one."""
    with pytest.raises(UnsupportedDatabase, match="register"):
        dialects.adapter_class("oracle")


def test_missing_driver_is_a_clear_error() -> None:
    """A URL whose driver is not installed says which extra to install."""
    with pytest.raises(UnsupportedDatabase, match="pip install"):
        readyq.Queue("mysql+mysqldb://x@localhost/db")  # mysqlclient is not a dependency


def test_unknown_driver_is_a_clear_error() -> None:
    """A URL naming a driver SQLAlchemy does not know is refused with an example URL."""
    with pytest.raises(UnsupportedDatabase, match="check the URL"):
        readyq.Queue("postgresql+nosuchdriver://x@localhost/db")


def test_in_memory_sqlite_is_refused() -> None:
    """A private in-memory database cannot be shared by workers: readyq says to use a file."""
    with pytest.raises(UnsupportedDatabase, match="file"):
        readyq.Queue("sqlite://")


def test_postgresql_claim_uses_no_key_update_skip_locked() -> None:
    """PostgreSQL claims with FOR NO KEY UPDATE SKIP LOCKED (NOTES 8)."""
    sql = str(PostgreSQLAdapter((15,)).lock_claimable(CLAIM).compile(dialect=postgresql.dialect()))
    assert sql.endswith("FOR NO KEY UPDATE SKIP LOCKED")


@pytest.mark.parametrize("adapter", [MySQLAdapter((8, 0, 36)), MariaDBAdapter((10, 11))])
def test_mysql_claim_uses_exclusive_for_update_skip_locked(adapter) -> None:  # type: ignore[no-untyped-def]
    """MySQL and MariaDB claim with FOR UPDATE SKIP LOCKED, never the share form (NOTES 3)."""
    sql = str(adapter.lock_claimable(CLAIM).compile(dialect=mysql.dialect()))
    assert sql.endswith("FOR UPDATE SKIP LOCKED")


def test_mysql_family_claims_at_read_committed() -> None:
    """InnoDB gap locks at REPEATABLE READ would block enqueues (NOTES 5)."""
    assert MySQLAdapter.isolation_level == MariaDBAdapter.isolation_level == "READ COMMITTED"


def test_mysql_and_mariadb_differ_where_documented() -> None:
    """The differences between the two servers are explicit attributes, not conditionals."""
    assert (MySQLAdapter.minimum_version, MariaDBAdapter.minimum_version) == ((8, 0, 1), (10, 6))
    assert (MySQLAdapter.min_lock_wait_timeout, MariaDBAdapter.min_lock_wait_timeout) == (1, 0)


@pytest.mark.parametrize(
    ("adapter", "semijoin"),
    [
        (MySQLAdapter((8, 0, 20)), False),
        (MySQLAdapter((8, 0, 21)), True),
        (MariaDBAdapter((10, 11, 6)), False),
        (MariaDBAdapter((11, 1)), True),
        (PostgreSQLAdapter((13,)), True),
    ],
)
def test_update_semijoin_is_decided_from_the_server_version(adapter, semijoin) -> None:  # type: ignore[no-untyped-def]
    """Before MySQL 8.0.21 and MariaDB 11.1 an UPDATE's IN (SELECT) reads every row."""
    assert adapter.update_semijoin is semijoin


@pytest.mark.backend
def test_for_engine_picks_the_adapter_of_the_server(backend) -> None:  # type: ignore[no-untyped-def]
    """The live server decides: a MariaDB server behind mysql+pymysql gets MariaDBAdapter."""
    expected = {
        "sqlite": SQLiteAdapter,
        "postgresql": PostgreSQLAdapter,
        "mariadb": MariaDBAdapter,
        "mysql": MySQLAdapter,
    }[backend.name]
    engine = backend.engine()
    assert type(dialects.for_engine(engine)) is expected


@pytest.mark.backend
def test_sqlite_write_transactions_begin_immediate(queue: readyq.Queue) -> None:
    """On SQLite every write transaction takes the write lock first (NOTES 1-2)."""
    if not queue.adapter.serialized_writers:
        pytest.skip("needs capability serialized_writers")
    seen: list[str] = []
    sa.event.listen(
        queue.engine, "before_cursor_execute", lambda conn, cur, stmt, *a: seen.append(stmt)
    )
    queue.enqueue("t")
    assert seen[0] == "BEGIN IMMEDIATE"


@pytest.mark.backend
def test_microseconds_survive_every_dialect(queue: readyq.Queue) -> None:
    """A lease expiry with microseconds round-trips exactly (NOTES 6: DATETIME truncates)."""
    queue.enqueue("t")
    lease = queue.claim("w", ttl=0.654321)[0]
    assert queue.get(lease.job_id).lease_expires_at == lease.expires_at
