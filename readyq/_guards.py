"""SQL guards taken from the state machine: what every transition's UPDATE checks.

Internal. ``guard(name)`` is ``state IN (sources of TRANSITIONS[name])``.
"""

from __future__ import annotations

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


def guard(name: str) -> sa.ColumnElement[bool]:
    """``state IN (sources of transition name)``."""
    return jobs.c.state.in_(sorted(TRANSITIONS[name].sources))


def cut(text: str) -> str:
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 3] + "..."
