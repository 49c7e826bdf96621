"""Real databases for the test suite.

readyq's correctness lives in how each database locks, orders and times rows, so the
suite runs against real servers, never a mock. A server backend's URL comes from, in
order: its environment variable (``READYQ_TEST_<NAME>_URL``), a throwaway testcontainers
container (only when the ``testcontainers`` package imports and a Docker engine answers),
or nowhere: then its tests skip, unless ``READYQ_REQUIRE_BACKENDS`` names it, in which case
they fail, so that CI can never pass by silently skipping the database it was meant to test.

The servers are shared with other runs and other people. Each pytest session (each xdist
worker is one) creates its own uniquely named database per server and drops exactly that
database at the end, nothing else.
"""

from __future__ import annotations

import gc
import importlib
import os
import re
import secrets
import warnings
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import NullPool

BACKENDS = ("sqlite", "postgresql", "mariadb", "mysql")
SERVER_BACKENDS = ("postgresql", "mariadb", "mysql")
URL_ENV = {name: f"READYQ_TEST_{name.upper()}_URL" for name in SERVER_BACKENDS}
REQUIRE_ENV = "READYQ_REQUIRE_BACKENDS"

# Used only for the testcontainers fallback; CI pins its own matrix of versions.
CONTAINER_IMAGES = {"postgresql": "postgres:17", "mariadb": "mariadb:11.4", "mysql": "mysql:8.4"}

# Identifiers cannot be bound parameters, so a database name is spliced into DDL text.
# It is generated here from this alphabet only, and checked against it before use.
_SAFE_NAME = re.compile(r"readyq_t_[a-z0-9_]{1,50}")

# A leaked connection that holds a lock must make cleanup fail loudly, not hang the run.
_LOCK_TIMEOUT_SECONDS = 30


def required_backends() -> frozenset[str]:
    """The backends named in READYQ_REQUIRE_BACKENDS; an unknown name is a usage error."""
    names = {n.strip().lower() for n in os.environ.get(REQUIRE_ENV, "").split(",") if n.strip()}
    unknown = names - set(BACKENDS)
    if unknown:
        raise ValueError(
            f"{REQUIRE_ENV} names unknown backend(s) {sorted(unknown)}; known: {list(BACKENDS)}"
        )
    return frozenset(names)


def unique_database_name(worker_id: str) -> str:
    """``readyq_t_<8 random hex>_<worker>``: unique per session and per xdist worker."""
    worker = re.sub(r"[^a-z0-9]", "", worker_id.lower())[:16] or "main"
    name = f"readyq_t_{secrets.token_hex(4)}_{worker}"
    assert _SAFE_NAME.fullmatch(name), name
    return name


def render_url(url: URL) -> str:
    """A URL as a string with its password kept (``str(url)`` masks it as ``***``)."""
    return url.render_as_string(hide_password=False)


@dataclass
class Backend:
    """What a test gets from the ``backend`` fixture: a name and a URL to its own database."""

    name: str
    url: str
    _engines: list[Engine] = field(default_factory=list, repr=False)

    def engine(self, **kwargs: Any) -> Engine:
        """A plain SQLAlchemy engine on this backend's database, disposed at test teardown."""
        engine = sa.create_engine(self.url, **kwargs)
        self._engines.append(engine)
        return engine

    def dispose(self) -> None:
        while self._engines:
            self._engines.pop().dispose()


@dataclass(frozen=True)
class Unavailable:
    """Why a server backend cannot run; ``broken`` means configured but failing (never skip)."""

    reason: str
    broken: bool = False


def cleanup_engine(url: str) -> Engine:
    """An unpooled engine whose DDL gives up on a held lock instead of waiting forever."""
    dialect = make_url(url).get_backend_name()
    connect_args: dict[str, Any] = {}
    if dialect == "postgresql":
        connect_args["options"] = f"-c lock_timeout={_LOCK_TIMEOUT_SECONDS * 1000}"
    elif dialect in ("mysql", "mariadb"):
        connect_args["init_command"] = f"SET SESSION lock_wait_timeout = {_LOCK_TIMEOUT_SECONDS}"
    return sa.create_engine(url, poolclass=NullPool, connect_args=connect_args)


def _admin_engine(url: str) -> Engine:
    """CREATE/DROP DATABASE cannot run inside a transaction on PostgreSQL: autocommit."""
    return cleanup_engine(url).execution_options(isolation_level="AUTOCOMMIT")


def create_database(server_url: str, name: str) -> str:
    """Create database ``name`` on the server and return a URL that points at it."""
    assert _SAFE_NAME.fullmatch(name), name
    engine = _admin_engine(server_url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            else:
                conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        engine.dispose()
    return render_url(make_url(server_url).set(database=name))


def drop_database(server_url: str, name: str) -> None:
    """Drop database ``name`` (and only it), ending any session a test left connected."""
    assert _SAFE_NAME.fullmatch(name), name
    engine = _admin_engine(server_url)
    try:
        with engine.connect() as conn:
            if conn.dialect.name == "postgresql":
                version = conn.dialect.server_version_info or (0,)
                force = " WITH (FORCE)" if version >= (13,) else ""
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"{force}')
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        engine.dispose()


def _import_first(*modules: str) -> Any:
    """testcontainers moved its modules between releases; take the first path that imports."""
    error: ImportError | None = None
    for module in modules:
        try:
            return importlib.import_module(module)
        except ImportError as exc:
            error = exc
    assert error is not None
    raise error


def _docker_answers() -> bool:
    """Ping the Docker engine; call with warnings ignored (a failed ping leaks a socket)."""
    try:
        import docker  # installed with testcontainers

        client = docker.from_env(timeout=5)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception:
        return False
    finally:
        gc.collect()  # emit the leaked socket's ResourceWarning now, while it is ignored


def _start_container(name: str) -> Any:
    """Start (and return) a testcontainers container for ``name``; raises ImportError."""
    image = CONTAINER_IMAGES[name]
    if name == "postgresql":
        module = _import_first("testcontainers.community.postgres", "testcontainers.postgres")
        container = module.PostgresContainer(image, driver="psycopg")
    else:
        module = _import_first("testcontainers.community.mysql", "testcontainers.mysql")
        # root, because each session creates its own database on the server.
        container = module.MySqlContainer(
            image, dialect="pymysql", username="root", password="readyq"
        )
    container.start()
    return container


class ServerDatabases:
    """Session-wide registry: one database per server backend, made on first use.

    Creating lazily means a run that selects only SQLite tests never touches a server.
    Outcomes (a URL or why not) are cached, so an absent backend costs one probe per session.
    """

    def __init__(self, worker_id: str) -> None:
        self._worker_id = worker_id
        self._outcomes: dict[str, str | Unavailable] = {}
        self._created: list[tuple[str, str]] = []  # (server URL, database name)
        self._containers: list[Any] = []

    def url(self, name: str) -> str | Unavailable:
        if name not in self._outcomes:
            self._outcomes[name] = self._provision(name)
        return self._outcomes[name]

    def _server_url(self, name: str) -> str | Unavailable:
        env = URL_ENV[name]
        if os.environ.get(env, "").strip():
            return os.environ[env].strip()
        how = f"set {env} to a server URL (or install testcontainers and run a Docker engine)"
        # The suite turns warnings into errors; third-party deprecations there (including
        # testcontainers' own old module paths) must not break the fallback.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                _import_first("testcontainers.core.container")
            except ImportError:
                return Unavailable(f"{name}: not configured; {how}")
            if not _docker_answers():
                return Unavailable(f"{name}: not configured and no Docker engine answers; {how}")
            try:
                container = _start_container(name)
            except Exception as exc:
                reason = f"{name}: testcontainers failed to start {CONTAINER_IMAGES[name]}: {exc!r}"
                return Unavailable(reason, broken=True)
        self._containers.append(container)
        return str(container.get_connection_url())

    def _provision(self, name: str) -> str | Unavailable:
        server_url = self._server_url(name)
        if isinstance(server_url, Unavailable):
            return server_url
        database = unique_database_name(self._worker_id)
        shown = make_url(server_url)  # str() of a URL hides its password
        try:
            url = create_database(server_url, database)
        except Exception as exc:
            return Unavailable(f"{name}: cannot create a test database on {shown}: {exc}", True)
        self._created.append((server_url, database))
        return url

    def close(self) -> None:
        """Drop every database this session created, then stop its containers."""
        errors: list[BaseException] = []
        for server_url, database in reversed(self._created):
            try:
                drop_database(server_url, database)
            except Exception as exc:
                errors.append(exc)
        self._created.clear()
        for container in self._containers:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    container.stop()
            except Exception as exc:
                errors.append(exc)
        self._containers.clear()
        if errors:
            raise RuntimeError(f"test database cleanup failed: {errors!r}")


def drop_readyq_tables(url: str) -> None:
    """Drop readyq's tables (and Alembic's bookkeeping table) so the next test starts empty."""
    from readyq import schema

    engine = cleanup_engine(url)
    try:
        schema.metadata.drop_all(engine, checkfirst=True)
        sa.Table("alembic_version", sa.MetaData()).drop(engine, checkfirst=True)
    finally:
        engine.dispose()


def readyq_tables_present(url: str) -> set[str]:
    """The names of readyq's (and Alembic's) tables that exist in the database at ``url``."""
    from readyq import schema

    engine = cleanup_engine(url)
    try:
        existing = set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()
    return existing & (set(schema.metadata.tables) | {"alembic_version"})


def empty_readyq_tables(url: str) -> None:
    """Delete every row of readyq's tables (in this run's own database), keeping the schema.

    Much cheaper than dropping and re-creating the tables for each test (DDL costs
    ~0.4 s per test on MariaDB); tests that need no tables at all use ``db_url``.
    """
    from readyq import schema

    engine = cleanup_engine(url)
    try:
        with engine.begin() as conn:
            # MariaDB checks the self-referencing parent_id key row by row: unlink first.
            conn.execute(schema.jobs.update().values(parent_id=None))
            for table in reversed(schema.metadata.sorted_tables):
                conn.execute(table.delete())
    finally:
        engine.dispose()
