"""The database fixtures themselves: each backend answers, on a database of its own."""

from __future__ import annotations

import os
import re

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

SESSION_DATABASE = re.compile(r"readyq_t_[0-9a-f]{8}_[a-z0-9]+")


def test_backend_engine_answers_a_query(backend):
    """``backend.engine()`` connects to a live database that runs SQL."""
    with backend.engine().connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1


def test_server_backend_connects_to_this_sessions_own_database(backend):
    """A server backend's URL names a database generated for this session and worker."""
    if backend.name == "sqlite":
        pytest.skip("SQLite gets a fresh file per test instead")
    current = {"postgresql": "SELECT current_database()"}.get(backend.name, "SELECT DATABASE()")
    with backend.engine().connect() as conn:
        name = conn.execute(sa.text(current)).scalar_one()
    assert name == make_url(backend.url).database
    assert SESSION_DATABASE.fullmatch(name), name
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    assert name.endswith(f"_{worker}")


def test_sqlite_backend_is_a_new_file_for_each_test(backend, tmp_path):
    """The SQLite URL points at a file that does not exist yet, inside the test's tmp_path."""
    if backend.name != "sqlite":
        pytest.skip("server backends share one database per session")
    path = make_url(backend.url).database
    assert path is not None
    assert path.startswith(str(tmp_path))
    assert not os.path.exists(path)


def test_db_url_starts_without_readyq_tables(db_url):
    """``db_url`` holds none of readyq's tables when a test begins."""
    from readyq import schema

    engine = sa.create_engine(db_url)
    try:
        present = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert not present & set(schema.metadata.tables)


def test_db_url_lets_a_test_create_readyq_tables_for_teardown_to_drop(db_url):
    """A test may create readyq's tables; teardown drops them (the next setup asserts so)."""
    from readyq import schema

    engine = sa.create_engine(db_url)
    try:
        schema.metadata.create_all(engine)
        assert set(schema.metadata.tables) <= set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
