"""Where the suite runs: one database per session, readyq's tables reset between tests.

On a server the suite creates ``readyq_conf_<hex>`` next to the database the URL names and
drops exactly that database at the end (``database="fresh"``, the default), or uses the
URL's own database when told to (``database="given"``): then it refuses a database that
already holds readyq's tables, and drops only the tables it created. On SQLite it uses a
new file in a temporary directory (fresh) or the named file (given).
"""

from __future__ import annotations

import importlib
import os
import re
import secrets
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from readyq import dialects
from readyq.dialects import Adapter
from readyq.schema import metadata

__all__ = [
    "Site",
    "apply_adapter",
    "cleanup_engine",
    "kind_of",
    "open_site",
    "redact",
    "registry_name",
]

_SAFE = re.compile(r"readyq_conf_[a-f0-9]{12}")
#: A leaked connection holding a lock must make cleanup fail loudly, not hang the run.
LOCK_TIMEOUT_S = 20


def kind_of(url: str | sa.URL) -> str:
    """``sqlite``, ``postgresql`` or ``mysql`` (MySQL and MariaDB share their provisioning)."""
    name = sa.make_url(url).get_backend_name()
    return "mysql" if name in ("mysql", "mariadb") else name


def redact(url: str | sa.URL) -> str:
    return sa.make_url(url).render_as_string(hide_password=True)


def registry_name(engine: Engine) -> str:
    """The name readyq's adapter registry files this engine's database under."""
    dialect = engine.dialect
    if dialect.server_version_info is None:
        with engine.connect():
            pass
    if dialect.name in ("mysql", "mariadb"):
        return "mariadb" if getattr(dialect, "is_mariadb", False) else "mysql"
    return dialect.name


def cleanup_engine(url: str) -> Engine:
    """An unpooled engine whose DDL gives up on a held lock instead of waiting forever."""
    kind = kind_of(url)
    args: dict[str, Any] = {}
    if kind == "postgresql":
        args["options"] = f"-c lock_timeout={LOCK_TIMEOUT_S * 1000}"
    elif kind == "mysql":
        args["init_command"] = f"SET SESSION lock_wait_timeout = {LOCK_TIMEOUT_S}"
    elif kind == "sqlite":
        args["timeout"] = LOCK_TIMEOUT_S
    return sa.create_engine(url, poolclass=NullPool, connect_args=args)


def _render(url: sa.URL) -> str:
    return url.render_as_string(hide_password=False)


@dataclass
class Site:
    """The database this session runs in, and how to put it back."""

    url: str
    given_url: str
    mode: str
    _created_db: str | None = None
    _tmpdir: str | None = None
    _server_url: str | None = None
    notes: list[str] = field(default_factory=list)
    _reset_engine: Engine | None = None

    def reset(self) -> None:
        """Every readyq row deleted (the tables stay): each test starts from nothing."""
        if self._reset_engine is None:
            self._reset_engine = cleanup_engine(self.url)
        with self._reset_engine.begin() as conn:
            jobs = metadata.tables["readyq_jobs"]
            if sa.inspect(conn).has_table("readyq_jobs"):
                # MariaDB checks the self-referencing parent_id key row by row.
                conn.execute(jobs.update().values(parent_id=None))
                for table in reversed(metadata.sorted_tables):
                    conn.execute(table.delete())

    def drop_tables(self) -> None:
        engine = cleanup_engine(self.url)
        try:
            metadata.drop_all(engine, checkfirst=True)
        finally:
            engine.dispose()

    def close(self) -> None:
        """Drop what this session created (its database, or its tables), nothing else."""
        if self._reset_engine is not None:
            self._reset_engine.dispose()
            self._reset_engine = None
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None
            return
        if self._created_db is not None:
            assert _SAFE.fullmatch(self._created_db), self._created_db
            assert self._server_url is not None
            _drop_database(self._server_url, self._created_db)
            self._created_db = None
            return
        self.drop_tables()


def _admin(url: str) -> Engine:
    return cleanup_engine(url).execution_options(isolation_level="AUTOCOMMIT")


def _drop_database(server_url: str, name: str) -> None:
    engine = _admin(server_url)
    try:
        with engine.connect() as conn:
            if kind_of(server_url) == "postgresql":
                version = conn.dialect.server_version_info or (0,)
                force = " WITH (FORCE)" if version >= (13,) else ""
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}"{force}')
            else:
                conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        engine.dispose()


def open_site(url: str | None, mode: str = "fresh") -> Site:
    """Provision the session's database (see the module docstring)."""
    if mode not in ("fresh", "given"):
        raise ValueError(f"database mode must be 'fresh' or 'given', not {mode!r}")
    if url is None or kind_of(url) == "sqlite":
        path = None if url is None else sa.make_url(url).database
        if mode == "given" and path:
            site = Site(url=str(url), given_url=str(url), mode=mode)
            _refuse_existing(site)
            return site
        parent = os.path.dirname(os.path.abspath(path)) if path else None
        tmp = tempfile.mkdtemp(prefix="readyq-conf-", dir=parent)
        made = f"sqlite:///{os.path.join(tmp, 'conformance.sqlite3')}"
        return Site(url=made, given_url=str(url or made), mode=mode, _tmpdir=tmp)
    if mode == "given":
        site = Site(url=url, given_url=url, mode=mode)
        _refuse_existing(site)
        return site
    name = f"readyq_conf_{secrets.token_hex(6)}"
    engine = _admin(url)
    try:
        with engine.connect() as conn:
            if kind_of(url) == "postgresql":
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
            else:
                conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    finally:
        engine.dispose()
    made = _render(sa.make_url(url).set(database=name))
    return Site(url=made, given_url=url, mode=mode, _created_db=name, _server_url=url)


def _refuse_existing(site: Site) -> None:
    engine = cleanup_engine(site.url)
    try:
        present = set(sa.inspect(engine).get_table_names()) & set(metadata.tables)
    finally:
        engine.dispose()
    if present:
        raise RuntimeError(
            f"{redact(site.url)} already holds readyq tables {sorted(present)}; the suite "
            "deletes rows and drops tables, so it will not run there. Use an empty "
            "database, or the default fresh mode (a new database on the same server)."
        )


def load_object(spec: str) -> Any:
    """``module:attr`` (attr may be dotted) imported and returned."""
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"expected module:attr, not {spec!r}")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def apply_adapter(spec: str | None, engine: Engine) -> type[Adapter]:
    """Register the adapter named by ``spec`` for ``engine``'s database; return it.

    ``spec`` names an :class:`Adapter` subclass, or a factory called with the adapter
    class readyq currently has for this database that returns one (a variant of the
    built-in adapter). Without ``spec`` the registered adapter is returned unchanged.
    """
    name = registry_name(engine)
    current = dialects.adapter_class(name)
    if spec is None:
        return current
    obj = load_object(spec)
    if isinstance(obj, type) and issubclass(obj, Adapter):
        chosen = obj
    elif callable(obj):
        chosen = obj(current)
        if not (isinstance(chosen, type) and issubclass(chosen, Adapter)):
            raise TypeError(f"{spec} returned {chosen!r}, not an Adapter subclass")
    else:
        raise TypeError(f"{spec} is neither an Adapter subclass nor a factory of one")
    dialects.register(chosen, name)
    # readyq's create_engine() picks engine options by the URL's backend name before it
    # knows the server (mysql+pymysql:// on MariaDB asks "mysql"): register it there too,
    # so the adapter under test also decides how engines for this URL are created.
    url_name = engine.url.get_backend_name()
    if url_name != name:
        dialects.register(chosen, url_name)
    return chosen
