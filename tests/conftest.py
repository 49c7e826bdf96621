"""Shared fixtures: every real database readyq supports, one clean database per test.

Fixture API (see tests/backends.py for why it works this way):

* ``backend``: parametrized over sqlite, postgresql, mariadb, mysql; ``.name``, ``.url`` and
  ``.engine()``. A backend that is not configured skips, or fails if READYQ_REQUIRE_BACKENDS
  names it. Tests that use it carry the ``backend`` marker (``pytest -m backend``).
* ``db_url``: ``backend.url`` with no readyq tables at test start; they are dropped after.
* ``queue``: an installed ``readyq.Queue`` on ``db_url``, closed after the test.
* ``make_queue``: ``make_queue(clock=None)`` makes further queues on the same database.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import settings

try:  # tests/ may or may not become a package; both import paths name the same file.
    from tests.backends import (
        BACKENDS,
        Backend,
        ServerDatabases,
        Unavailable,
        drop_readyq_tables,
        empty_readyq_tables,
        readyq_tables_present,
        required_backends,
    )
except ImportError:
    from backends import (  # type: ignore[no-redef]
        BACKENDS,
        Backend,
        ServerDatabases,
        Unavailable,
        drop_readyq_tables,
        empty_readyq_tables,
        readyq_tables_present,
        required_backends,
    )

if TYPE_CHECKING:
    import readyq

# Hypothesis: CI runs fewer examples than a developer's machine, and neither has a deadline,
# because a real database round trip has no stable latency on shared runners.
settings.register_profile(
    "readyq-ci", parent=settings.get_profile("ci"), max_examples=30, deadline=None
)
settings.register_profile("readyq-dev", max_examples=50, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("readyq-ci" if os.environ.get("CI") else "readyq-dev")
)


def pytest_configure(config: pytest.Config) -> None:
    """Reject a misspelt READYQ_REQUIRE_BACKENDS before it silently requires nothing."""
    try:
        required_backends()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session")
def _server_databases() -> Iterator[ServerDatabases]:
    """One database per server backend for this session (this xdist worker), dropped at end."""
    registry = ServerDatabases(os.environ.get("PYTEST_XDIST_WORKER", "main"))
    yield registry
    registry.close()


@pytest.fixture(
    params=[pytest.param(name, id=name, marks=pytest.mark.backend) for name in BACKENDS]
)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, _server_databases: ServerDatabases
) -> Iterator[Backend]:
    """A real database: a fresh SQLite file per test, or this session's server database."""
    name: str = request.param
    if name == "sqlite":
        url = f"sqlite:///{tmp_path / 'readyq.sqlite3'}"
    else:
        outcome = _server_databases.url(name)
        if isinstance(outcome, Unavailable):
            if outcome.broken:
                pytest.fail(outcome.reason, pytrace=False)
            if name in required_backends():
                pytest.fail(
                    f"READYQ_REQUIRE_BACKENDS requires {name!r}, which is unavailable: "
                    f"{outcome.reason}",
                    pytrace=False,
                )
            pytest.skip(outcome.reason)
        url = outcome
    handle = Backend(name, url)
    yield handle
    handle.dispose()


@pytest.fixture
def db_url(backend: Backend) -> Iterator[str]:
    """``backend.url`` holding no readyq tables at test start; the test's tables go after.

    A SQLite file is new for each test and discarded with tmp_path, so only the shared
    server databases need the cleanup. It runs before the test too, in case an earlier
    test's teardown could not finish.
    """
    shared = backend.name != "sqlite"
    if shared:
        drop_readyq_tables(backend.url)
        leftover = readyq_tables_present(backend.url)
        assert not leftover, f"could not clean {backend.name} database: {sorted(leftover)}"
    yield backend.url
    if shared:
        drop_readyq_tables(backend.url)


@pytest.fixture
def queue_url(backend: Backend) -> Iterator[str]:
    """``backend.url`` with readyq installed and no rows; rows are deleted after the test."""
    import readyq

    if backend.name != "sqlite" and "alembic_version" in readyq_tables_present(backend.url):
        drop_readyq_tables(backend.url)  # an Alembic test's schema: start from ours
    with readyq.Queue(backend.url) as q:
        q.install()
    if backend.name != "sqlite":
        empty_readyq_tables(backend.url)
    yield backend.url
    if backend.name != "sqlite":
        empty_readyq_tables(backend.url)


@pytest.fixture
def queue(queue_url: str) -> Iterator[readyq.Queue]:
    """An installed ``readyq.Queue`` with no jobs, on the test's database."""
    import readyq

    with readyq.Queue(queue_url) as q:
        yield q


@pytest.fixture
def make_queue(queue_url: str) -> Iterator[Callable[..., readyq.Queue]]:
    """A factory of extra queues on the installed database, for racing them."""
    import readyq

    made: list[readyq.Queue] = []

    def make(clock: Any = None) -> readyq.Queue:
        q = readyq.Queue(queue_url, clock=clock)
        made.append(q)
        return q

    yield make
    for q in reversed(made):
        q.close()


@pytest.fixture
def clock() -> Any:
    """A virtual clock: tests move time explicitly instead of sleeping."""
    from readyq_sim import VirtualClock

    return VirtualClock()


@pytest.fixture
def q(make_queue: Callable[..., readyq.Queue], clock: Any) -> readyq.Queue:
    """An installed queue whose time is the test's virtual ``clock``."""
    return make_queue(clock)
