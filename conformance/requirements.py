"""Capabilities, not database names: what a backend can do, declared and then probed live.

:class:`Requirements` declares each capability (by default from the adapter's flags) and
:meth:`Requirements.probe` checks each one on the real database. Tests name capabilities
(``@pytest.mark.requires("skip_locked")``), never databases. Verdicts:

* declared and confirmed: ``ok``;
* declared but refuted by the probe: ``ERROR`` (the adapter promises what the database
  does not do; the suite fails);
* not declared but the probe finds it works: ``unexpected`` (reported, not an error: the
  adapter could declare it);
* not declared and absent: ``ok``.

Subclass :class:`Requirements` to change a declaration (``--requirements module:Class``):
override ``declare_<name>(self, adapter) -> bool``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import sqlalchemy as sa

import readyq
from readyq import _claim, _guards, graph
from readyq._claim import _ORDER
from readyq.clock import from_us, to_us
from readyq.dialects import Adapter
from readyq.schema import jobs

from ._threads import Attempt
from .env import Env, ManualClock

__all__ = ["CAPABILITIES", "CapabilityResult", "Probe", "Requirements"]

c = jobs.c


@dataclass(frozen=True)
class Probe:
    """What a live check found: ``works`` True/False, or None when it could not tell."""

    works: bool | None
    detail: str


@dataclass(frozen=True)
class CapabilityResult:
    name: str
    meaning: str
    declared: bool
    works: bool | None
    detail: str

    @property
    def verdict(self) -> str:
        if self.works is None:
            return "ok" if not self.declared else "unverified"
        if self.declared and not self.works:
            return "ERROR"
        if not self.declared and self.works:
            return "unexpected"
        return "ok"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "verdict": self.verdict}


#: name -> what it means, in words for someone who has never seen readyq.
CAPABILITIES: dict[str, str] = {
    "exclusive_claim": (
        "while one transaction holds a claimed row, another claimer either skips that row "
        "or waits: it never takes the same row (required of every adapter)"
    ),
    "skip_locked": (
        "a claimer skips rows another open transaction has locked, at once, without waiting"
    ),
    "key_share_lock": (
        "an open transaction adding a dependency on a ready job does not hide that job "
        "from claimers (PostgreSQL FOR NO KEY UPDATE; InnoDB has no such lock mode)"
    ),
    "update_returning": "UPDATE ... RETURNING returns the updated rows",
    "claim_in_one_statement": (
        "a claim runs as one statement: an UPDATE ... RETURNING whose rows come from a "
        "locked, limited select of the same table in a MATERIALIZED CTE"
    ),
    "claim_autocommit": (
        "the one-statement claim, sent with no transaction around it (autocommit), still "
        "skips a row another transaction holds and its lease is visible to others at once"
    ),
    "update_in_cte": (
        "an UPDATE ... RETURNING runs inside the WITH clause of another statement (a "
        "data-modifying CTE): finalize and promotion become one statement"
    ),
    "commit_together_capable": (
        "statements sent together by commit_together on an autocommit connection are one "
        "transaction: all committed at the end, or none if one fails"
    ),
    "microsecond_timestamps": "times readyq stores keep their microseconds",
    "listen_notify": "LISTEN/NOTIFY delivers a notification between two sessions",
    "serialized_writers": "only one write transaction runs at a time (SQLite)",
    "concurrent_writers": "two write transactions on different rows run side by side",
    "read_committed": (
        "each statement of a write transaction sees rows other transactions committed "
        "before it (no transaction-long snapshot)"
    ),
}


#: Bind values of a one-statement claim of one job, at a time after every probe job.
_CLAIM_ONE = {"now": 2**62, "n": 1, "owner": "probe", "expires": 2**62}


class Requirements:
    """Declared capabilities of one adapter, and live probes of each."""

    #: Wall seconds after which a probe's statement counts as blocked.
    block_timeout: ClassVar[float] = 0.6

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self.declared: dict[str, bool] = {
            name: bool(getattr(self, f"declare_{name}")(adapter)) for name in CAPABILITIES
        }
        self.results: dict[str, CapabilityResult] = {}

    # -- declarations (override in a subclass) ----------------------------------------

    def declare_exclusive_claim(self, ad: Adapter) -> bool:
        return True  # not optional: without it two workers run the same job

    def declare_skip_locked(self, ad: Adapter) -> bool:
        return ad.skip_locked

    def declare_key_share_lock(self, ad: Adapter) -> bool:
        return ad.key_share_lock

    def declare_update_returning(self, ad: Adapter) -> bool:
        return ad.update_returning

    def declare_claim_in_one_statement(self, ad: Adapter) -> bool:
        return ad.claim_in_one_statement

    def declare_claim_autocommit(self, ad: Adapter) -> bool:
        return ad.claim_autocommit

    def declare_update_in_cte(self, ad: Adapter) -> bool:
        return ad.update_in_cte

    def declare_commit_together_capable(self, ad: Adapter) -> bool:
        return ad.commit_together_capable

    def declare_microsecond_timestamps(self, ad: Adapter) -> bool:
        return True  # readyq stores BIGINT epoch microseconds on every database

    def declare_listen_notify(self, ad: Adapter) -> bool:
        return ad.listen_notify

    def declare_serialized_writers(self, ad: Adapter) -> bool:
        return ad.serialized_writers

    def declare_concurrent_writers(self, ad: Adapter) -> bool:
        return not ad.serialized_writers

    def declare_read_committed(self, ad: Adapter) -> bool:
        return (ad.isolation_level or "").upper() == "READ COMMITTED"

    # -- use --------------------------------------------------------------------------

    def has(self, name: str) -> bool:
        """Whether the capability is declared (tests are selected by declarations)."""
        try:
            return self.declared[name]
        except KeyError:
            raise KeyError(f"unknown capability {name!r}; known: {sorted(CAPABILITIES)}") from None

    def consistency_errors(self) -> list[str]:
        """Declarations that contradict each other."""
        d = self.declared
        out = []
        if not (d["skip_locked"] or d["serialized_writers"]):
            out.append(
                "the adapter declares neither skip_locked nor serialized_writers: nothing "
                "keeps two claimers from taking the same job"
            )
        if d["serialized_writers"] == d["concurrent_writers"]:
            out.append("serialized_writers and concurrent_writers must be opposites")
        if d["claim_autocommit"] and not (d["claim_in_one_statement"] and d["skip_locked"]):
            out.append(
                "claim_autocommit needs claim_in_one_statement and skip_locked: without a "
                "transaction only one locking statement keeps a claim atomic"
            )
        if d["commit_together_capable"] and not d["update_in_cte"]:
            out.append(
                "commit_together_capable is used only with update_in_cte: a finalize sent in "
                "one round trip needs its update and promotion in one statement"
            )
        if d["key_share_lock"] and not d["skip_locked"]:
            out.append("key_share_lock only means something together with skip_locked")
        return out

    def probe(self, env: Env) -> dict[str, CapabilityResult]:
        """Check every capability live on ``env``'s database (rows are reset around it)."""
        for name, meaning in CAPABILITIES.items():
            fn: Callable[[Env], Probe] = getattr(self, f"probe_{name}")
            env.site.reset()
            try:
                got = fn(env)
            except Exception as exc:
                got = Probe(False, f"probe raised {type(exc).__name__}: {exc}".strip()[:500])
            finally:
                env.close_queues()
            self.results[name] = CapabilityResult(
                name, meaning, self.declared[name], got.works, got.detail
            )
        env.site.reset()
        return self.results

    # -- probes -----------------------------------------------------------------------

    def _ready_jobs(self, env: Env, n: int) -> list[int]:
        q = env.queue(ManualClock())
        return [q.enqueue("probe", {"i": i}) for i in range(n)]

    def _second_claim(self, env: Env, stmt: sa.Select[Any]) -> Attempt:
        """The claim select ``stmt`` on a second connection, in a write transaction."""

        def run() -> list[int]:
            with env.write() as (conn, _):
                return [int(x) for x in conn.execute(stmt).scalars()]

        return Attempt(run, "probe-second")

    def _held(self, env: Env, hold: Callable[[Any, Adapter], Any], then: Callable[[], Attempt]):
        """Run ``hold`` in an open write transaction, start ``then()``, wait, roll back."""
        with env.engine.connect() as conn:
            tx = conn.begin()
            try:
                env.adapter.begin_write(conn)
                held = hold(conn, env.adapter)
                attempt = then()
                # Where writers are serialized, waiting is the expected answer: do not
                # spend long on it. Elsewhere give a loaded machine time to answer.
                serial = self.declared["serialized_writers"]
                finished = attempt.wait(self.block_timeout if serial else 3 * self.block_timeout)
            finally:
                tx.rollback()
        attempt.wait(30)
        return held, finished, attempt

    def _claimable(self, env: Env, limit: int = 1) -> sa.Select[Any]:
        # readyq's own claim order (an index order). MariaDB 10.11 returned no row at all
        # for ORDER BY id LIMIT 1 ... SKIP LOCKED (a filesort) when the first row was locked.
        base = sa.select(c.id).where(c.state == "ready").order_by(*_ORDER).limit(limit)
        return env.adapter.lock_claimable(base)

    def probe_exclusive_claim(self, env: Env) -> Probe:
        ids = self._ready_jobs(env, 2)
        stmt = self._claimable(env)
        held, finished, att = self._held(
            env,
            lambda conn, ad: [int(x) for x in conn.execute(stmt).scalars()],
            lambda: self._second_claim(env, stmt),
        )
        if att.error is not None:
            return Probe(None, f"second claimer failed: {att.error!r:.300}")
        if not finished:
            return Probe(True, "the second claimer waited for the first to finish")
        if att.value and att.value == held:
            return Probe(False, f"both claimers took job(s) {held} of {ids} at the same time")
        return Probe(True, f"first claimer took {held}, second {att.value} without waiting")

    def probe_skip_locked(self, env: Env) -> Probe:
        self._ready_jobs(env, 2)
        stmt = self._claimable(env)
        held, finished, att = self._held(
            env,
            lambda conn, ad: [int(x) for x in conn.execute(stmt).scalars()],
            lambda: self._second_claim(env, stmt),
        )
        if not finished:
            return Probe(False, f"the second claimer waited more than {self.block_timeout}s")
        if att.error is not None:
            return Probe(False, f"second claimer failed: {att.error!r:.300}")
        if not att.value or att.value == held:
            return Probe(False, f"first claimer took {held}, second got {att.value}")
        return Probe(True, f"first claimer took {held}, the second skipped to {att.value}")

    def probe_key_share_lock(self, env: Env) -> Probe:
        (parent,) = self._ready_jobs(env, 1)
        q = env.queue(ManualClock())
        g = q.graph()
        g.add("child", after=[parent])
        specs = g._order()
        stmt = env.adapter.lock_claimable(
            sa.select(c.id).where(c.id == parent, c.state == "ready").limit(1)
        )
        _, finished, att = self._held(
            env,
            lambda conn, ad: graph._insert(conn, ad, specs, q.clock.now_us()),
            lambda: self._second_claim(env, stmt),
        )
        if not finished:
            return Probe(False, "the claimer waited for the open dependency insert")
        if att.error is not None:
            return Probe(False, f"claimer failed: {att.error!r:.300}")
        if att.value != [parent]:
            return Probe(False, "the ready job was hidden from the claimer (skipped as locked)")
        return Probe(True, "the claimer took the ready job while a dependent was being added")

    def probe_update_returning(self, env: Env) -> Probe:
        (job,) = self._ready_jobs(env, 1)
        with env.engine.connect() as conn, conn.begin() as tx:
            upd = sa.update(jobs).where(c.id == job).values(heartbeat_us=7).returning(c.id)
            try:
                got = [int(x) for x in conn.execute(upd).scalars()]
            except (sa.exc.CompileError, sa.exc.DBAPIError) as exc:
                return Probe(False, f"{type(exc).__name__}: {str(exc).splitlines()[0]:.200}")
            finally:
                tx.rollback()
        return Probe(got == [job], f"RETURNING gave {got}")

    def probe_claim_in_one_statement(self, env: Env) -> Probe:
        self._ready_jobs(env, 2)
        stmt = _claim._claim_one_statement(env.adapter, _guards.guard)
        with env.engine.connect() as conn, conn.begin() as tx:
            try:
                got = [int(r.id) for r in conn.execute(stmt, _CLAIM_ONE)]
            except (sa.exc.CompileError, sa.exc.DBAPIError) as exc:
                return Probe(False, f"{type(exc).__name__}: {str(exc).splitlines()[0]:.200}")
            finally:
                tx.rollback()
        # Rolled back: other probes' ready jobs may come first, but exactly one is leased.
        return Probe(len(got) == 1, f"the one-statement claim (limit 1) leased {got}")

    def probe_claim_autocommit(self, env: Env) -> Probe:
        ids = self._ready_jobs(env, 2)
        stmt = _claim._claim_one_statement(env.adapter, _guards.guard)

        def autocommit_claim() -> list[int]:
            with env.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                return [int(r.id) for r in conn.execute(stmt, _CLAIM_ONE)]

        held, finished, att = self._held(
            env,
            lambda conn, ad: [int(x) for x in conn.execute(self._claimable(env)).scalars()],
            lambda: Attempt(autocommit_claim, "probe-autocommit"),
        )
        if not finished:
            return Probe(False, "the autocommit claim waited for the open transaction")
        if att.error is not None:
            return Probe(False, f"autocommit claim failed: {att.error!r:.300}")
        if not att.value or att.value == held:
            return Probe(False, f"the open transaction held {held}, the claim took {att.value}")
        with env.engine.connect() as conn:
            state = conn.execute(sa.select(c.state).where(c.id == att.value[0])).scalar()
        if state != "running":
            return Probe(False, f"job {att.value[0]} of {ids} is {state!r} after the claim")
        return Probe(True, f"skipped held job {held}, leased and committed {att.value}")

    def probe_update_in_cte(self, env: Env) -> Probe:
        (job,) = self._ready_jobs(env, 1)
        upd = sa.update(jobs).where(c.id == job).values(heartbeat_us=7).returning(c.id)
        changed = upd.cte("changed")
        stmt = sa.select(sa.select(sa.func.count()).select_from(changed).scalar_subquery())
        with env.engine.connect() as conn, conn.begin() as tx:
            try:
                n = conn.execute(stmt).scalar()
                seen = conn.execute(sa.select(c.heartbeat_us).where(c.id == job)).scalar()
            except (sa.exc.CompileError, sa.exc.DBAPIError) as exc:
                return Probe(False, f"{type(exc).__name__}: {str(exc).splitlines()[0]:.200}")
            finally:
                tx.rollback()
        return Probe(n == 1 and seen == 7, f"the CTE counted {n} row(s); the row reads {seen}")

    def probe_commit_together_capable(self, env: Env) -> Probe:
        (job,) = self._ready_jobs(env, 1)
        beat = sa.update(jobs).where(c.id == job).values(heartbeat_us=sa.bindparam("beat"))
        broken = sa.text("SELECT no_such_column FROM readyq_jobs")

        def send(*statements: tuple[sa.Executable, dict[str, Any]]) -> str:
            with env.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                try:
                    got = env.adapter.commit_together(conn, list(statements))
                except NotImplementedError:
                    return "not implemented"
                except sa.exc.DBAPIError:
                    return "failed"
                return "cannot on this connection" if got is None else "sent"

        def heartbeat() -> Any:
            with env.engine.connect() as conn:
                return conn.execute(sa.select(c.heartbeat_us).where(c.id == job)).scalar()

        first = send((beat, {"beat": 7}))
        committed = heartbeat()
        second = send((beat, {"beat": 8}), (broken, {}))
        undone = heartbeat()
        ok = (first, committed, second, undone) == ("sent", 7, "failed", 7)
        return Probe(
            ok,
            f"one statement: {first}, the row reads {committed}; with a failing second "
            f"statement: {second}, the row reads {undone}",
        )

    def probe_microsecond_timestamps(self, env: Env) -> Probe:
        clock = ManualClock()
        q = env.queue(clock)
        at = from_us(clock.now_us() + 1_234_567)
        assert at is not None
        job = q.enqueue("probe", run_after=at)
        back = q.get(job).run_after
        clock.advance(2)
        lease = q.claim("probe", ttl=1.000_001)[0]
        expiry = q.get(job).lease_expires_at
        ok = to_us(back) == to_us(at) and expiry == lease.expires_at
        return Probe(ok, f"stored {at.isoformat()}, read {back.isoformat()}; lease expiry {expiry}")

    def probe_listen_notify(self, env: Env) -> Probe:
        if env.engine.dialect.name != "postgresql":
            return Probe(False, f"{env.engine.dialect.name} has no LISTEN/NOTIFY")
        eng = sa.create_engine(env.url, isolation_level="AUTOCOMMIT")
        try:
            return self._listen(eng)
        finally:
            eng.dispose()

    def _listen(self, eng: sa.Engine) -> Probe:
        with eng.connect() as listener, eng.connect() as sender:
            listener.exec_driver_sql("LISTEN readyq_conformance_probe")
            sender.exec_driver_sql("NOTIFY readyq_conformance_probe, 'hello'")
            raw = listener.connection.driver_connection
            notifies = getattr(raw, "notifies", None)
            if notifies is None:
                return Probe(None, "LISTEN accepted; this driver cannot show the delivery")
            got = [n.payload for n in notifies(timeout=2, stop_after=1)]
            listener.exec_driver_sql("UNLISTEN *")
        return Probe(got == ["hello"], f"received {got}")

    def _writers(self, env: Env) -> tuple[bool, Attempt]:
        a, b = self._ready_jobs(env, 2)

        def second() -> Attempt:
            def run() -> None:
                with env.write() as (conn, _):
                    conn.execute(sa.update(jobs).where(c.id == b).values(heartbeat_us=2))

            return Attempt(run, "probe-writer")

        _, finished, att = self._held(
            env,
            lambda conn, ad: conn.execute(sa.update(jobs).where(c.id == a).values(heartbeat_us=1)),
            second,
        )
        return finished, att

    def probe_serialized_writers(self, env: Env) -> Probe:
        finished, att = self._writers(env)
        if finished and att.error is None:
            return Probe(False, "a second writer committed while the first was open")
        if finished:
            return Probe(True, f"the second writer failed at once: {att.error!r:.200}")
        return Probe(True, "the second writer waited for the first to commit")

    def probe_concurrent_writers(self, env: Env) -> Probe:
        finished, att = self._writers(env)
        if finished and att.error is None:
            return Probe(True, "a second writer committed while the first was open")
        return Probe(False, "the second writer waited (or failed) while the first was open")

    def probe_read_committed(self, env: Env) -> Probe:
        (job,) = self._ready_jobs(env, 1)
        read = sa.select(c.priority).where(c.id == job)
        with env.engine.connect() as conn, conn.begin() as tx:
            env.adapter.begin_write(conn)
            before = conn.execute(read).scalar()

            def other() -> None:
                with env.write() as (w, _):
                    w.execute(sa.update(jobs).where(c.id == job).values(priority=7))

            att = Attempt(other, "probe-committer")
            serial = self.declared["serialized_writers"]
            if not att.wait(self.block_timeout if serial else 3 * self.block_timeout):
                tx.rollback()
                att.wait(30)
                return Probe(None, "writers are serialized: a write transaction sees every commit")
            after = conn.execute(read).scalar()
            tx.rollback()
        if att.error is not None:
            return Probe(None, f"the other writer failed: {att.error!r:.200}")
        if after == 7:
            return Probe(True, f"saw {before}, then the other transaction's {after}")
        return Probe(False, f"still saw {after} after another transaction committed 7 (snapshot)")


def load(spec: str | None, adapter: Adapter) -> Requirements:
    """A Requirements instance: the class named ``module:Class``, or the default."""
    if spec is None:
        return Requirements(adapter)
    from .provision import load_object

    cls = load_object(spec)
    if not (isinstance(cls, type) and issubclass(cls, Requirements)):
        raise TypeError(f"{spec} is not a readyq_conformance.requirements.Requirements subclass")
    return cls(adapter)


_ = readyq  # the probes drive readyq itself
