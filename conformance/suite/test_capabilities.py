"""Capabilities: what the adapter declares holds on this database."""

from __future__ import annotations

import pytest
from readyq_conformance.requirements import CAPABILITIES, Requirements

pytestmark = pytest.mark.core


@pytest.mark.parametrize("name", sorted(CAPABILITIES))
def test_declared_capability_holds(caps: Requirements, name: str) -> None:
    """Every capability the adapter declares is confirmed by a live probe."""
    res = caps.results[name]
    assert res.verdict != "ERROR", (
        f"the adapter declares {name} ({res.meaning}), but on this database: {res.detail}"
    )


def test_declarations_are_consistent(caps: Requirements) -> None:
    """The declarations do not contradict each other (some claim exclusion is declared)."""
    problems = caps.consistency_errors()
    assert not problems, "; ".join(problems)
