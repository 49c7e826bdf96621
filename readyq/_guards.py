"""SQL guards taken from the state machine: what every transition's UPDATE checks.

Internal. ``guard(name)`` is ``state IN (sources of TRANSITIONS[name])``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa

from .job import MAX_ERROR_CHARS, TRANSITIONS
from .schema import jobs

__all__: list[str] = []

LEASE_CLEARED: dict[str, Any] = {
    "lease_owner": None,
    "lease_expires_us": None,
    "deadline_us": None,
}


def in_states(states: Iterable[str]) -> sa.ColumnElement[bool]:
    """``state IN (...)`` with one bound parameter per state.

    A plain list would become an expanding parameter, which SQLAlchemy rewrites into the
    SQL on every execution: measurable CPU on every hot statement.
    """
    return jobs.c.state.in_(
        [sa.bindparam(None, str(s), type_=jobs.c.state.type) for s in sorted(states)]
    )


def guard(name: str) -> sa.ColumnElement[bool]:
    """``state IN (sources of transition name)``."""
    return in_states(TRANSITIONS[name].sources)


def id_binds(name: str, n: int) -> list[sa.BindParameter[Any]]:
    """``n`` bind parameters ``name0 .. name{n-1}``: an id list compiled once per length
    (an expanding parameter is re-rendered on every execution)."""
    return [sa.bindparam(f"{name}{k}") for k in range(n)]


def id_values(name: str, ids: Sequence[int]) -> dict[str, int]:
    """The values for :func:`id_binds` ``(name, len(ids))``."""
    return {f"{name}{k}": job_id for k, job_id in enumerate(ids)}


def cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
