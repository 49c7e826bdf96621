"""Permutations: every interleaving of small multi-session scenarios (isolationtester style)."""

from __future__ import annotations

import pytest
from readyq_conformance.env import Env
from readyq_conformance.permutations import SPECS, run_spec
from readyq_conformance.requirements import Requirements

#: Quick specs that belong to the core subset; the 20-interleaving ones are marked slow.
CORE = {"claim_vs_enqueue", "stale_finalize_after_reclaim"}


def _param(name: str):  # type: ignore[no-untyped-def]
    marks = [pytest.mark.core] if name in CORE else []
    if len(list(SPECS[name].interleavings())) > 10:
        marks.append(pytest.mark.slow)
    return pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", [_param(n) for n in SPECS])
def test_every_interleaving(env: Env, caps: Requirements, name: str, readyq_note) -> None:  # type: ignore[no-untyped-def]
    """Every interleaving of the scenario's sessions meets its expected outcome."""
    spec = SPECS[name]
    missing = [r for r in spec.requires if not caps.has(r)]
    if missing:
        pytest.skip(f"needs capability {', '.join(missing)}")
    rep = run_spec(spec, env, caps)
    readyq_note(rep.summary())
    assert not rep.violations, f"{spec.doc}\n{rep.summary()}\n" + "\n".join(rep.violations[:5])
    assert rep.checked > 0, f"no interleaving could be checked: {rep.summary()}"
