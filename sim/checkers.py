"""Checkers: each states one invariant over the history (and the final read) and says PASS/FAIL.

Committed events (ok, or info whose COMMIT the driver saw) are replayed in commit order, a
total order of committed transactions in the interleaved mode; rejected operations
(LeaseLost) at the step they returned. One pass keeps, per job, the current lease and its
status: ``live`` (held), ``reclaimable`` (a sweep that reclaimed something ran after the
lease's expiry or hang deadline), or ``ended`` (finalized, failed, released by its holder).
Under readyq's lease semantics a lease stays valid until it is reclaimed: expiry only makes
it reclaimable.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from readyq import TERMINAL, TRANSITIONS, JobState

from .history import Event
from .world import World

__all__ = ["Check", "check_all"]

_END = {"finalize", "fail"}
_TERMINAL = {s.value for s in TERMINAL}
#: States a lease holder's finalize/fail may leave, straight from readyq's state machine.
_HELD = {s.value for s in TRANSITIONS["finalize"].sources | TRANSITIONS["fail"].sources}


@dataclass
class Check:
    name: str
    invariant: str
    ok: bool | None  # None: not applicable
    counts: dict[str, Any] = field(default_factory=dict)
    first: str | None = None
    job: int | None = None

    @property
    def verdict(self) -> str:
        return "n/a" if self.ok is None else ("PASS" if self.ok else "FAIL")


class _Check:
    def __init__(self, name: str, invariant: str) -> None:
        self.c = Check(name, invariant, True)
        self.violations = 0

    def fail(self, msg: str, job: int | None = None) -> None:
        self.violations += 1
        if self.c.first is None:
            self.c.first, self.c.job = msg, job
        self.c.ok = False

    def done(self, **counts: Any) -> Check:
        self.c.counts = {**counts, "violations": self.violations}
        return self.c


@dataclass
class _Lease:
    token: int
    expires: int
    deadline: int | None
    status: str = "live"
    claimed_at: int = 0
    reclaimable_at: int | None = None
    expiry_at_reclaim: int | None = None
    settled: bool = False


def _committed(e: Event) -> bool:
    return e.type in ("ok", "info") and e.commit_step is not None


class _Replay:
    """One pass over the history in commit order, feeding every checker at once."""

    def __init__(self, world: World) -> None:
        cfg = self.cfg = world.cfg
        self.world = world
        self.tokens = _Check("tokens", "lease tokens strictly increase per job")
        self.double = _Check(
            "no-double-dispatch", "a job is never claimed while another lease on it is live"
        )
        self.fence = _Check(
            "fencing", "every accepted lease write carries the job's current, unsettled token"
        )
        self.single = _Check(
            "single-finalize", "at most one effective finalize per job; retries replay it"
        )
        self.justified = _Check(
            "dispatch-justified", "every extra dispatch follows a retry or a reclaim"
        )
        self.dag = _Check(
            "dag-order", "a child's first claim commits after all its parents finalized"
        )
        self.early = _Check(
            "reclaim-not-early", "a live lease is never taken away (LeaseLost only after expiry)"
        )
        self.missed = _Check(
            "reclaim-not-missed", "after healing, expired leases are reclaimed within S + slack"
        )
        self.attempts = _Check(
            "attempts", "claims never exceed max_attempts; hung jobs are timed out"
        )
        self.bound = _Check("claim-limit", "a claim returns at most `limit` jobs, each known")
        self.leases: dict[int, _Lease] = {}
        self.done_at: dict[int, int] = {}
        self.claims: Counter[int] = Counter()
        self.effective: dict[int, int] = {}  # job -> token of its effective finalize
        self.causes: Counter[str] = Counter()
        self.rejected = self.replays = 0
        self.latencies: list[float] = []
        self.slack_us = round((cfg.sweep_interval + 2 * cfg.poll + cfg.slack_s) * 1e6)
        self.hang_slack_us = round((cfg.sweep_interval + cfg.heartbeat + cfg.slack_s) * 1e6)
        self.spec = {j: r.spec for j, r in world.jobs.items()}
        #: Virtual intervals during which a transaction hung holding its locks (merged).
        self.stalls = _merge(
            (int(e.detail["start_us"]), e.now_us)
            for e in world.history.events
            if e.type == "note" and e.f == "hang_end"
        )

    def feed(self, e: Event) -> None:
        where = f"event #{e.i} ({e.actor} {e.type} {e.f})"
        if _committed(e):
            if e.f == "claim":
                self.on_claim(e, where)
            elif e.f == "heartbeat":
                self.on_heartbeat(e, where)
            elif e.f in _END:
                self.on_settle(e, where)
            elif e.f == "sweep":
                self.on_sweep(e, where)
        elif e.type == "fail" and e.detail.get("error") == "LeaseLost":
            self.on_lost(e, where)

    def on_claim(self, e: Event, where: str) -> None:
        got = e.detail.get("leases", [])
        if len(got) > e.detail.get("limit", 1):
            self.bound.fail(f"{where}: {len(got)} jobs for limit {e.detail.get('limit')}")
        for job, token, attempt, expires, deadline, _group in got:
            if job not in self.spec:
                self.bound.fail(f"{where}: claimed job {job}, which no enqueue acknowledged", job)
            self.claims[job] += 1
            prev = self.leases.get(job)
            if prev is not None and token <= prev.token:
                self.tokens.fail(f"{where}: job {job} token {token} after token {prev.token}", job)
            if prev is not None and prev.status == "live":
                self.double.fail(
                    f"{where}: job {job} claimed (token {token}) while token {prev.token} "
                    "was live (never settled, no reclaiming sweep after its expiry)",
                    job,
                )
            elif prev is not None:
                self.causes["reclaim" if prev.status == "reclaimable" else "retry"] += 1
            if prev is None and job in self.world.jobs:
                for p in self.world.jobs[job].parents:
                    if p not in self.done_at:
                        self.dag.fail(f"{where}: job {job} claimed before parent {p} finished", job)
            limit = self.spec[job].max_attempts if job in self.spec else attempt
            if attempt > limit:
                self.attempts.fail(f"{where}: job {job} attempt {attempt} > max {limit}", job)
            self.leases[job] = _Lease(token, expires, deadline, claimed_at=e.now_us)

    def on_heartbeat(self, e: Event, where: str) -> None:
        ls = self.leases.get(e.job or -1)
        if ls is None or ls.token != e.token or ls.status == "ended":
            self.fence.fail(f"{where}: heartbeat with token {e.token} accepted", e.job)
            return
        if ls.reclaimable_at is not None:
            ls.status, ls.reclaimable_at = "live", None  # that sweep skipped it (row locked)
        ls.expires = int(e.detail.get("expires", ls.expires))
        # A transaction hung on its locks holds off the sweeper (on SQLite: every writer):
        # the time it held them does not count against the hang timeout.
        if ls.deadline is not None and e.now_us > ls.deadline + self.hang_slack_us + (
            stalled := _overlap(self.stalls, ls.deadline, e.now_us)
        ):
            late = (e.now_us - ls.deadline - stalled) / 1e6
            self.attempts.fail(
                f"{where}: job {e.job} still heart-beating {late:.1f}s after its hang deadline"
                + (f" (not counting {stalled / 1e6:.1f}s of hung transactions)" if stalled else ""),
                e.job,
            )

    def on_settle(self, e: Event, where: str) -> None:
        job = e.job if e.job is not None else -1
        ls = self.leases.get(job)
        if e.detail.get("replayed"):
            self.replays += 1
            if ls is None or ls.token != e.token or not ls.settled:
                self.single.fail(f"{where}: replayed outcome for a lease that never settled", job)
            return
        if ls is None or ls.token != e.token or ls.status == "ended":
            cur = None if ls is None else ls.token
            self.fence.fail(f"{where}: {e.f} with token {e.token} accepted (current {cur})", job)
        if e.f == "finalize":
            if job in self.effective:
                self.single.fail(
                    f"{where}: second effective finalize of job {job} "
                    f"(token {e.token}, first by token {self.effective[job]})",
                    job,
                )
            self.effective[job] = e.token or 0
            self.done_at.setdefault(job, e.order)
        if ls is not None:
            ls.status, ls.settled = "ended", True

    def on_sweep(self, e: Event, where: str) -> None:
        if not sum(int(e.detail.get(k, 0)) for k in ("expired", "timed_out")):
            return
        heal = self.world.heal_us
        for job, ls in self.leases.items():
            hung = ls.deadline is not None and ls.deadline < e.now_us
            if ls.status != "live" or not (ls.expires < e.now_us or hung):
                continue
            ls.status, ls.reclaimable_at = "reclaimable", e.now_us
            due = ls.deadline if hung and ls.deadline is not None else ls.expires
            ls.expiry_at_reclaim = due
            lag = e.now_us - due
            self.latencies.append(lag / 1e6)
            if heal is not None and due >= heal and lag > self.slack_us:
                self.missed.fail(f"{where}: job {job} reclaimed {lag / 1e6:.2f}s after expiry", job)

    def on_lost(self, e: Event, where: str) -> None:
        self.rejected += 1
        ls = self.leases.get(e.job or -1)
        if ls is not None and ls.token == e.token and ls.status == "live" and not ls.settled:
            self.early.fail(
                f"{where}: job {e.job} token {e.token} rejected while its lease was live "
                f"(expires {(ls.expires - e.now_us) / 1e6:+.3f}s from now): reclaimed early",
                e.job,
            )

    def final(self, final: dict[int, dict[str, Any]], live: bool) -> _Check:
        lost = _Check("nothing-lost", "every acknowledged enqueue is terminal after the drain")
        for job, rec in sorted(self.world.jobs.items()):
            row = final.get(job)
            if row is None:
                lost.fail(f"job {job} was acknowledged but is missing from the final read", job)
                continue
            if row["state"] not in _TERMINAL:
                lost.fail(f"job {job} ended the run {row['state']} (not terminal)", job)
            self.final_row(job, rec, row, final)
        for job, ls in self.leases.items():
            if ls.status == "live" and final.get(job, {}).get("state") in _HELD:
                self.missed.fail(f"job {job} token {ls.token} still running after the drain", job)
        if not live:
            lost.fail("the run did not go quiet within its liveness budget")
        extra = sum(max(0, n - 1) for n in self.claims.values())
        unjustified = extra - sum(self.causes.values())
        if unjustified > 0:
            self.justified.fail(f"{unjustified} extra dispatches without a retry or reclaim")
        return lost

    def final_row(self, job: int, rec: Any, row: dict[str, Any], final: dict[int, Any]) -> None:
        if row["state"] == JobState.BLOCKED:
            self.dag.fail(f"job {job} left blocked after the drain (lost wake-up)", job)
        if row["attempts"] > row["max_attempts"]:
            self.attempts.fail(
                f"job {job}: attempts {row['attempts']} > {row['max_attempts']}", job
            )
        parents = [final.get(p, {}).get("state") for p in rec.parents]
        if row["state"] == JobState.DONE and any(s != JobState.DONE for s in parents):
            self.dag.fail(f"job {job} done although a parent ended {parents}", job)
        if row["state"] == JobState.DONE and not rec.spec.container:
            if job not in self.effective:
                self.single.fail(f"job {job} is done but no finalize was ever accepted", job)
            elif row["settled_token"] != self.effective[job]:
                self.single.fail(
                    f"job {job} final token {row['settled_token']} is not the accepted "
                    f"finalize's {self.effective[job]}",
                    job,
                )
        if rec.spec.hang and row["state"] == JobState.DONE:
            self.attempts.fail(f"job {job} hangs forever yet ended done", job)
        if rec.spec.container:
            kids = [
                final.get(k, {}).get("state")
                for k, r in self.world.jobs.items()
                if r.container_id == job
            ]
            if (row["state"] == JobState.DONE) != all(s == JobState.DONE for s in kids):
                self.dag.fail(f"container {job} ended {row['state']} with children {kids}", job)


def check_all(world: World, final: dict[int, dict[str, Any]], live: bool) -> list[Check]:
    """Every checker over ``world``'s history and the final read (``live``: went quiet)."""
    r = _Replay(world)
    events = world.history.events
    for e in sorted(
        (e for e in events if e.type in ("ok", "info", "fail")), key=lambda e: (e.order, e.i)
    ):
        r.feed(e)
    lost = r.final(final, live)
    states = Counter(row["state"] for row in final.values())
    extra = sum(max(0, n - 1) for n in r.claims.values())
    missed = r.missed.done(reclaims=len(r.latencies))
    missed.counts["latency_s"] = _summary(r.latencies)
    return [
        r.tokens.done(claims=sum(r.claims.values())),
        r.double.done(jobs_claimed=len(r.claims)),
        r.fence.done(stale_rejected=r.rejected),
        r.single.done(effective=len(r.effective), replays=r.replays),
        r.justified.done(extra=extra, by_reclaim=r.causes["reclaim"], by_retry=r.causes["retry"]),
        r.dag.done(edges=sum(len(j.parents) for j in world.jobs.values())),
        r.early.done(lease_lost=r.rejected),
        missed,
        r.attempts.done(hang_jobs=sum(1 for s in r.spec.values() if s.hang)),
        r.bound.done(claims=sum(1 for e in events if e.f == "claim" and _committed(e))),
        lost.done(acked=len(world.jobs), **{f"final_{k}": v for k, v in sorted(states.items())}),
        fair_share(world),
    ]


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of ``spans`` as sorted, disjoint intervals."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _overlap(spans: list[tuple[int, int]], lo: int, hi: int) -> int:
    """How much of [lo, hi] the disjoint ``spans`` cover."""
    return sum(max(0, min(b, hi) - max(a, lo)) for a, b in spans)


def _summary(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    s = sorted(xs)
    return {"min": round(s[0], 3), "median": round(s[len(s) // 2], 3), "max": round(s[-1], 3)}


def fair_share(world: World) -> Check:
    """Weighted fair share over the saturated window: max lag within workers * limit + 1."""
    cfg = world.cfg
    inv = "while every group is backlogged, dispatches per group stay within K of weight share"
    weights = {t.name: t.weight for t in cfg.tenants}
    seq: list[str] = []
    for e in sorted(world.history.events, key=lambda e: (e.order, e.i)):
        if e.f == "claim" and _committed(e):
            seq += [ls[5] for ls in e.detail.get("leases", []) if ls[5] in weights]
    table = share_table(world, seq)
    if world.ranker is None or not cfg.backlog:
        why = "fair_share not used" if world.ranker is None else "workload not saturated"
        return Check("fair-share", inv, None, {"why": why, "table": table})
    total = Counter(r.spec.group for r in world.jobs.values())
    got: Counter[str] = Counter()
    window = 0
    for g in seq:
        got[g] += 1
        window += 1
        if got[g] >= total[g]:
            break
    bound = cfg.workers * cfg.claim_limit + 1
    chk = _Check("fair-share", inv)
    lag = _lags(seq[:window], weights)
    table = share_table(world, seq[:window])
    for g, (worst, at) in sorted(lag.items()):
        table[g]["max_lag"] = round(worst, 2)
        if worst > bound:
            chk.fail(f"group {g} lag {worst:.2f} slots at dispatch {at} (bound {bound})")
    return chk.done(window=window, bound=bound, table=table)


def _lags(seq: list[str], weights: dict[str, float]) -> dict[str, tuple[float, int]]:
    total_w = sum(weights.values())
    got: Counter[str] = Counter()
    worst: dict[str, tuple[float, int]] = defaultdict(lambda: (0.0, 0))
    for t, g in enumerate(seq, start=1):
        got[g] += 1
        for name, w in weights.items():
            lag = abs(got[name] - t * w / total_w)
            if lag > worst[name][0]:
                worst[name] = (lag, t)
    return dict(worst)


def share_table(world: World, seq: list[str]) -> dict[str, dict[str, Any]]:
    weights = {t.name: t.weight for t in world.cfg.tenants}
    total_w = sum(weights.values())
    n = max(1, len(seq))
    counts = Counter(seq)
    return {
        g: {
            "weight": w,
            "target": round(w / total_w, 3),
            "observed": round(counts[g] / n, 3),
            "dispatches": counts[g],
            "max_lag": None,
        }
        for g, w in weights.items()
    }
