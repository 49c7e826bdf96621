"""readyq.fairshare: weighted fair share of slots, counting held slots, within one slot."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from readyq.fairshare import GroupDemand, fair_share, group_weight

# ---------------------------------------------------------------------------------------------
# Reference model: exact water-filling, written independently of the module under test.
# ---------------------------------------------------------------------------------------------


def _lowest_level(
    func: Callable[[Fraction], Fraction], target: int, points: Iterable[Fraction]
) -> Fraction:
    """Lowest level >= 0 at which a nondecreasing piecewise-linear `func` reaches `target`."""
    low = Fraction(0)
    if func(low) >= target:
        return low
    for high in sorted(set(points)):
        if high <= low:
            continue
        if func(high) >= target:
            return low + (target - func(low)) * (high - low) / (func(high) - func(low))
        low = high
    raise AssertionError("target above the function's maximum")


def _usage(g: GroupDemand) -> int:
    return g.running + g.served


def water_fill(groups: Sequence[GroupDemand], k: int) -> dict[str, Fraction]:
    """Non-preemptive weighted max-min fair split of k new slots (held slots stay held)."""

    def new_slots(level: Fraction, g: GroupDemand) -> Fraction:
        return min(max(level * Fraction(g.weight) - _usage(g), Fraction(0)), Fraction(g.ready))

    def total(level: Fraction) -> Fraction:
        return sum((new_slots(level, g) for g in groups), Fraction(0))

    points = [Fraction(_usage(g)) / Fraction(g.weight) for g in groups]
    points += [Fraction(_usage(g) + g.ready) / Fraction(g.weight) for g in groups]
    level = _lowest_level(total, k, points)
    return {g.name: new_slots(level, g) for g in groups}


def _share(level: Fraction, g: GroupDemand) -> Fraction:
    return min(level * Fraction(g.weight), Fraction(_usage(g) + g.ready))


def share_level(groups: Sequence[GroupDemand], slots: int) -> Fraction:
    """The level theta at which the weighted max-min fair split of `slots` total slots,
    a group using at most usage + ready, adds up to `slots`."""

    def total(level: Fraction) -> Fraction:
        return sum((_share(level, g) for g in groups), Fraction(0))

    points = [Fraction(_usage(g) + g.ready) / Fraction(g.weight) for g in groups]
    return _lowest_level(total, slots, points)


def share_of_total(groups: Sequence[GroupDemand], slots: int) -> dict[str, Fraction]:
    """Weighted max-min fair split of `slots` total slots, a group using at most usage + ready."""
    level = share_level(groups, slots)
    return {g.name: _share(level, g) for g in groups}


def rule_ranking(groups: Sequence[GroupDemand], free: int) -> list[str]:
    """The module docstring's rule, slot by slot, in exact fractions.

    Slot j goes to a group with a ready job left whose virtual start (u + a) / w is below
    the level theta of the fair share of n + j slots; among them, the smallest
    (virtual finish (u + a + 1) / w, -weight, name).
    """
    weight = {g.name: Fraction(g.weight) for g in groups}
    used = {g.name: _usage(g) for g in groups}
    ready = {g.name: g.ready for g in groups}
    given = dict.fromkeys(weight, 0)
    ranking: list[str] = []
    for j in range(1, min(free, sum(ready.values())) + 1):
        theta = share_level(groups, sum(used.values()) + j)
        eligible = [
            m for m in weight if given[m] < ready[m] and (used[m] + given[m]) / weight[m] < theta
        ]
        best = min(eligible, key=lambda m: ((used[m] + given[m] + 1) / weight[m], -weight[m], m))
        given[best] += 1
        ranking.append(best)
    return ranking


def prefix_counts(ranking: Sequence[str]) -> Iterable[tuple[int, Counter[str]]]:
    """Yield (k, slots per group among the first k) for every prefix of the ranking."""
    counts: Counter[str] = Counter()
    for k, name in enumerate(ranking, start=1):
        counts[name] += 1
        yield k, counts


def run_saturated(weights: Mapping[str, float], frees: Iterable[int]) -> list[str]:
    """Call fair_share once per entry of `frees` with every group backlogged; return dispatches.

    Each answer is run and finished before the next call, so it feeds back through `served`.
    """
    served = dict.fromkeys(weights, 0)
    dispatched: list[str] = []
    for free in frees:
        groups = [
            GroupDemand(n, w, running=0, ready=free, served=served[n]) for n, w in weights.items()
        ]
        for name in fair_share(groups, free):
            served[name] += 1
            dispatched.append(name)
    return dispatched


def max_lag(weights: Mapping[str, float], dispatched: Sequence[str]) -> Fraction:
    """Largest |served_i(t) - t * w_i / W| over every dispatch t and group i (exact)."""
    exact = {n: Fraction(w) for n, w in weights.items()}
    total = sum(exact.values(), Fraction(0))
    worst = Fraction(0)
    for t, counts in prefix_counts(dispatched):
        for name, weight in exact.items():
            worst = max(worst, abs(counts[name] - t * weight / total))
    return worst


def shares(dispatched: Sequence[str]) -> dict[str, float]:
    """Fraction of all dispatches each group received."""
    counts = Counter(dispatched)
    return {name: counts[name] / len(dispatched) for name in sorted(counts)}


# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

WEIGHTS = st.one_of(
    st.floats(min_value=0.01, max_value=1000.0), st.integers(min_value=1, max_value=20)
)
NAMES = st.text(alphabet="abcdefgh", min_size=1, max_size=2)
#: Few distinct weights, some inexact in binary: ties between virtual finishes are common.
TIED_WEIGHTS = st.sampled_from([1, 2, 3, 0.5, 0.1, 0.3])


@st.composite
def demands(
    draw: st.DrawFn,
    *,
    max_count: int = 8,
    held: bool = True,
    weights: st.SearchStrategy[float] = WEIGHTS,
) -> list[GroupDemand]:
    """1 to 6 groups with distinct names, arbitrary weights and small counts."""
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    count = st.integers(min_value=0, max_value=max_count)
    zero = st.just(0)
    return [
        GroupDemand(
            name,
            draw(weights),
            running=draw(count if held else zero),
            ready=draw(count),
            served=draw(count if held else zero),
        )
        for name in names
    ]


WEIGHT_MAPS = st.dictionaries(NAMES, WEIGHTS, min_size=1, max_size=6)
FREES = st.lists(st.integers(min_value=1, max_value=8), min_size=1, max_size=15)
FREE = st.integers(min_value=0, max_value=12)


# ---------------------------------------------------------------------------------------------
# The seed's failures (NOTES.md, DESIGN-evidence.md E7 / section 9 bug 2)
# ---------------------------------------------------------------------------------------------


class TestSeedCases:
    def test_weights_1_1_8_with_4_slots_serve_10_10_80(self) -> None:
        """Weights 1/1/8 with 4 slots a round serve 10/10/80 % over 250 rounds, lag below 1."""
        weights = {"a": 1, "b": 1, "c": 8}
        dispatched = run_saturated(weights, [4] * 250)
        assert Counter(dispatched) == {"a": 100, "b": 100, "c": 800}
        assert max_lag(weights, dispatched) < 1

    def test_weight_96_beside_four_weight_1_groups_gets_96_percent(self) -> None:
        """A weight-96 group beside four weight-1 groups gets 96 % of the slots instead of none."""
        weights = {"a": 1, "b": 1, "c": 1, "d": 1, "z": 96}
        dispatched = run_saturated(weights, [4] * 250)
        assert Counter(dispatched) == {"a": 10, "b": 10, "c": 10, "d": 10, "z": 960}
        assert max_lag(weights, dispatched) < 1

    def test_weights_1_2_with_1_slot_serve_b_two_thirds(self) -> None:
        """Weights 1/2 with one slot a round serve b two thirds of the time, and a the rest."""
        weights = {"a": 1, "b": 2}
        dispatched = run_saturated(weights, [1] * 999)
        assert Counter(dispatched) == {"a": 333, "b": 666}
        assert max_lag(weights, dispatched) < 1

    def test_weights_3_1_with_2_slots_serve_75_25(self) -> None:
        """Weights 3/1 with two slots a round serve 75/25 %."""
        weights = {"a": 3, "b": 1}
        dispatched = run_saturated(weights, [2] * 500)
        assert Counter(dispatched) == {"a": 750, "b": 250}
        assert max_lag(weights, dispatched) < 1

    def test_group_weight_takes_the_largest_job_weight_not_the_first_row(self) -> None:
        """A group's weight is its heaviest job's, whichever row comes first."""
        assert group_weight([1.0, 8.0, 2.0]) == 8.0
        assert group_weight([8.0, 1.0, 2.0]) == 8.0


# ---------------------------------------------------------------------------------------------
# Slots already held
# ---------------------------------------------------------------------------------------------


class TestHeldSlots:
    def test_a_group_holding_slots_gets_fewer_new_ones(self) -> None:
        """Equal weights, A holding 3 slots and B none: all 3 free slots go to B."""
        groups = [GroupDemand("A", 1, running=3, ready=5), GroupDemand("B", 1, running=0, ready=5)]
        assert fair_share(groups, 3) == ["B", "B", "B"]

    def test_held_slots_are_shared_by_weight(self) -> None:
        """Weights 2/1 over 6 slots: A holding 4 is at its share, so both free slots go to B."""
        groups = [GroupDemand("A", 2, running=4, ready=5), GroupDemand("B", 1, running=0, ready=5)]
        assert fair_share(groups, 2) == ["B", "B"]

    def test_a_group_above_its_fair_share_gets_nothing(self) -> None:
        """A group holding more than its share of the total capacity gets no new slot."""
        groups = [
            GroupDemand("big", 1, running=10, ready=5),
            GroupDemand("x", 1, running=0, ready=2),
            GroupDemand("y", 1, running=0, ready=2),
        ]
        assert sorted(fair_share(groups, 4)) == ["x", "x", "y", "y"]

    def test_a_group_without_ready_jobs_leaves_its_share_to_the_others(self) -> None:
        """A heavy group with nothing ready takes no slot and does not block the light group."""
        groups = [
            GroupDemand("heavy", 100, running=0, ready=0),
            GroupDemand("light", 1, running=5, ready=3),
        ]
        assert fair_share(groups, 3) == ["light", "light", "light"]


# ---------------------------------------------------------------------------------------------
# Work conservation
# ---------------------------------------------------------------------------------------------


class TestWorkConservation:
    @settings(deadline=None)
    @given(groups=demands(), free=FREE)
    def test_every_free_slot_with_a_ready_job_is_filled(
        self, groups: list[GroupDemand], free: int
    ) -> None:
        """The ranking has min(free, total ready) entries."""
        assert len(fair_share(groups, free)) == min(free, sum(g.ready for g in groups))

    @settings(deadline=None)
    @given(groups=demands(), free=FREE)
    def test_no_group_gets_more_slots_than_it_has_ready_jobs(
        self, groups: list[GroupDemand], free: int
    ) -> None:
        """Every name appears at most `ready` times, and only names of the given groups appear."""
        counts = Counter(fair_share(groups, free))
        ready = {g.name: g.ready for g in groups}
        assert all(counts[name] <= ready[name] for name in counts)

    def test_no_free_slots_give_an_empty_ranking(self) -> None:
        """free == 0 ranks nothing."""
        assert fair_share([GroupDemand("a", 1, running=0, ready=3)], 0) == []

    def test_no_groups_give_an_empty_ranking(self) -> None:
        """No groups rank nothing, whatever free is."""
        assert fair_share([], 5) == []


# ---------------------------------------------------------------------------------------------
# One call: weighted max-min fairness
# ---------------------------------------------------------------------------------------------


class TestOneShotFairness:
    @settings(deadline=None)
    @given(groups=demands(), free=FREE)
    def test_every_prefix_is_less_than_one_slot_behind_the_water_fill(
        self, groups: list[GroupDemand], free: int
    ) -> None:
        """For every prefix of k slots, each group has more than water_fill(k) - 1 of them."""
        for k, counts in prefix_counts(fair_share(groups, free)):
            target = water_fill(groups, k)
            assert all(counts[g.name] > target[g.name] - 1 for g in groups)

    @settings(deadline=None)
    @given(groups=demands(), free=FREE)
    def test_every_prefix_is_less_than_one_slot_ahead_of_the_fair_share(
        self, groups: list[GroupDemand], free: int
    ) -> None:
        """A group given slots in a prefix of k ends below its fair share of n + k slots plus 1."""
        held = sum(_usage(g) for g in groups)
        for k, counts in prefix_counts(fair_share(groups, free)):
            target = share_of_total(groups, held + k)
            assert all(
                _usage(g) + counts[g.name] < target[g.name] + 1 for g in groups if counts[g.name]
            )

    @settings(deadline=None)
    @given(groups=demands(held=False), free=FREE)
    def test_from_empty_every_prefix_is_within_one_slot_of_the_water_fill(
        self, groups: list[GroupDemand], free: int
    ) -> None:
        """With nothing held, every prefix is within one slot of the water-fill for every group."""
        for k, counts in prefix_counts(fair_share(groups, free)):
            target = water_fill(groups, k)
            assert all(abs(counts[g.name] - target[g.name]) < 1 for g in groups)

    @settings(deadline=None)
    @given(groups=demands(), free=FREE)
    def test_when_no_group_is_above_its_share_every_prefix_is_within_one_slot_of_the_water_fill(
        self, groups: list[GroupDemand], free: int
    ) -> None:
        """If no group holds more than its share of n + k slots, prefix k is within one slot."""
        held = sum(_usage(g) for g in groups)
        for k, counts in prefix_counts(fair_share(groups, free)):
            share = share_of_total(groups, held + k)
            if all(_usage(g) <= share[g.name] for g in groups):
                target = water_fill(groups, k)
                assert all(abs(counts[g.name] - target[g.name]) < 1 for g in groups)

    def test_a_heavy_group_beside_many_light_ones_stays_within_one_slot_of_its_share(self) -> None:
        """Weight 51 beside 49 weight-1 groups gets 26 of 50 slots (share 25.5), not all 50."""
        groups = [GroupDemand("heavy", 51, running=0, ready=50)]
        groups += [GroupDemand(f"light{i:02d}", 1, running=0, ready=50) for i in range(49)]
        assert Counter(fair_share(groups, 50))["heavy"] == 26


# ---------------------------------------------------------------------------------------------
# Many calls: long-run shares and lag
# ---------------------------------------------------------------------------------------------


class TestLongRun:
    @settings(deadline=None)
    @given(weights=WEIGHT_MAPS, frees=FREES)
    def test_backlogged_groups_stay_within_one_slot_of_their_share_after_every_dispatch(
        self, weights: dict[str, float], frees: list[int]
    ) -> None:
        """|served_i(t) - t * w_i / W| < 1 after every dispatch t, whatever free is per call."""
        assert max_lag(weights, run_saturated(weights, frees)) < 1

    @settings(deadline=None)
    @given(
        weights=WEIGHT_MAPS,
        capacity=st.integers(min_value=1, max_value=8),
        durations=st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=10),
        rounds=st.integers(min_value=1, max_value=20),
    )
    def test_lag_bound_holds_when_jobs_stay_running_across_calls(
        self, weights: dict[str, float], capacity: int, durations: list[int], rounds: int
    ) -> None:
        """Jobs running over several rounds count in `running`, then `served`: the bound holds."""
        served = dict.fromkeys(weights, 0)
        in_flight: list[tuple[int, str]] = []  # (round it finishes, group)
        dispatched: list[str] = []
        for now in range(rounds):
            for end, name in [job for job in in_flight if job[0] <= now]:
                in_flight.remove((end, name))
                served[name] += 1
            free = capacity - len(in_flight)
            running = Counter(name for _, name in in_flight)
            groups = [
                GroupDemand(n, w, running=running[n], ready=free, served=served[n])
                for n, w in weights.items()
            ]
            for name in fair_share(groups, free):
                in_flight.append((now + durations[len(dispatched) % len(durations)], name))
                dispatched.append(name)
        assert max_lag(weights, dispatched) < 1

    def test_weights_1_2_with_one_slot_per_call_alternate_b_b_a(self) -> None:
        """With served memory, weights 1/2 and one slot a call give b, b, a, repeating."""
        assert run_saturated({"a": 1, "b": 2}, [1] * 9) == ["b", "b", "a"] * 3

    def test_without_served_memory_one_slot_per_call_always_goes_to_the_heavier_group(self) -> None:
        """The slot model alone (served always 0, nothing held) answers the same every call."""
        groups = [GroupDemand("a", 1, running=0, ready=1), GroupDemand("b", 2, running=0, ready=1)]
        assert fair_share(groups, 1) == ["b"]


# ---------------------------------------------------------------------------------------------
# Starvation
# ---------------------------------------------------------------------------------------------


def _service_gaps(name: str, dispatched: Sequence[str]) -> list[int]:
    """Dispatches up to the first slot of `name`, between its slots, and after its last one."""
    times = [t for t, other in enumerate(dispatched, start=1) if other == name]
    if not times:
        return [len(dispatched) + 1]
    edges = [0, *times]
    return [b - a for a, b in pairwise(edges)] + [len(dispatched) + 1 - times[-1]]


class TestStarvation:
    def test_weight_1_beside_weight_100_is_served_once_every_101_dispatches(self) -> None:
        """A weight-1 group beside a weight-100 group gets a slot in each run of 101 dispatches."""
        dispatched = run_saturated({"heavy": 100, "light": 1}, [3] * 337)
        assert max(_service_gaps("light", dispatched)) <= 101
        assert Counter(dispatched)["light"] == 10

    @settings(deadline=None)
    @given(
        weights=st.dictionaries(
            NAMES, st.integers(min_value=1, max_value=20), min_size=1, max_size=5
        ),
        free=st.integers(min_value=1, max_value=4),
    )
    def test_every_backlogged_group_is_served_within_its_starvation_bound(
        self, weights: dict[str, int], free: int
    ) -> None:
        """First slot within ceil(W/w_i) dispatches, then one in every ceil(2W/w_i)."""
        total = sum(weights.values())
        rounds = math.ceil(3 * total / min(weights.values()) / free)
        dispatched = run_saturated(weights, [free] * rounds)
        for name, weight in weights.items():
            gaps = _service_gaps(name, dispatched)
            assert gaps[0] <= math.ceil(total / weight)
            assert max(gaps) <= math.ceil(2 * total / weight)


# ---------------------------------------------------------------------------------------------
# Determinism and tie-break
# ---------------------------------------------------------------------------------------------


class TestDeterminism:
    @settings(deadline=None, max_examples=300)
    @given(groups=demands(weights=TIED_WEIGHTS), free=FREE)
    def test_the_ranking_is_the_rule_applied_slot_by_slot(
        self, groups: list[GroupDemand], free: int
    ) -> None:
        """Integer arithmetic gives exactly the ranking of the rule in exact fractions."""
        assert fair_share(groups, free) == rule_ranking(groups, free)

    @settings(deadline=None)
    @given(groups=demands(), free=FREE)
    def test_same_input_gives_the_same_ranking(self, groups: list[GroupDemand], free: int) -> None:
        """Two calls with equal inputs (fresh objects) give the same ranking."""
        copies = [GroupDemand(g.name, g.weight, g.running, g.ready, g.served) for g in groups]
        assert fair_share(groups, free) == fair_share(copies, free)

    @settings(deadline=None)
    @given(data=st.data(), groups=demands(), free=FREE)
    def test_order_of_groups_does_not_change_the_ranking(
        self, data: st.DataObject, groups: list[GroupDemand], free: int
    ) -> None:
        """Any permutation of `groups` gives the same ranking."""
        shuffled = data.draw(st.permutations(groups))
        assert fair_share(shuffled, free) == fair_share(groups, free)

    @settings(deadline=None, max_examples=500)
    @given(groups=demands(max_count=20), free=FREE)
    def test_ready_counts_capped_at_free_give_the_same_ranking(
        self, groups: list[GroupDemand], free: int
    ) -> None:
        """A scan may stop counting a group's ready jobs at `free`: the ranking is the same."""
        capped = [
            GroupDemand(g.name, g.weight, g.running, min(g.ready, free), g.served) for g in groups
        ]
        assert fair_share(capped, free) == fair_share(groups, free)

    def test_a_tie_goes_to_the_heavier_group(self) -> None:
        """Equal virtual finish times (1/1 and 2/2): the heavier group gets the slot."""
        groups = [
            GroupDemand("a", 1, running=0, ready=1),
            GroupDemand("b", 2, running=0, ready=1, served=1),
        ]
        assert fair_share(groups, 1) == ["b"]

    def test_a_tie_between_equal_weights_goes_to_the_smaller_name(self) -> None:
        """Equal virtual finish times and weights: the smaller name gets the slot first."""
        groups = [GroupDemand("b", 1, running=0, ready=1), GroupDemand("a", 1, running=0, ready=1)]
        assert fair_share(groups, 2) == ["a", "b"]

    def test_float_weights_are_compared_exactly(self) -> None:
        """Weights 0.1 and 0.3, inexact in binary, still serve 1:3 over 400 dispatches."""
        weights = {"a": 0.1, "b": 0.3}
        dispatched = run_saturated(weights, [4] * 100)
        assert Counter(dispatched) == {"a": 100, "b": 300}


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


class TestValidation:
    @pytest.mark.parametrize("field", ["running", "ready", "served"])
    def test_negative_count_is_rejected_naming_the_field(self, field: str) -> None:
        """A negative running, ready or served count raises ValueError naming the field."""
        counts = {"running": 0, "ready": 0, "served": 0, field: -1}
        with pytest.raises(ValueError, match=rf"group 'a': {field} must be >= 0"):
            GroupDemand("a", 1.0, **counts)

    @pytest.mark.parametrize("weight", [0, -1.0, math.nan, math.inf, -math.inf])
    def test_weight_that_is_not_finite_and_positive_is_rejected(self, weight: float) -> None:
        """A weight of 0, below 0, NaN or infinite raises ValueError naming the weight."""
        with pytest.raises(ValueError, match=r"group 'a': weight must be finite and > 0"):
            GroupDemand("a", weight, running=0, ready=1)

    def test_non_integer_count_is_a_type_error(self) -> None:
        """A count that is not an int (here 1.5) raises TypeError."""
        with pytest.raises(TypeError, match=r"running must be an int"):
            GroupDemand("a", 1.0, running=1.5, ready=1)  # type: ignore[arg-type]

    def test_duplicate_group_names_are_rejected(self) -> None:
        """Two groups with the same name raise ValueError naming it."""
        groups = [GroupDemand("a", 1, running=0, ready=1), GroupDemand("a", 2, running=0, ready=1)]
        with pytest.raises(ValueError, match=r"duplicate group name 'a'"):
            fair_share(groups, 1)

    def test_negative_free_is_rejected(self) -> None:
        """free < 0 raises ValueError."""
        with pytest.raises(ValueError, match=r"free must be >= 0"):
            fair_share([GroupDemand("a", 1, running=0, ready=1)], -1)


class TestGroupWeight:
    @settings(deadline=None)
    @given(weights=st.lists(WEIGHTS, min_size=1, max_size=8), data=st.data())
    def test_group_weight_does_not_depend_on_job_order(
        self, weights: list[float], data: st.DataObject
    ) -> None:
        """Any order of the same job weights gives the same group weight: their maximum."""
        shuffled = data.draw(st.permutations(weights))
        assert group_weight(shuffled) == group_weight(weights) == max(weights)

    def test_group_weight_is_not_diluted_by_lighter_jobs(self) -> None:
        """One heavy job keeps its weight however many light jobs share the group."""
        assert group_weight([5.0] + [0.5] * 100) == 5.0

    def test_group_weight_of_no_jobs_is_rejected(self) -> None:
        """An empty list of job weights raises ValueError."""
        with pytest.raises(ValueError, match=r"at least one job weight"):
            group_weight([])

    def test_group_weight_rejects_an_invalid_job_weight(self) -> None:
        """A job weight that is not finite and > 0 raises ValueError."""
        with pytest.raises(ValueError, match=r"job weight must be finite and > 0"):
            group_weight([1.0, math.nan])
