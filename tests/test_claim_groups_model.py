"""The grouped claim against a pure-Python model of its rule, on every backend.

It runs as a locked select per group, then the UPDATE, on every backend. It must take
exactly the jobs, in exactly the order, that the rule gives: each ranked group its asked
share (in rank order, as far as ``limit`` lets), then what is left of ``limit`` to the
groups with more, in the same order.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import readyq
from readyq.schema import deps, jobs

pytestmark = pytest.mark.backend

GROUPS = ("a", "b", "c", "d")


def model(ready: list[tuple[int, str, int]], ranking: list[str], limit: int) -> list[int]:
    """The rule over ``ready`` = (id, group, priority) rows; returns job ids in claim order."""
    queue: dict[str, list[int]] = {g: [] for g in ranking}
    for i, g, _ in sorted(ready, key=lambda r: (r[2], r[0])):
        queue.setdefault(g, []).append(i)
    asked = Counter(ranking)
    out: list[int] = []
    for g in asked:  # rank order: first appearance
        take = min(asked[g], limit - len(out))
        out += queue[g][:take]
        del queue[g][:take]
    for g in asked:
        take = limit - len(out)
        out += queue[g][:take]
        del queue[g][:take]
    return out


def test_the_model_gives_each_group_its_share_before_leftovers() -> None:
    """The oracle itself, on a hand-checked case: b's share, a's share, then b's rest."""
    ready = [(1, "a", 0), (2, "a", 0), (3, "b", 0), (4, "b", 0), (5, "b", 1)]
    assert model(ready, ["b", "a"], 4) == [3, 1, 4, 5]


def test_the_model_passes_a_dry_groups_slots_down_the_ranking() -> None:
    """c asks 2 of a limit of 2 but has one job: d's turn in the first pass takes the other."""
    ready = [(1, "c", 0), (2, "d", 0), (3, "d", 0)]
    assert model(ready, ["c", "c", "d"], 2) == [1, 2]


def _reset(q: readyq.Queue) -> None:
    """Empty this test's own tables (its database is its own) between examples."""
    with q.engine.begin() as conn:
        conn.execute(sa.delete(deps))
        conn.execute(sa.delete(jobs))


jobs_st = st.lists(st.tuples(st.sampled_from(GROUPS), st.integers(0, 2)), max_size=14)
ranking_st = st.lists(st.sampled_from((*GROUPS, "e")), min_size=1, max_size=6)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(spec=jobs_st, ranking=ranking_st, limit=st.integers(1, 8))
def test_grouped_claim_takes_what_the_model_takes_in_its_order(
    q: readyq.Queue, spec: list[tuple[str, int]], ranking: list[str], limit: int
) -> None:
    """Whatever the ready set, ranking (repeats, unknown groups) and limit."""
    _reset(q)
    ids = [q.enqueue("t", group=g, priority=p) for g, p in spec]
    ready = [(i, g, p) for i, (g, p) in zip(ids, spec, strict=True)]
    got: list[Any] = q.claim("w", limit=limit, groups=ranking)
    assert [lease.job_id for lease in got] == model(ready, ranking, limit)
