"""Weighted fair share: which group gets each of the next ``free`` slots.

Pure, deterministic, standard library only. :func:`fair_share` ranks slots; it neither reads
nor writes the database, so the same counters always give the same ranking.

Model
-----
Each group ``i`` has a weight ``w_i > 0``, ``running_i`` slots it holds now, ``ready_i`` jobs
it could start now, and an optional counter ``served_i``. The rule only sees the group's
*usage* ``u_i = running_i + served_i``:

* **Slot model** (``served = 0``): usage is the slots held, so the total capacity
  ``free + sum(running)`` is shared in proportion to weight and a group that already holds
  its share gets no new slot.
* **Long-run model**: ``served`` counts this group's dispatches that have *finished* (are no
  longer counted in ``running``), so ``u_i`` is the number of its dispatches so far. Never
  count a job in both fields. This memory is what makes shares hold over many calls even
  when ``free`` is smaller than the number of groups (weights 1 and 2 with one slot per call
  must alternate b, b, a; without memory every call would answer b).

Write ``n = sum(u_i)``, ``c_i = u_i + ready_i`` (the most slots group ``i`` can use) and
``W`` for the sum of weights.

* The **fair share** of ``T`` slots (``n <= T <= sum(c_i)``) is the weighted max-min fair
  (water-filling) division ``s_i(T) = min(theta * w_i, c_i)``, with ``theta`` the unique level
  at which ``sum(s_i(T)) = T``. It ignores what groups hold, so a group can be above it.
* The **non-preemptive water-fill** of ``k`` new slots is ``x_i(k) = min(max(lam * w_i - u_i,
  0), ready_i)``, with ``lam`` the lowest level at which ``sum(x_i(k)) = k``: slots are
  poured into the groups whose ``u_i / w_i`` is lowest, since held slots cannot be taken back.

Rule
----
Write ``a_i`` for the slots group ``i`` has among the first ``j - 1`` answers. Slot ``j`` goes
to a group with ``a_i < ready_i`` whose *virtual start* ``(u_i + a_i) / w_i`` is below the
current virtual time ``theta`` of the fair share of ``n + j`` slots. Among these groups, the
one with the smallest ``((u_i + a_i + 1) / w_i, -w_i, name)`` wins: earliest *virtual finish*,
then the heavier group, then the smaller name. This is worst-case fair weighted fair queueing
(WF2Q), or Balinski and Young's quota method. Plain stride scheduling (smallest finish, no
start check) is *not* within one slot: with weights 51 and 49 x 1, the heavy group takes the
first 50 slots when its fair share is 25.5.

Arithmetic is exact: the weights are scaled to integers in the same ratios (a float is a
binary fraction), and every comparison of virtual times is a comparison of integers. The
groups are sorted by name first. So the result does not depend on the order of ``groups``
or on float rounding.

Guarantees
----------
They hold for *every prefix* of the answer, so if only the first ``k`` ranked slots are
claimed, those ``k`` slots are still fair. Let ``a_i(k)`` be group ``i``'s slots among the
first ``k``:

1. Work conserving: the answer has ``min(free, sum(ready_i))`` entries and ``a_i <= ready_i``.
2. Never a slot ahead of the fair share: if ``a_i(k) > 0`` then ``u_i + a_i(k) < s_i(n + k) + 1``.
   A group already at or above its fair share gets no slot.
3. Never a slot behind the water-fill: ``a_i(k) > x_i(k) - 1``.
4. So, if no group holds more than its fair share (``u_i <= s_i(n + k)`` for all ``i``), then
   ``x_i(k) = s_i(n + k) - u_i`` and ``|a_i(k) - x_i(k)| < 1`` for every group.
5. Long run: say every group has ``ready_i >= free`` at every call (``free`` may change from
   call to call), every answer is dispatched in order and fed back into ``served`` and
   ``running``, and all counters start at 0. Then after every dispatch ``t``, every group has
   ``|u_i(t) - t * w_i / W| < 1``. That is, ``floor(t*w_i/W) <= u_i(t) <= ceil(t*w_i/W)``.
6. No starvation (follows from 5): group ``i`` gets its first slot within ``ceil(W / w_i)``
   dispatches, and any ``ceil(2 * W / w_i)`` consecutive dispatches contain one of its
   slots. A weight-1 group beside a weight-100 group gets its first slot within 101
   dispatches and then at least one in every 202.

Why 2 to 5 hold. Guarantee 2 is the start check. For 3 and 5, treat a group's next slot as a
unit job. The job is released when the fluid reference (``x`` for 3, ``t * w_i / W`` for 5)
starts that slot, and it is due when the fluid reference finishes it. The fluid grows by
exactly one slot per slot, so no window of slots has more jobs due than slots, and the jobs
can be scheduled. The start check admits every released job (``theta >= lam``, and
``theta >= t / W``). The virtual finish orders jobs by due time. Choosing the earliest due
job from any superset of the released jobs meets every due time (an exchange argument), and
a met due time means less than one slot behind. In 5 the rule depends only on the counters,
so splitting dispatches into calls changes nothing.

Capped ready counts
-------------------
Replacing every ``ready_i`` by ``min(ready_i, free)`` gives the same answer, so a scan may
stop counting a group's ready jobs at ``free`` (the Worker's does: its tick then costs the
same beside any backlog). Write ``theta_j`` and ``theta'_j`` for the levels of slot ``j``
without and with the cap, and suppose slots ``1 .. j - 1`` agree. Both answers have
``min(free, sum(ready_i))`` entries, and ``a_i < min(ready_i, free)`` iff ``a_i < ready_i``
while ``a_i <= j - 1 < free``. Capping can only lower ``c_i``, so ``theta'_j >= theta_j``,
and the two are equal unless some capped group has ``theta_j * w_i > u_i + free``. Such a
group is eligible in both (start ``(u_i + a_i) / w_i < theta_j``), with finish
``(u_i + a_i + 1) / w_i <= (u_i + free) / w_i < theta_j``. A group eligible only with the
cap has start ``>= theta_j``, so a later finish: it never wins, and slot ``j`` agrees.

Counters and groups that come and go
------------------------------------
Bound 5 covers a stretch in which the same groups, with the same weights, stay backlogged.
A group whose ``served`` is far below its share (for example a group that just arrived,
beside counters that have grown for hours) is owed that whole difference. It gets every slot
it can use until it catches up. Keep ``served`` per busy period, or over a bounded window,
and never across a change of the group set you do not mean to repay.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

__all__ = ["GroupDemand", "fair_share", "group_weight"]


def _where(what: str, group: str | None) -> str:
    return what if group is None else f"group {group!r}: {what}"


# The checks name the group only when they fail: formatting it on every call cost a
# Worker's ranking more than the ranking itself.
def _check_weight(weight: object, what: str, group: str | None = None) -> None:
    """Raise unless ``weight`` is a finite real number greater than zero."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float)):
        raise TypeError(
            f"{_where(what, group)} must be an int or float, got {type(weight).__name__}"
        )
    if not math.isfinite(weight) or weight <= 0:
        raise ValueError(f"{_where(what, group)} must be finite and > 0, got {weight!r}")


def _check_count(value: object, what: str, group: str | None = None) -> None:
    """Raise unless ``value`` is an int that is at least zero."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{_where(what, group)} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{_where(what, group)} must be >= 0, got {value}")


@dataclass(frozen=True)
class GroupDemand:
    """One group's input to :func:`fair_share`; every field is checked when it is created.

    ``served`` counts dispatches that have finished, so never count a job that is still in
    ``running`` in it too (see the module docstring).
    """

    name: str
    weight: float
    running: int
    ready: int
    served: int = 0

    def __post_init__(self) -> None:
        """Reject a non-string name, a weight that is not finite and > 0, or a negative count."""
        if not isinstance(self.name, str):
            raise TypeError(f"group name must be a str, got {type(self.name).__name__}")
        _check_weight(self.weight, "weight", self.name)
        _check_count(self.running, "running", self.name)
        _check_count(self.ready, "ready", self.name)
        _check_count(self.served, "served", self.name)


def group_weight(weights: Iterable[float]) -> float:
    """Return a group's weight when its jobs disagree: the largest of their weights.

    Pass the weights of the group's ready and running jobs. The maximum does not depend on
    the order rows arrive in, unlike the seed's "first row wins". One heavy job is not
    outvoted by many light ones, as it would be under a mean. Adding a job can never lower
    its group's weight. Raises ``ValueError`` if there are no weights or a weight is not
    finite and > 0.
    """
    best: float | None = None
    for weight in weights:
        _check_weight(weight, "job weight")
        if best is None or weight > best:
            best = weight
    if best is None:
        raise ValueError("group_weight() needs at least one job weight")
    return best


@functools.lru_cache(maxsize=64)  # a Worker ranks the same few weights on every tick
def _virtual_scale(weights: tuple[float, ...]) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """Integers that compare virtual times ``x / w_i`` exactly: ``(W, M, L)``.

    ``W_i`` are the weights scaled to integers in the same ratios (exact: a float is a
    binary fraction), ``L`` their least common multiple and ``M_i = L / W_i``. Then
    ``x / w_i`` and ``x * M_i`` order alike, for every group, with no division: the rule
    runs on ints, several times faster than on :class:`~fractions.Fraction` values.
    """
    ratios = [w.as_integer_ratio() for w in weights]
    denominator = math.lcm(*(d for _, d in ratios))
    scaled = [n * (denominator // d) for n, d in ratios]
    common = math.gcd(*scaled)
    scaled = [w // common for w in scaled]
    multiple = math.lcm(*scaled)
    return tuple(scaled), tuple(multiple // w for w in scaled), multiple  # cached: immutable


def _share_levels(
    usage: Sequence[int],
    caps: Sequence[int],
    weights: Sequence[int],
    scale: Sequence[int],
    *,
    multiple: int,
    slots: int,
) -> list[tuple[int, int]]:
    """Return the fair-share level ``theta`` for ``n + 1, ..., n + slots`` total slots.

    ``theta(T)`` is the unique level with ``sum(min(theta * w_i, c_i)) = T``. The groups sort
    once by the level ``c_i / w_i`` at which they reach their cap. Then one pass over ``T``
    moves groups from the growing part into the capped part. The caller ensures
    ``n + slots <= sum(caps)``, so some weight always stays uncapped.

    Each level is ``(num, den)``: ``theta`` in :func:`_virtual_scale`'s units is
    ``num / den``, so a virtual time ``v`` (those units, an int) is below it iff
    ``v * den < num``.
    """
    order = sorted(range(len(caps)), key=lambda i: (caps[i] * scale[i], i))
    capped_slots = 0
    free_weight = sum(weights)
    nxt = 0
    levels: list[tuple[int, int]] = []
    total = sum(usage)
    for step in range(1, slots + 1):
        over = (total + step - capped_slots) * multiple
        while nxt < len(order) and over > caps[order[nxt]] * scale[order[nxt]] * free_weight:
            i = order[nxt]
            capped_slots += caps[i]
            free_weight -= weights[i]
            nxt += 1
            over = (total + step - capped_slots) * multiple
        levels.append((over, free_weight))
    return levels


def fair_share(groups: Sequence[GroupDemand], free: int) -> list[str]:
    """Rank the next ``free`` slots by weighted fair share, counting slots already held.

    Returns one group name per slot, in the order the slots should be filled. A name may
    repeat. The list has ``min(free, sum(ready))`` entries and names a group at most
    ``ready`` times. The rule, its tie-break and its bounds are in the module docstring.
    Raises ``ValueError`` for ``free < 0`` or a repeated group name (``GroupDemand``
    checks its own fields).
    """
    _check_count(free, "free")
    ordered = sorted(groups, key=lambda g: g.name)
    for before, after in pairwise(ordered):
        if before.name == after.name:
            raise ValueError(f"duplicate group name {before.name!r}")
    return _rank_checked(
        [g.name for g in ordered],
        tuple(g.weight for g in ordered),
        [g.running + g.served for g in ordered],
        [g.ready for g in ordered],
        free,
    )


def _rank_checked(
    names: Sequence[str],
    weights_: tuple[float, ...],
    usage: Sequence[int],
    ready: Sequence[int],
    free: int,
) -> list[str]:
    """:func:`fair_share` on columns already checked: ``names`` sorted and distinct,
    weights finite and > 0, ``usage`` (running + served) and ``ready`` ints >= 0, ``free``
    an int >= 0.

    Internal: a Worker's tick ranks a scan's counts with it (sorted and distinct by
    construction, from rows readyq checked when it wrote them), without building and
    checking a :class:`GroupDemand` per group on every tick.
    """
    slots = min(free, sum(ready))
    if slots == 0:
        return []

    weights, scale, multiple = _virtual_scale(weights_)
    caps = [u + r for u, r in zip(usage, ready, strict=True)]
    levels = _share_levels(usage, caps, weights, scale, multiple=multiple, slots=slots)

    given = [0] * len(names)
    # Groups with ready jobs that are not yet eligible, keyed by virtual start (u + a) / w.
    waiting = [(usage[i] * scale[i], i) for i, r in enumerate(ready) if r > 0]
    heapq.heapify(waiting)
    # Eligible groups, keyed by (virtual finish, heavier first, name): a total order.
    eligible: list[tuple[int, int, str, int]] = []
    ranking: list[str] = []
    for over, under in levels:
        while waiting and waiting[0][0] * under < over:
            _, i = heapq.heappop(waiting)
            finish = (usage[i] + given[i] + 1) * scale[i]
            heapq.heappush(eligible, (finish, -weights[i], names[i], i))
        # Non-empty: sum(u + a) = n + j - 1 < n + j = sum(s(n + j)), so some group with a
        # ready job left has u + a < s <= theta * w, i.e. virtual start below theta.
        assert eligible, "fair_share: no eligible group; the rule's invariant is broken"
        _, _, name, i = heapq.heappop(eligible)
        ranking.append(name)
        given[i] += 1
        if given[i] < ready[i]:
            heapq.heappush(waiting, ((usage[i] + given[i]) * scale[i], i))
    return ranking
