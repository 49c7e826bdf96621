"""The simulated actors: workers, one enqueuer, one sweeper.

A worker's life is a loop of three small steps (``claim_step``, ``heartbeat_step``,
``finish_step``) so that they can later be swapped for the ``readyq.Worker`` runtime's tick.
Every readyq call goes through :meth:`Actor.op`, which writes the invoke and ok/fail/info
events; faults are drawn from the actor's own ``faults:<name>`` stream, and only while
``world.faults_active``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa

import readyq
from readyq import JobState, Lease, LeaseLost
from readyq.schema import jobs as jobs_table

from .driver import ActorCtx, Crashed, TxnHang
from .history import Event
from .workload import Batch
from .world import ActorClock, JobRecord, World

__all__ = ["enqueuer", "sweeper", "worker"]

R = TypeVar("R")


class _Restart(Exception):
    pass


class Actor:
    def __init__(self, world: World, ctx: ActorCtx) -> None:
        self.world = world
        self.ctx = ctx
        self.cfg = world.cfg
        self.rng = world.streams[f"faults:{ctx.name}"]
        self.clock = ActorClock(world.clock)
        self.q = world.make_queue(ctx.engine(), self.clock)
        #: The ok/fail/info event of the last :meth:`op` (safe with many threads).
        self.ev: Event

    def reconnect(self) -> None:
        self.ctx.dispose_engines()
        self.q = self.world.make_queue(self.ctx.engine(), self.clock)

    def chance(self, kind: str) -> bool:
        """Whether fault ``kind`` strikes now (always draws, so the stream stays aligned)."""
        return self.world.chance(self.ctx.name, self.rng, kind)

    def arm_hang(self, op: str, job: int | None = None) -> bool:
        """Maybe stall inside ``op``'s write transaction (fault ``hang_in_txn``).

        From 0.2 to 2 TTLs, cut short when the faults heal; then the transaction commits
        late, or (half the time) its session is killed and it rolls back.
        """
        ctx, world = self.ctx, self.world
        # Its own stream, like slow_commit: the other kinds' rolls do not move.
        rng = world.streams[f"hang-txn:{ctx.name}"]
        if not world.chance(ctx.name, rng, "hang_in_txn"):
            return False
        seconds = round(rng.uniform(0.2, 2.0) * self.cfg.ttl, 3)
        kill = rng.random() < 0.5
        heal = "kill" if kill else "commit"

        def healed(start_us: int, end_us: int) -> None:
            world.log(ctx.name, "note", "hang_end", end_us, start_us=start_us, op=op, heal=heal)

        ctx.hang = TxnHang(
            seconds, kill, lambda: not world.faults_active, every=self.cfg.poll, on_end=healed
        )
        world.fault("hang_in_txn", ctx.name, ctx.now_us, op=op, job=job, seconds=seconds, heal=heal)
        return True

    def after_hang(self) -> None:
        """Disarm a hang the operation did not reach; reconnect if one killed the session."""
        self.ctx.hang = None
        if self.ctx.hang_killed:
            self.ctx.hang_killed = False
            self.reconnect()

    def op(
        self,
        f: str,
        call: Callable[[], R],
        *,
        job: int | None = None,
        token: int | None = None,
        uncommitted_on_error: bool = False,
        pretend_lost: bool = False,
        **detail: Any,
    ) -> tuple[str, R | BaseException]:
        """Run one readyq call as an invoke + ok/fail/info pair in the history."""
        ctx, log = self.ctx, self.world.log
        ctx.begin_op()
        log(ctx.name, "invoke", f, ctx.now_us, job=job, token=token, **detail)
        try:
            result = call()
        except LeaseLost as exc:
            self.ev = log(
                ctx.name, "fail", f, self.clock.last_us, job=job, token=token, error="LeaseLost"
            )
            return "lost", exc
        except Crashed:
            if ctx.committed:  # a crash after a pipelined COMMIT (at the NOTIFY that follows)
                log(
                    ctx.name,
                    "info",
                    f,
                    ctx.now_us,
                    job=job,
                    token=token,
                    error="crashed",
                    commit_step=ctx.commit_step,
                )
            else:
                log(ctx.name, "fail", f, ctx.now_us, job=job, token=token, error="crashed")
            raise
        except Exception as exc:
            maybe = ctx.commit_step is not None and not uncommitted_on_error
            self.ev = log(
                ctx.name,
                "info" if maybe else "fail",
                f,
                self.clock.last_us,
                job=job,
                token=token,
                error=type(exc).__name__,
            )
            return "error", exc
        kind = "info" if pretend_lost else "ok"
        self.ev = log(
            ctx.name, kind, f, self.clock.last_us, job=job, token=token, commit_step=ctx.commit_step
        )
        return "ok", result


@dataclass
class Held:
    lease: Lease
    finish_us: int
    next_hb_us: int
    poison: bool


class Worker(Actor):
    def __init__(self, world: World, ctx: ActorCtx, worker_id: str) -> None:
        super().__init__(world, ctx)
        self.worker_id = worker_id
        self.held: dict[int, Held] = {}
        if self.chance("skew"):
            h, fixed = self.cfg.heartbeat, self.cfg.skew_s
            skew = self.rng.uniform(-h, h) if fixed is None else self.rng.choice((-fixed, fixed))
            self.clock.offset_us = round(skew * 1e6)
            world.fault("skew", ctx.name, ctx.now_us, offset_s=self.clock.offset_us / 1e6)

    def run(self) -> None:
        while True:
            if not self.world.faults_active:
                self.clock.offset_us = 0
            if not self.held:
                if not self.claim_step():
                    self.ctx.sleep(self.cfg.poll)
                continue
            self.work_step()

    # -- the three steps ---------------------------------------------------------------

    def ranking(self, free: int) -> list[str] | None:
        """Ranked group names for ``free`` slots, from the fair-share function (or None)."""
        world = self.world
        if world.ranker is None or world.demand is None:
            return None
        c = jobs_table.c
        states = [JobState.READY, JobState.RUNNING, JobState.DONE, JobState.FAILED]
        stmt = (
            sa.select(c.group_key, c.state, sa.func.count())
            .where(c.state.in_(states))
            .group_by(c.group_key, c.state)
            .order_by(c.group_key, c.state)
        )
        self.ctx.begin_op()
        with self.q.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        count: dict[tuple[str, str], int] = {(r[0], r[1]): r[2] for r in rows}
        weights = {t.name: t.weight for t in self.cfg.tenants}
        names = sorted({g for g, _ in count} | set(weights))
        demand = [
            world.demand(
                name=g,
                weight=weights.get(g, 1.0),
                running=count.get((g, "running"), 0),
                ready=count.get((g, "ready"), 0),
                served=count.get((g, "done"), 0) + count.get((g, "failed"), 0),
            )
            for g in names
        ]
        return list(world.ranker(demand, free))

    def claim_step(self) -> list[Lease]:
        free = self.cfg.claim_limit
        groups = self.ranking(free)
        if groups is not None and not groups:
            return []
        if self.chance("crash"):
            self.ctx.crash_at = self.rng.randint(1, 4)
            self.world.fault("crash", self.ctx.name, self.ctx.now_us, mode="in claim")
        self.arm_hang("claim")
        status, got = self.op(
            "claim",
            lambda: self.q.claim(self.worker_id, ttl=self.cfg.ttl, limit=free, groups=groups),
            limit=free,
            ranked=groups is not None,
        )
        self.ctx.crash_at = None
        self.after_hang()
        if status != "ok" or not isinstance(got, list):
            return []
        ev = self.ev
        ev.detail["limit"] = free
        ev.detail["leases"] = [
            (ls.job_id, ls.token, ls.attempt, ls.expires_us, ls.deadline_us, ls.group) for ls in got
        ]
        now = self.ctx.now_us
        for ls in got:
            d = float(ls.args.get("d", 1.0))
            self.held[ls.job_id] = Held(
                ls,
                now + round(d * 1e6),
                now + round(self.cfg.heartbeat * 1e6),
                bool(ls.args.get("poison")),
            )
        return got

    def work_step(self) -> None:
        ctx = self.ctx
        ctx.sleep_until(min(min(h.finish_us, h.next_hb_us) for h in self.held.values()))
        if self.chance("crash"):
            leases = [(h.lease.job_id, h.lease.token) for h in self.held.values()]
            self.world.fault("crash", ctx.name, ctx.now_us, mode="while working", leases=leases)
            raise _Restart
        pause = self.pause()
        if pause > 0:
            leases = [(h.lease.job_id, h.lease.token) for h in self.held.values()]
            self.world.fault("pause", ctx.name, ctx.now_us, seconds=pause, leases=leases)
            ctx.sleep(pause)
        for job_id in sorted(self.held):
            h = self.held.get(job_id)
            if h is None:
                continue
            if h.finish_us <= ctx.now_us:
                self.finish_step(h)
            elif h.next_hb_us <= ctx.now_us:
                self.heartbeat_step(h)

    def pause(self) -> float:
        """Seconds to stop for now (0: no pause), from the configured pause distribution."""
        cfg = self.cfg
        if cfg.pause_dist == "none" or not self.chance("pause"):
            return 0.0
        if cfg.pause_dist == "exp":
            return round(self.rng.expovariate(1 / cfg.pause_mean), 6)
        if cfg.pause_dist == "heavy":
            # Lomax (Pareto II) with alpha 1.5: mean = scale / (alpha - 1) = pause_mean.
            return round(cfg.pause_mean * 0.5 * (self.rng.paretovariate(1.5) - 1), 6)
        lo, hi = cfg.pause_ttl
        return round(cfg.ttl * self.rng.uniform(lo, hi), 3)

    def heartbeat_step(self, h: Held) -> None:
        ctx, ls = self.ctx, h.lease
        h.next_hb_us = ctx.now_us + round(self.cfg.heartbeat * 1e6)
        if self.chance("heartbeat_loss"):
            self.world.fault("heartbeat_loss", ctx.name, ctx.now_us, job=ls.job_id)
            return
        self.arm_hang("heartbeat", ls.job_id)
        status, got = self.op(
            "heartbeat",
            lambda: self.q.heartbeat(ls, ttl=self.cfg.ttl),
            job=ls.job_id,
            token=ls.token,
        )
        self.after_hang()
        if status == "ok":
            self.ev.detail["expires"] = got
        elif status == "lost":
            del self.held[ls.job_id]

    def finish_step(self, h: Held) -> None:
        ctx, ls = self.ctx, h.lease
        if self.chance("crash"):
            ctx.crash_at = self.rng.randint(1, 3)
            self.world.fault("crash", ctx.name, ctx.now_us, mode="in finalize", job=ls.job_id)
        drop = self.chance("drop_before_commit")
        if drop:
            ctx.drop_at_commit = True
            self.world.fault("drop_before_commit", ctx.name, ctx.now_us, job=ls.job_id)
        lost_reply = self.chance("drop_after_commit")
        # Its own stream: a new fault kind must not shift the schedules of existing seeds.
        slow = self.world.streams[f"slow-commit:{ctx.name}"]
        if self.world.chance(ctx.name, slow, "slow_commit"):
            # Shorter than a heartbeat interval: a held COMMIT must not look like a lost
            # lease to the reclaim-liveness checker (the row lock keeps the sweeper off).
            ctx.slow_commit_s = round(slow.uniform(0.2, 0.8) * self.cfg.heartbeat, 3)
            self.world.fault(
                "slow_commit", ctx.name, ctx.now_us, job=ls.job_id, held_s=ctx.slow_commit_s
            )
        self.arm_hang("fail" if h.poison else "finalize", ls.job_id)
        f = "fail" if h.poison else "finalize"

        def call() -> readyq.Outcome:
            if h.poison:
                return self.q.fail(ls, "poison job", retry=True)
            return self.q.finalize(ls, {"by": self.worker_id, "token": ls.token})

        status, got = self.op(
            f,
            call,
            job=ls.job_id,
            token=ls.token,
            uncommitted_on_error=drop,
            pretend_lost=lost_reply,
        )
        ctx.crash_at, ctx.drop_at_commit, ctx.slow_commit_s = None, False, None
        self.after_hang()
        if status == "ok" and lost_reply:
            self.world.fault("drop_after_commit", ctx.name, ctx.now_us, job=ls.job_id)
            self.ev.detail["state"] = getattr(got, "state", None)
            status, got = self.op(f, call, job=ls.job_id, token=ls.token, retry_of="info")
        if status == "ok" and isinstance(got, readyq.Outcome):
            ev = self.ev
            ev.detail["state"] = got.state.value
            ev.detail["replayed"] = got.replayed
            del self.held[ls.job_id]
        elif status == "lost":
            del self.held[ls.job_id]
        else:
            if drop:
                self.reconnect()
            h.finish_us = ctx.now_us + round(self.cfg.poll * 1e6)


def worker(world: World) -> Callable[[ActorCtx], None]:
    def run(ctx: ActorCtx) -> None:
        life = 0
        while True:
            life += 1
            try:
                Worker(world, ctx, f"{ctx.name}.{life}").run()
            except (Crashed, _Restart):
                ctx.crashed, ctx.crash_at, ctx.drop_at_commit = False, None, False
                ctx.slow_commit_s, ctx.hang, ctx.txn_killed = None, None, False
                world.log(ctx.name, "note", "restart", ctx.now_us, life=life + 1)
                ctx.dispose_engines()
                ctx.sleep(world.streams[f"faults:{ctx.name}"].uniform(0.5, 3.0))

    return run


def sweeper(world: World) -> Callable[[ActorCtx], None]:
    def run(ctx: ActorCtx) -> None:
        actor = Actor(world, ctx)
        while True:
            ctx.sleep(world.cfg.sweep_interval)
            status, got = actor.op("sweep", lambda: actor.q.sweep(batch=10_000))
            if status == "ok" and not isinstance(got, BaseException):
                ev = actor.ev
                ev.detail.update(expired=got.expired, timed_out=got.timed_out, failed=got.failed)

    return run


def enqueuer(world: World, batches: list[Batch]) -> Callable[[ActorCtx], None]:
    def run(ctx: ActorCtx) -> None:
        actor = Actor(world, ctx)
        start = ctx.now_us
        for b in batches:
            ctx.sleep_until(start + round(b.at * 1e6))
            while True:

                def call(b: Batch = b) -> list[int]:
                    return _enqueue(actor.q, b)

                status, got = actor.op("enqueue", call, batch=b.index)
                if status == "ok" and isinstance(got, list):
                    _register(world, b, got, actor.ev.commit_step, ctx)
                    break
                ctx.sleep(world.cfg.poll)
        world.enqueuer_done = True
        while True:
            ctx.sleep(3600)

    return run


def _enqueue(q: readyq.Queue, b: Batch) -> list[int]:
    with q.graph() as g:
        handles: list[readyq.JobHandle] = []
        for n, spec in enumerate(b.jobs):
            handles.append(
                g.add(
                    "box" if spec.container else "work",
                    {"d": spec.duration, "poison": spec.poison, "hang": spec.hang},
                    group=spec.group,
                    weight=spec.weight,
                    after=[handles[i] for i in spec.after],
                    parent=None if spec.parent is None else handles[spec.parent],
                    key=f"sim:{b.index}:{n}",
                    max_attempts=spec.max_attempts,
                    timeout=spec.timeout,
                    container=spec.container,
                )
            )
    return [h.id for h in handles]


def _register(world: World, b: Batch, ids: list[int], commit: int | None, ctx: ActorCtx) -> None:
    for n, spec in enumerate(b.jobs):
        rec = JobRecord(
            ids[n],
            spec,
            b.index,
            parents=[ids[i] for i in spec.after],
            container_id=None if spec.parent is None else ids[spec.parent],
        )
        world.jobs[rec.id] = rec
        world.log(
            ctx.name,
            "ok",
            "enqueued",
            ctx.now_us,
            job=rec.id,
            commit_step=commit,
            shape=b.shape,
            group=spec.group,
            parents=rec.parents,
            container=spec.container,
        )
