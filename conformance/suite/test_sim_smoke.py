"""Simulator: short seeded runs of readyq_sim against this database, with all its checkers."""

from __future__ import annotations

import pytest
from readyq_conformance.env import Env

pytestmark = pytest.mark.sim

#: (scenario, seed, overrides): small budgets, so the whole module takes seconds.
RUNS = [
    ("quiet", 1, {"jobs": 16, "workers": 2, "steps": 1500}),
    ("fencing", 2, {"jobs": 12, "workers": 2, "steps": 1500}),
]


def simulator():  # type: ignore[no-untyped-def]
    """The simulator's run API, or None (hook: readyq_sim.run.run + checkers.check_all)."""
    try:
        from readyq_sim.checkers import check_all
        from readyq_sim.config import scenario
        from readyq_sim.run import run
    except ImportError:
        return None
    return run, check_all, scenario


@pytest.mark.parametrize(("name", "seed", "changes"), RUNS, ids=[f"{r[0]}-{r[1]}" for r in RUNS])
def test_simulated_run_passes_every_checker(
    env: Env, name: str, seed: int, changes: dict[str, int], readyq_note
) -> None:  # type: ignore[no-untyped-def]
    """A short seeded simulation (crashes, pauses, dropped connections) keeps every invariant."""
    api = simulator()
    if api is None:
        pytest.skip("readyq_sim offers no run API here (hook: test_sim_smoke.simulator)")
    run, check_all, scenario = api
    cfg = scenario(name, seed).with_(**changes)
    res = run(cfg, env.site.url)
    checks = check_all(res.world, res.final, res.live)
    failed = [f"{ch.name}: {ch.first}" for ch in checks if ch.ok is False]
    readyq_note(
        f"seed {seed}, {res.steps} steps, {len(checks)} checkers, "
        + ("all pass" if not failed else f"{len(failed)} fail")
    )
    assert res.stuck is None, f"the simulator got stuck: {res.stuck}"
    assert not failed, "; ".join(failed)
