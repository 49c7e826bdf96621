"""Choosing the adapter: the only place in readyq that reads the dialect's name or version.

Internal: the functions here may change in any 0.x release. Dialect authors register an
:class:`~readyq.dialects._base.Adapter` subclass with :func:`register`.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from ..errors import UnsupportedDatabase
from ._base import Adapter, PipelineObserver, plan_once, plans_once
from .mysql import MariaDBAdapter, MySQLAdapter
from .postgresql import PostgreSQLAdapter
from .sqlite import SQLiteAdapter

__all__ = [
    "Adapter",
    "PipelineObserver",
    "adapter_class",
    "create_engine",
    "for_engine",
    "plan_once",
    "plans_once",
    "register",
]

_REGISTRY: dict[str, type[Adapter]] = {}


def register(adapter: type[Adapter], name: str | None = None) -> None:
    """Make ``adapter`` the one used for engines whose dialect is ``name``."""
    _REGISTRY[name or adapter.name] = adapter


for _adapter in (PostgreSQLAdapter, MySQLAdapter, MariaDBAdapter, SQLiteAdapter):
    register(_adapter)


def _registry_name(dialect: sa.Dialect) -> str:
    # With mysql+pymysql:// a MariaDB server still reports name "mysql": the flag tells.
    if dialect.name in ("mysql", "mariadb"):
        return "mariadb" if getattr(dialect, "is_mariadb", False) else "mysql"
    return dialect.name


def adapter_class(name: str) -> type[Adapter]:
    """The adapter registered for a dialect name, or UnsupportedDatabase."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY))
        raise UnsupportedDatabase(
            f"readyq has no adapter for the {name!r} dialect (it knows {known}); "
            "write one and register it with readyq.dialects.register()"
        ) from None


def create_engine(url: str | sa.URL, **kwargs: Any) -> Engine:
    """An engine for ``url`` with the options its adapter asks for."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise UnsupportedDatabase(f"not a database URL ({exc}); e.g. sqlite:///jobs.db") from None
    name = parsed.get_backend_name()
    options = adapter_class(name).engine_options(parsed)
    options.update(kwargs)
    try:
        return sa.create_engine(parsed, **options)
    except sa.exc.NoSuchModuleError as exc:
        raise UnsupportedDatabase(
            f"SQLAlchemy knows no dialect/driver {parsed.drivername!r}; check the URL "
            "(e.g. postgresql+psycopg://, mysql+pymysql://, sqlite:///file.db)"
        ) from exc
    except ImportError as exc:
        raise UnsupportedDatabase(
            f"the driver for {parsed.drivername!r} is not installed ({exc}); install it, "
            "e.g. pip install 'readyq[postgresql]' or 'readyq[mysql]'"
        ) from exc


def for_engine(engine: Engine) -> Adapter:
    """The adapter for ``engine``, checked against the server's version (connects once)."""
    if engine.dialect.server_version_info is None:
        with engine.connect():
            pass  # the first connect fills in server_version_info and is_mariadb
    cls = adapter_class(_registry_name(engine.dialect))
    version = engine.dialect.server_version_info or ()
    return cls(tuple(int(v) for v in version if isinstance(v, int)))
