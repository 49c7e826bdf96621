"""Permutation specs in the style of PostgreSQL's isolation tester.

A :class:`Spec` has a setup, two or three sessions and a check. Each session is a list of
named steps run on a connection of its own, in a thread of its own. Every interleaving of
the sessions' steps (keeping each session's order) is run on freshly set-up rows, and the
check is applied to each outcome.

A step that has not returned within the block timeout is *blocked*: it is waiting for a
lock another session holds. The runner then goes on with the other sessions' steps, and
after each later step gives the blocked one another chance to finish, as isolationtester
does. A permutation whose next step belongs to a session that is still blocked cannot be
run as written; it is counted as *invalid* and not checked (blocking may itself be a
violation: each spec says which sessions may block, given the capabilities).

Steps are whole readyq calls (``s.queue.claim(...)``, each its own transaction) or
statements inside a transaction the session opened with ``s.begin()``, using readyq's
internal ``_store``/``_claim``/``graph`` functions with the adapter, exactly as readyq runs them.
``s.crash()`` closes the session's connection mid-transaction, like a killed process.
"""

from __future__ import annotations

import queue as _queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

import readyq
from readyq import JobState, LeaseLost, _claim, _store, dialects, graph
from readyq.dialects import Adapter
from readyq.schema import jobs

from .env import Env, ManualClock
from .provision import kind_of
from .requirements import Requirements

__all__ = ["SPECS", "Outcome", "Session", "SessionSpec", "Spec", "SpecReport", "Step", "run_spec"]

c = jobs.c
TTL_US = 10_000_000


# -- declarations -------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    name: str
    fn: Callable[[Session], Any]


@dataclass(frozen=True)
class SessionSpec:
    name: str
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Spec:
    name: str
    doc: str
    setup: Callable[[World], None]
    sessions: tuple[SessionSpec, ...]
    check: Callable[[World, Outcome], None]
    #: Sessions allowed to block, given the capabilities (default: any session may).
    may_block: Callable[[Requirements, str], bool] = lambda caps, session: True
    requires: tuple[str, ...] = ()

    def interleavings(self) -> Iterator[tuple[str, ...]]:
        seqs = [[f"{s.name}.{st.name}" for st in s.steps] for s in self.sessions]

        def rec(pos: list[int], acc: list[str]) -> Iterator[tuple[str, ...]]:
            if all(p == len(seq) for p, seq in zip(pos, seqs, strict=True)):
                yield tuple(acc)
                return
            for i, seq in enumerate(seqs):
                if pos[i] < len(seq):
                    pos[i] += 1
                    acc.append(seq[pos[i] - 1])
                    yield from rec(pos, acc)
                    acc.pop()
                    pos[i] -= 1

        yield from rec([0] * len(seqs), [])


# -- runtime ------------------------------------------------------------------------


@dataclass
class World:
    """Shared by the sessions of one permutation: the clock, setup values, step results."""

    env: Env
    caps: Requirements
    clock: ManualClock
    vars: dict[str, Any] = field(default_factory=dict)
    helper: readyq.Queue | None = None

    def queue(self) -> readyq.Queue:
        """A Queue for setup and checks (not one of the sessions' connections)."""
        assert self.helper is not None
        self.helper.clock = self.clock
        return self.helper

    def row(self, job_id: int) -> Any:
        with self.env.engine.connect() as conn:
            return conn.execute(sa.select(jobs).where(c.id == job_id)).one()

    def close(self) -> None:
        pass


@dataclass
class StepResult:
    session: str
    step: str
    value: Any = None
    error: BaseException | None = None
    blocked: bool = False
    skipped: str | None = None
    #: time.monotonic() when the step returned (orders steps by when they finished).
    t_done: float | None = None

    def __repr__(self) -> str:
        what = f"error={type(self.error).__name__}" if self.error else f"value={self.value!r}"
        return f"{self.session}.{self.step}({what}{', blocked' if self.blocked else ''})"


@dataclass
class Outcome:
    order: tuple[str, ...]
    results: dict[str, StepResult] = field(default_factory=dict)
    #: Steps in the order they finished.
    finished: list[str] = field(default_factory=list)
    invalid: str | None = None
    stuck: list[str] = field(default_factory=list)

    def value(self, step: str) -> Any:
        return self.results[step].value

    def error(self, step: str) -> BaseException | None:
        return self.results[step].error

    def before(self, a: str, b: str) -> bool:
        """Step ``a`` finished before step ``b`` did."""
        return self.finished.index(a) < self.finished.index(b)


class Session:
    """One session of a permutation: its thread, its engine, its open transaction."""

    def __init__(self, name: str, world: World, engine: Engine) -> None:
        self.name = name
        self.world = world
        self.engine = engine
        self.conn: Connection | None = None
        self.tx: Any = None
        self.aborted: str | None = None
        self.queue = readyq.Queue(engine, clock=world.clock)
        self._inbox: _queue.Queue[tuple[Step, threading.Event, StepResult] | None] = _queue.Queue()
        self._thread = threading.Thread(target=self._loop, name=f"perm-{name}", daemon=True)
        self._thread.start()

    @property
    def ad(self) -> Adapter:
        return self.queue.adapter

    @property
    def clock(self) -> ManualClock:
        return self.world.clock

    # step helpers -------------------------------------------------------------------

    def begin(self) -> None:
        self.conn = self.queue.engine.connect()
        self.tx = self.conn.begin()
        self.ad.begin_write(self.conn)

    def commit(self) -> None:
        assert self.tx is not None, "commit without begin"
        assert self.conn is not None
        try:
            self.tx.commit()
        finally:
            self._close()

    def rollback(self) -> None:
        if self.tx is not None and self.tx.is_active:
            self.tx.rollback()
        self._close()

    def crash(self) -> None:
        """The connection dies mid-transaction (a killed worker): nothing is committed."""
        assert self.conn is not None
        self.conn.invalidate()
        self._close()

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn, self.tx = None, None

    # thread -------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            item = self._inbox.get()
            if item is None:
                try:
                    self.rollback()
                except Exception:
                    self.conn, self.tx = None, None
                return
            step, done, res = item
            try:
                if self.aborted is not None:
                    res.skipped = f"transaction aborted by {self.aborted}"
                else:
                    res.value = step.fn(self)
            except LeaseLost as exc:
                res.error = exc
            except sa.exc.DBAPIError as exc:
                res.error = exc
                self.aborted = f"{step.name}: {type(exc.orig).__name__}"
                try:
                    self.rollback()
                except Exception:
                    self.conn, self.tx = None, None
            except BaseException as exc:
                res.error = exc
            finally:
                res.t_done = time.monotonic()
                done.set()

    def submit(self, step: Step, res: StepResult) -> threading.Event:
        done = threading.Event()
        self._inbox.put((step, done, res))
        return done

    def stop(self, timeout: float) -> bool:
        self._inbox.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


@dataclass
class SpecReport:
    name: str
    permutations: int = 0
    checked: int = 0
    invalid: int = 0
    #: Of ``invalid``: not run, because a shorter prefix was already found invalid.
    pruned: int = 0
    with_blocked_step: int = 0
    violations: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.name}: {self.permutations} interleavings, {self.checked} checked, "
            f"{self.invalid} invalid (a blocked session's next step; {self.pruned} of them "
            "skipped by prefix), "
            f"{self.with_blocked_step} with a blocked step, {len(self.violations)} violations"
        )


#: Seconds a lock wait may last before the server gives up (bounds a broken adapter's hang).
SESSION_LOCK_TIMEOUT_S = 15


def _session_engine(env: Env, pids: set[int]) -> Engine:
    """A session's engine; ``pids`` collects the server ids of the connections it opens.

    NullPool: each permutation gets new connections, created in the session's thread
    (pysqlite connections may only be used by the thread that made them).
    """
    kind = kind_of(env.url)
    kw: dict[str, Any] = {"poolclass": NullPool}
    if kind == "sqlite":
        kw["connect_args"] = {"timeout": SESSION_LOCK_TIMEOUT_S, "check_same_thread": False}
    elif kind == "postgresql":
        kw["connect_args"] = {"options": f"-c lock_timeout={SESSION_LOCK_TIMEOUT_S * 1000}"}
    elif kind == "mysql":
        wait = f"SET SESSION innodb_lock_wait_timeout = {SESSION_LOCK_TIMEOUT_S}"
        kw["connect_args"] = {"init_command": wait}
    eng = dialects.create_engine(env.url, **kw)
    if kind in ("postgresql", "mysql"):
        query = "SELECT pg_backend_pid()" if kind == "postgresql" else "SELECT CONNECTION_ID()"

        @sa.event.listens_for(eng, "connect")
        def _remember(dbapi_conn: Any, rec: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute(query)
            pids.add(int(cur.fetchone()[0]))
            cur.close()
            dbapi_conn.rollback()

    return eng


class LockWatch:
    """Asks the server whether a session's connections are waiting for a lock (as
    isolationtester does), so that "blocked" does not depend on how loaded the machine is.
    SQLite cannot be asked: there a step is blocked when it outlasts the block timeout."""

    QUERIES: ClassVar[dict[str, str]] = {
        "postgresql": "SELECT count(*) FROM pg_stat_activity "
        "WHERE pid IN :pids AND wait_event_type = 'Lock'",
        "mysql": "SELECT count(*) FROM information_schema.INNODB_TRX "
        "WHERE trx_mysql_thread_id IN :pids AND trx_state = 'LOCK WAIT'",
    }

    def __init__(self, env: Env) -> None:
        self.timeout = env.block_timeout
        query = self.QUERIES.get(kind_of(env.url))
        self.engine: Engine | None = None
        if query is not None:
            self.stmt = sa.text(query).bindparams(sa.bindparam("pids", expanding=True))
            self.engine = sa.create_engine(
                env.url, poolclass=NullPool, isolation_level="AUTOCOMMIT"
            )
            self.conn = self.engine.connect()

    def waiting(self, pids: set[int]) -> bool:
        if not pids:
            return False
        return bool(self.conn.execute(self.stmt, {"pids": sorted(pids)}).scalar())

    def finishes(self, done: threading.Event, pids: set[int]) -> bool:
        """True when the step returns; False once it is seen waiting for a lock."""
        if self.engine is None:
            return done.wait(self.timeout)
        # Fallback when the server does not report the wait (e.g. not an InnoDB row lock).
        deadline = time.monotonic() + max(2.0, 4 * self.timeout)
        while not done.wait(0.02):
            if self.waiting(pids) and not done.wait(0.03) and self.waiting(pids):
                return False
            if time.monotonic() > deadline:
                return False
        return True

    def close(self) -> None:
        if self.engine is not None:
            self.conn.close()
            self.engine.dispose()


def run_spec(  # noqa: PLR0915 -- the runner reads top to bottom as isolationtester's loop
    spec: Spec, env: Env, caps: Requirements, limit: int | None = None
) -> SpecReport:
    """Run every interleaving of ``spec`` (or the first ``limit``); collect violations."""
    rep = SpecReport(spec.name)
    steps = {f"{s.name}.{st.name}": (s.name, st) for s in spec.sessions for st in s.steps}
    pids: dict[str, set[int]] = {s.name: set() for s in spec.sessions}
    engines = {s.name: _session_engine(env, pids[s.name]) for s in spec.sessions}
    helper = readyq.Queue(env.url)
    watch = LockWatch(env)
    # SQLite: a step released by another session's commit returns within milliseconds; a
    # step still waiting is given this long after each later step before the runner goes on.
    settle_wait = max(0.15, env.block_timeout / 3)
    invalid_prefixes: set[tuple[str, ...]] = set()
    try:
        for n, order in enumerate(spec.interleavings()):
            if limit is not None and n >= limit:
                break
            rep.permutations += 1
            if any(order[:k] in invalid_prefixes for k in range(1, len(order))):
                rep.invalid += 1
                rep.pruned += 1
                continue
            env.site.reset()
            world = World(env, caps, ManualClock(), helper=helper)
            spec.setup(world)
            sessions = {name: Session(name, world, eng) for name, eng in engines.items()}
            out = Outcome(order)
            pending: dict[str, tuple[str, threading.Event]] = {}  # session -> (step, done)

            def settle(wait: float, pending: dict = pending) -> None:
                for sname, (_key, done) in list(pending.items()):
                    if watch.engine is not None:
                        finished = wait > 0 and watch.finishes(done, pids[sname])
                    else:
                        finished = done.wait(wait)
                    if finished:
                        del pending[sname]

            try:
                for i, key in enumerate(order):
                    sname, step = steps[key]
                    if sname in pending:
                        out.invalid = f"{key} cannot run: {pending[sname][0]} is still blocked"
                        invalid_prefixes.add(order[: i + 1])
                        break
                    res = StepResult(sname, step.name)
                    out.results[key] = res
                    done = sessions[sname].submit(step, res)
                    if not watch.finishes(done, pids[sname]):
                        res.blocked = True
                        pending[sname] = (key, done)
                    settle(0.0 if res.blocked else settle_wait)
                if out.invalid is None:
                    for sname, (_key, done) in list(pending.items()):
                        if done.wait(max(10.0, 3 * env.block_timeout)):
                            del pending[sname]
                    out.stuck = [key for key, _ in pending.values()]
            finally:
                # Sessions not waiting end first (their rollback releases the waiters).
                for sname in sorted(sessions, key=lambda s: s in pending):
                    if not sessions[sname].stop(15.0):
                        out.stuck.append(f"{sname} (did not stop)")
                world.close()
            timed = [(r.t_done, k) for k, r in out.results.items() if r.t_done is not None]
            out.finished = [k for _, k in sorted(timed)]
            blocked = [k for k, r in out.results.items() if r.blocked]
            if blocked:
                rep.with_blocked_step += 1
            where = " -> ".join(order)
            bad = [k for k in blocked if not spec.may_block(caps, steps[k][0])]
            if bad:
                rep.violations.append(f"[{where}] {', '.join(bad)} waited on another session")
                continue
            if out.stuck:
                rep.violations.append(f"[{where}] never finished: {out.stuck}")
                continue
            if out.invalid is not None:
                rep.invalid += 1
                continue
            rep.checked += 1
            try:
                spec.check(world, out)
            except AssertionError as exc:
                got = "; ".join(repr(r) for r in out.results.values())
                rep.violations.append(f"[{where}] {exc} (steps: {got})")
    finally:
        watch.close()
        helper.close()
        for eng in engines.values():
            eng.dispose()
    return rep


# -- step helpers -------------------------------------------------------------------


def _begin(s: Session) -> None:
    s.begin()


def _commit(s: Session) -> None:
    s.commit()


def _claim_tx(limit: int = 1) -> Callable[[Session], list[int]]:
    def claim(s: Session) -> list[int]:
        assert s.conn is not None
        got = _claim.claim(
            s.conn,
            s.ad,
            worker_id=s.name,
            now=s.clock.now_us(),
            ttl_us=TTL_US,
            limit=limit,
            groups=None,
        )
        return [lease.job_id for lease in got]

    return claim


def _ok(r: StepResult) -> bool:
    return r.error is None and r.skipped is None


def _retryable(s: Any, r: StepResult) -> bool:
    return isinstance(r.error, sa.exc.DBAPIError) and s.caps.adapter.is_retryable(r.error)


def _no_errors(w: World, out: Outcome, allow: Sequence[type[BaseException]] = ()) -> None:
    for key, r in out.results.items():
        if r.error is not None and not isinstance(r.error, tuple(allow)):
            raise AssertionError(f"{key} raised {type(r.error).__name__}: {r.error}")


def _serialized(caps: Requirements, session: str) -> bool:
    return caps.has("serialized_writers")


# -- the specs ----------------------------------------------------------------------


def _setup_ready(n: int) -> Callable[[World], None]:
    def setup(w: World) -> None:
        with w.queue().graph() as g:
            handles = [g.add("t", {"i": i}) for i in range(n)]
        w.vars["jobs"] = [h.id for h in handles]

    return setup


def _check_claim_vs_claim(w: World, out: Outcome) -> None:
    _no_errors(w, out)
    a, b = out.value("A.claim"), out.value("B.claim")
    assert len(a) == 1, f"claimer A got {a} with 3 jobs ready"
    assert len(b) == 1, f"claimer B got {b} with 3 jobs ready"
    assert not set(a) & set(b), f"both claimers got job {set(a) & set(b)}"
    states = sorted(w.row(j).state for j in w.vars["jobs"])
    assert states == ["ready", "running", "running"], f"job states afterwards: {states}"


CLAIM_VS_CLAIM = Spec(
    name="claim_vs_claim",
    doc="Two claimers in open transactions get different jobs, and (with skip_locked) "
    "neither waits for the other.",
    setup=_setup_ready(3),
    sessions=(
        SessionSpec(
            "A", (Step("begin", _begin), Step("claim", _claim_tx()), Step("commit", _commit))
        ),
        SessionSpec(
            "B", (Step("begin", _begin), Step("claim", _claim_tx()), Step("commit", _commit))
        ),
    ),
    check=_check_claim_vs_claim,
    may_block=_serialized,
)


def _enqueue_urgent(s: Session) -> int:
    return s.queue.enqueue("urgent", priority=-1)


def _check_claim_vs_enqueue(w: World, out: Outcome) -> None:
    _no_errors(w, out)
    new, got = out.value("E.enqueue"), out.value("C.claim")
    assert len(got) == 1, f"the claimer got {got} with 3 jobs ready"
    want = JobState.RUNNING if got == [new] else JobState.READY
    assert w.row(new).state == want, f"the enqueued job is {w.row(new).state}"


CLAIM_VS_ENQUEUE = Spec(
    name="claim_vs_enqueue",
    doc="An enqueue commits while a claim transaction is open (no gap locks: InnoDB at "
    "REPEATABLE READ blocks an insert before the locked row).",
    setup=_setup_ready(3),
    sessions=(
        SessionSpec(
            "C", (Step("begin", _begin), Step("claim", _claim_tx()), Step("commit", _commit))
        ),
        SessionSpec("E", (Step("enqueue", _enqueue_urgent),)),
    ),
    check=_check_claim_vs_enqueue,
    may_block=_serialized,
)


def _insert_child(s: Session) -> list[int]:
    assert s.conn is not None
    g = s.queue.graph()
    g.add("child", after=[s.world.vars["jobs"][0]])
    return graph._insert(s.conn, s.ad, g._order(), s.clock.now_us())


def _claim_call(s: Session) -> list[int]:
    return [lease.job_id for lease in s.queue.claim(s.name, ttl=10, limit=2)]


def _check_claim_vs_dep(w: World, out: Outcome) -> None:
    _no_errors(w, out)
    (parent,) = w.vars["jobs"]
    got = out.value("C.claim")
    assert got in ([parent], []), f"claim returned {got}"
    (child,) = out.value("E.insert")
    row = w.row(child)
    assert (row.state, row.pending_deps) == ("blocked", 1), f"child is {row.state}"
    open_tx = out.before("E.begin", "C.claim") and out.before("C.claim", "E.commit")
    if not got:
        assert open_tx, "the ready job was not claimed although no transaction held it"
        assert not w.caps.has("key_share_lock"), (
            "the ready job was hidden from the claimer by an open dependency insert, "
            "although the adapter declares key_share_lock"
        )


CLAIM_VS_DEPENDENCY_INSERT = Spec(
    name="claim_vs_dependency_insert",
    doc="A claim never waits for an open transaction that adds a dependent to a ready job; "
    "with key_share_lock it also still sees that job.",
    setup=_setup_ready(1),
    sessions=(
        SessionSpec(
            "E", (Step("begin", _begin), Step("insert", _insert_child), Step("commit", _commit))
        ),
        SessionSpec("C", (Step("claim", _claim_call),)),
    ),
    check=_check_claim_vs_dep,
    may_block=_serialized,
)


def _setup_two_parents(w: World) -> None:
    q = w.queue()
    with q.graph() as g:
        a, b = g.add("p1"), g.add("p2")
        child = g.add("child", after=[a, b])
    leases = {lease.job_id: lease for lease in q.claim("w", limit=2, ttl=60)}
    w.vars.update(a=leases[a.id], b=leases[b.id], child=child.id)


def _finalize_tx(var: str) -> Callable[[Session], str]:
    def fin(s: Session) -> str:
        assert s.conn is not None
        return _store.finalize(s.conn, s.ad, s.world.vars[var], "{}", now=s.clock.now_us()).state

    return fin


def _check_two_parents(w: World, out: Outcome) -> None:
    q = w.queue()
    for sess, var in (("A", "a"), ("B", "b")):
        r = out.results[f"{sess}.finalize"]
        if r.skipped or (r.error is not None and _retryable(w, r)) or out.error(f"{sess}.commit"):
            q.finalize(w.vars[var])  # readyq reruns a transaction that hit a deadlock
        elif r.error is not None:
            raise AssertionError(f"{sess}.finalize raised {type(r.error).__name__}: {r.error}")
    row = w.row(w.vars["child"])
    assert (row.state, row.pending_deps) == ("ready", 0), (
        f"child is {row.state} with pending_deps {row.pending_deps} after both parents finished"
    )


TWO_PARENTS_ONE_CHILD = Spec(
    name="two_parents_one_child",
    doc="Two parents finalized in overlapping transactions promote their child exactly once "
    "(it ends ready with no pending dependency, never stuck blocked or counted twice).",
    setup=_setup_two_parents,
    sessions=(
        SessionSpec(
            "A",
            (Step("begin", _begin), Step("finalize", _finalize_tx("a")), Step("commit", _commit)),
        ),
        SessionSpec(
            "B",
            (Step("begin", _begin), Step("finalize", _finalize_tx("b")), Step("commit", _commit)),
        ),
    ),
    check=_check_two_parents,
)


def _setup_expired(w: World) -> None:
    q = w.queue()
    w.vars["job"] = q.enqueue("t", max_attempts=5)
    w.vars["lease"] = q.claim("w1", ttl=10)[0]
    w.clock.advance(11)


def _reclaim_tx(s: Session) -> int:
    assert s.conn is not None
    return _store.reclaim(s.conn, s.ad, now=s.clock.now_us(), batch=10).total


def _heartbeat_tx(s: Session) -> int:
    assert s.conn is not None
    return _store.heartbeat(s.conn, s.world.vars["lease"], now=s.clock.now_us(), ttl_us=TTL_US)


def _sweeper_never_waits(caps: Requirements, session: str) -> bool:
    return session != "S" or not caps.has("skip_locked")


def _exactly_one(w: World, out: Outcome, holder: str, holder_state: str) -> None:
    _no_errors(w, out, allow=(LeaseLost,))
    won = out.error(holder) is None
    reclaimed = out.value("S.reclaim")
    assert won != bool(reclaimed), (
        f"{holder} {'succeeded' if won else 'lost'} and the sweeper reclaimed {reclaimed}: "
        "exactly one of them must win"
    )
    row = w.row(w.vars["job"])
    want = holder_state if won else "ready"
    assert row.state == want, f"job is {row.state}, expected {want}"
    if not won:
        assert isinstance(out.error(holder), LeaseLost), "the loser is told LeaseLost"


FINALIZE_VS_RECLAIM = Spec(
    name="finalize_vs_reclaim",
    doc="A finalize and a sweep racing on an expired lease: exactly one wins, the other "
    "changes nothing (the finalizer gets LeaseLost, or the sweeper reclaims nothing).",
    setup=_setup_expired,
    sessions=(
        SessionSpec(
            "A",
            (
                Step("begin", _begin),
                Step("finalize", _finalize_tx("lease")),
                Step("commit", _commit),
            ),
        ),
        SessionSpec(
            "S", (Step("begin", _begin), Step("reclaim", _reclaim_tx), Step("commit", _commit))
        ),
    ),
    check=lambda w, out: _exactly_one(w, out, "A.finalize", "done"),
    may_block=_sweeper_never_waits,
)

HEARTBEAT_VS_SWEEPER = Spec(
    name="heartbeat_vs_sweeper",
    doc="A heartbeat and a sweep racing on an expired lease: exactly one wins, and (with "
    "skip_locked) the sweeper never waits behind the heartbeat's open transaction.",
    setup=_setup_expired,
    sessions=(
        SessionSpec(
            "A", (Step("begin", _begin), Step("heartbeat", _heartbeat_tx), Step("commit", _commit))
        ),
        SessionSpec(
            "S", (Step("begin", _begin), Step("reclaim", _reclaim_tx), Step("commit", _commit))
        ),
    ),
    check=lambda w, out: _exactly_one(w, out, "A.heartbeat", "running"),
    may_block=_sweeper_never_waits,
)


def _sweep_call(s: Session) -> int:
    return s.queue.reclaim()


def _old_finalize(s: Session) -> str:
    return s.queue.finalize(s.world.vars["lease"], {"by": "old"}).state


def _check_stale_finalize(w: World, out: Outcome) -> None:
    _no_errors(w, out, allow=(LeaseLost,))
    row = w.row(w.vars["job"])
    old_first = out.before("A.finalize", "S.reclaim")
    if old_first:
        assert out.error("A.finalize") is None, "a finalize before any reclaim is accepted"
        assert row.state == "done"
        assert out.value("S.reclaim") == 0
        assert out.value("B.claim") == []
        return
    assert isinstance(out.error("A.finalize"), LeaseLost), (
        f"the old holder's finalize after its lease was reclaimed returned "
        f"{out.results['A.finalize']!r}; it must be LeaseLost"
    )
    assert row.result is None, f"the stale worker's result was stored: {row.result}"
    if out.before("S.reclaim", "B.claim"):
        assert out.value("B.claim") == [w.vars["job"]]
        assert (row.state, row.lease_owner, row.lease_token) == ("running", "B", 2)
    else:
        assert row.state == "ready"


STALE_FINALIZE_AFTER_RECLAIM = Spec(
    name="stale_finalize_after_reclaim",
    doc="A worker whose expired lease was reclaimed (and perhaps re-claimed by another) "
    "cannot finalize the job: its finalize is LeaseLost and stores nothing.",
    setup=_setup_expired,
    sessions=(
        SessionSpec("S", (Step("reclaim", _sweep_call),)),
        SessionSpec("B", (Step("claim", _claim_call),)),
        SessionSpec("A", (Step("finalize", _old_finalize),)),
    ),
    check=_check_stale_finalize,
)


def _crash(s: Session) -> None:
    s.crash()


def _check_crash(w: World, out: Outcome) -> None:
    _no_errors(w, out)
    taken = set(out.value("B.claim"))
    assert taken, "the surviving claimer got nothing"
    for job in w.vars["jobs"]:
        row = w.row(job)
        if job in taken:
            assert (row.state, row.lease_owner) == ("running", "B")
        else:
            assert (row.state, row.lease_token, row.attempts, row.lease_owner) == (
                "ready",
                0,
                0,
                None,
            ), f"job {job} kept traces of the crashed claim: {row.state}, {row.lease_owner}"


CRASH_MID_CLAIM = Spec(
    name="crash_mid_claim",
    doc="A claimer whose connection dies inside its claim transaction leaves no trace: its "
    "job is ready again at once, token unchanged, and another claimer can take it.",
    setup=_setup_ready(2),
    sessions=(
        SessionSpec(
            "A", (Step("begin", _begin), Step("claim", _claim_tx()), Step("crash", _crash))
        ),
        SessionSpec("B", (Step("claim", _claim_call),)),
    ),
    check=_check_crash,
    may_block=_serialized,
)

SPECS: dict[str, Spec] = {
    s.name: s
    for s in (
        CLAIM_VS_CLAIM,
        CLAIM_VS_ENQUEUE,
        CLAIM_VS_DEPENDENCY_INSERT,
        TWO_PARENTS_ONE_CHILD,
        FINALIZE_VS_RECLAIM,
        HEARTBEAT_VS_SWEEPER,
        STALE_FINALIZE_AFTER_RECLAIM,
        CRASH_MID_CLAIM,
    )
}
