"""The interleaver: N actors on real connections, one SQL statement at a time, seeded order.

Each actor runs in a thread of its own, with engines of its own. Every statement, COMMIT and
ROLLBACK the actor's engine is about to send goes through a SQLAlchemy event hook that hands
the baton back to the scheduler and waits; the scheduler picks (from the ``schedule`` stream)
which waiting actor goes next. Exactly one actor thread runs at any moment, so the database
receives one deterministic, serial statement stream. Between statements, virtual time moves
only when the scheduler moves it: by ``step_us`` per step, or, when every actor waits on
virtual time, straight to the earliest wake-up.

Statements readyq sends together in one PostgreSQL pipeline pass no cursor event; readyq's
pipeline observer (:class:`_Pipelines`) schedules, records and faults such a group as one
step.

A statement that would wait on a lock held by a parked actor would hang the driver, so such
a wait fails at once (SQLite ``timeout=0``, MariaDB ``innodb_lock_wait_timeout = 0``, MySQL
1 s); a wall-clock watchdog stops the run if a statement still does not return. PostgreSQL
cancels the statement when ``pg_blocking_pids`` names a session of the run's database: a
lock held by anyone else is waited for, as it is released in wall time (a COMMIT after NOTIFY
takes a lock shared by every database on the server, and other clients' commits hold it;
under a short ``lock_timeout`` that made a COMMIT fail now and then, and a seed not replay).

Two faults stall an actor inside its own open transaction while virtual time passes and the
others run: ``slow_commit`` holds the COMMIT, and ``hang_in_txn`` (:class:`TxnHang`) stops
right after the transaction's first lock-taking statement. Its locks stay held (SQLite: the
write lock of ``BEGIN IMMEDIATE``), so the others' statements fail as would-block, or skip the
rows (``SKIP LOCKED``), until the hang heals: the transaction carries on and commits late, or
its session is killed from an admin connection and the server rolls it back.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from random import Random
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from readyq import dialects

from .clock import VirtualClock

__all__ = ["ActorCtx", "Crashed", "Driver", "DriverStuck", "Stopped", "TxnHang", "backend_kind"]

#: PostgreSQL: seconds a statement runs before the driver asks whom it waits for.
PG_WAIT_CHECK_S = 0.02
#: PostgreSQL: a lock wait still fails after this long (55P03), whoever holds the lock.
PG_LOCK_TIMEOUT_MS = 10_000

#: MariaDB 10.11 (checked on 10.11.19): with ``innodb_lock_wait_timeout = 0``, a ``SELECT ...
#: SKIP LOCKED`` that meets a locked secondary-index entry fails with error 1180 ("Got error
#: 1 during COMMIT") instead of skipping it (with 1 s it skips at once), and whether it meets
#: one depends on InnoDB's background purge, which broke replay. Such statements get a timeout
#: of their own; SKIP LOCKED never waits, so it costs no wall time.
MARIADB_SKIP_LOCKED_PREFIX = "SET STATEMENT innodb_lock_wait_timeout = 1 FOR "

#: Statements that leave locks held until the transaction ends (the first one arms a hang).
_LOCKING_PREFIXES = ("BEGIN IMMEDIATE", "BEGIN EXCLUSIVE", "UPDATE", "INSERT", "DELETE")
_LOCKING_CLAUSES = ("FOR UPDATE", "FOR NO KEY UPDATE", "FOR SHARE", "FOR KEY SHARE", "SHARE MODE")


def takes_locks(statement: str) -> bool:
    """Whether ``statement`` leaves row or table locks held until its transaction ends."""
    text = " ".join(statement.upper().split())
    if text.startswith(_LOCKING_PREFIXES) or any(k in text for k in _LOCKING_CLAUSES):
        return True
    return text.startswith("WITH") and any(f") {w} " in text for w in _LOCKING_PREFIXES[2:])


@dataclass(frozen=True)
class TxnHang:
    """Stall inside the next write transaction, after its first lock-taking statement.

    The actor sleeps ``seconds`` of virtual time in steps of ``every`` (others run, its locks
    stay held), or less if ``healed()`` turns true first; then the hang heals: the
    transaction goes on and commits late, or (``kill``) its session is killed, so the server
    rolls it back and the actor's next statement (or COMMIT) fails.
    """

    seconds: float
    kill: bool
    healed: Callable[[], bool]
    every: float = 0.5
    #: Called with the hang's virtual start and end (microseconds) when it heals.
    on_end: Callable[[int, int], None] | None = None


class Crashed(BaseException):
    """Raised inside an actor's statement hook to crash it.

    A BaseException on purpose: SQLAlchemy treats it as an exit exception and invalidates the
    connection (closing it), and readyq's retry loop, which catches DBAPIError, lets it pass.
    """


class Stopped(Exception):
    """Raised from ``ActorCtx.sleep`` once the driver is stopping: the actor should exit."""


class DriverStuck(RuntimeError):
    """A statement did not return within the watchdog's wall-clock limit."""


def backend_kind(url: str | sa.URL) -> str:
    name = sa.make_url(url).get_backend_name()
    return "mysql" if name in ("mysql", "mariadb") else name


class ActorCtx:
    """An actor's handle on the driver: virtual sleep, engines, and fault arming."""

    def __init__(self, driver: Driver, name: str, fn: Callable[[ActorCtx], None]) -> None:
        self.driver = driver
        self.name = name
        self.fn = fn
        self.state = "time"  # time | stmt | running | done
        self.wake_us = driver.clock.now_us()
        self.sem = threading.Semaphore(0)
        self.crashed = False
        self.error: BaseException | None = None
        #: Crash at this statement number of the current operation (1-based), if set.
        self.crash_at: int | None = None
        #: Kill the session just before the next COMMIT, if set.
        self.drop_at_commit = False
        #: Hold the next COMMIT for this many virtual seconds (locks stay held), if set.
        self.slow_commit_s: float | None = None
        #: Hang inside the next write transaction, if set (see :class:`TxnHang`).
        self.hang: TxnHang | None = None
        #: This transaction's session was killed (its COMMIT cannot succeed).
        self.txn_killed = False
        #: A hang of the current operation ended in a kill (the actor should reconnect).
        self.hang_killed = False
        self.stmt_count = 0
        self.commit_step: int | None = None
        #: The current transaction's COMMIT was sent in a pipeline (PostgreSQL).
        self.committed_in_pipeline = False
        #: The current operation's pipelined COMMIT succeeded (a later crash cannot undo it).
        self.committed = False
        self.last_statement = ""
        #: The server session the current statement runs on (PostgreSQL and MySQL).
        self.backend_id: int | None = None
        #: The driver cancelled the current statement: it waited for a parked actor's lock.
        self.wait_cancelled = False
        self.engines: list[Engine] = []
        self.thread = threading.Thread(target=self._main, name=f"sim-{name}", daemon=True)

    # -- used by actor code -----------------------------------------------------------

    @property
    def now_us(self) -> int:
        return self.driver.clock.now_us()

    @property
    def step(self) -> int:
        return self.driver.step

    def sleep(self, seconds: float) -> None:
        self.sleep_until(self.now_us + max(0, round(seconds * 1e6)))

    def sleep_until(self, wake_us: int) -> None:
        self.wake_us = max(wake_us, self.now_us)
        self._yield("time")
        if self.driver.stopping:
            raise Stopped

    def begin_op(self) -> None:
        """Call before each readyq operation: resets the statement counter and commit mark."""
        self.stmt_count = 0
        self.commit_step = None
        self.committed = False
        self.hang_killed = False

    def engine(self) -> Engine:
        """A new engine on the run's database, hooked into the driver."""
        eng = self.driver.make_engine(self)
        self.engines.append(eng)
        return eng

    def dispose_engines(self) -> None:
        while self.engines:
            self.engines.pop().dispose()

    # -- baton ------------------------------------------------------------------------

    def _yield(self, state: str) -> None:
        self.state = state
        self.driver._back.release()
        self.sem.acquire()

    def _main(self) -> None:
        self.sem.acquire()
        try:
            self.fn(self)
        except Stopped:
            pass
        except BaseException as exc:
            self.error = exc
        finally:
            self.state = "done"
            self.driver._back.release()

    # -- hooks (run in this actor's thread, holding the baton) ------------------------

    def _before(self, conn: Connection, statement: str, params: Any) -> None:
        if self.crashed:
            return
        self.last_statement = statement
        self.backend_id = conn.connection.info.get("backend_id")
        self._yield("stmt")
        if self.txn_killed and self.driver.kind == "sqlite":
            # The session is gone (see _after): what the next statement on it gets.
            raise sqlite3.OperationalError("the simulator killed this connection")
        self.stmt_count += 1
        if self.crash_at is not None and self.stmt_count >= self.crash_at:
            self.crash_at = None
            if not self.txn_killed:
                self.driver.kill(self, conn)
            self.crashed = True
            self.driver.record(self.name, "CRASH", f"at statement {self.stmt_count}")
            raise Crashed(self.name)

    def _after(self, conn: Connection, statement: str) -> None:
        """After a statement succeeded: start an armed hang if it left locks held."""
        hang = self.hang
        if hang is None or self.crashed or not takes_locks(statement):
            return
        self.hang = None
        self.driver.record(self.name, "HANG", f"{hang.seconds:g}s kill={hang.kill}")
        start_us = self.now_us
        left = hang.seconds
        while left > 1e-9 and not hang.healed():
            d = min(hang.every, left)
            self.sleep(d)  # others run meanwhile; this transaction's locks stay held
            left -= d
        waited = round(hang.seconds - max(0.0, left), 6)
        self.driver.record(self.name, "UNHANG", f"after {waited:g}s kill={hang.kill}")
        if hang.kill:
            if self.driver.kind == "sqlite":
                # No server session: roll the transaction back, as the file sees a dying
                # process do, and fail every later use of the connection (_before, _commit).
                # Closing it here, under an open cursor, would make SQLAlchemy log errors.
                conn.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
            else:
                self.driver.kill(self, conn)
            self.txn_killed = self.hang_killed = True
            self.driver.record(self.name, "KILL", "hung transaction")
        if hang.on_end is not None:
            hang.on_end(start_us, self.now_us)

    def _begin(self, conn: Connection) -> None:
        self.txn_killed = False
        self.committed_in_pipeline = False
        if self.committed:
            # A transaction after a pipelined COMMIT of the same operation is readyq's
            # fallback: the pipeline changed nothing (finalize_at_once returned None, for a
            # job inside a container). The operation commits, or not, with this one.
            self.committed = False
            self.commit_step = None

    def _commit(self, conn: Connection) -> None:
        if self.crashed:
            return
        if self.committed_in_pipeline:
            # The COMMIT went in the pipeline (see _Pipelines): this one sends nothing.
            self.committed_in_pipeline = False
            return
        self.last_statement = "COMMIT"
        if self.slow_commit_s is not None:
            held, self.slow_commit_s = self.slow_commit_s, None
            self.driver.record(self.name, "SLOW", f"commit held {held:g}s")
            self.sleep(held)  # others run meanwhile; this transaction's locks stay held
        self._yield("stmt")
        if not self.txn_killed:
            self.commit_step = self.driver.commit_position()
        elif self.driver.kind == "sqlite":
            conn.connection.dbapi_connection.close()  # type: ignore[union-attr]  # COMMIT fails
        self.driver.record(self.name, "COMMIT")
        if self.drop_at_commit:
            self.drop_at_commit = False
            if not self.txn_killed:
                self.driver.kill(self, conn)
            self.driver.record(self.name, "DROP", "before commit")

    def _rollback(self, conn: Connection) -> None:
        if self.crashed:
            return
        self.last_statement = "ROLLBACK"
        self._yield("stmt")
        self.driver.record(self.name, "ROLLBACK")


class Driver:
    """Owns the clock, the schedule stream, the digest and the actors."""

    def __init__(
        self,
        url: str,
        clock: VirtualClock,
        schedule: Random,
        *,
        step_us: int = 1000,
        watchdog: float = 20.0,
    ) -> None:
        self.url = url
        self.kind = backend_kind(url)
        self.clock = clock
        self.schedule = schedule
        self.step_us = step_us
        self.watchdog = watchdog
        self.step = 0
        self.stopping = False
        self.actors: list[ActorCtx] = []
        self._back = threading.Semaphore(0)
        self._digest = hashlib.blake2b(digest_size=16)
        self.trace: list[str] = []
        #: The actor picked at every scheduling decision (the trace's decision list).
        self.decisions: list[str] = []
        #: Replay: follow these picks instead of the schedule stream; after the last one,
        #: run actors serially (the last one on while it has statements), so that a shrunk
        #: prefix is the only interleaving in the run.
        self.script: list[str] | None = None
        self.diverged = 0
        self._last: ActorCtx | None = None
        self.blocked: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.admin = _admin_engine(url)
        #: PostgreSQL: the admin connection that checks whom a slow statement waits for.
        self._watch: Connection | None = None

    # -- positions of commits ----------------------------------------------------------

    def commit_position(self) -> int:
        """The position of a transaction whose COMMIT is about to be sent: its locks are
        taken and its reads done. Here the baton makes the step exact."""
        return self.step

    def pipeline_sent(self, ctx: ActorCtx) -> int:
        """The position of a pipeline that commits by itself, about to be sent (one
        scheduling step here: nothing else runs until it is back)."""
        return self.step

    def pipeline_back(self, ctx: ActorCtx, at: int) -> int:
        """That pipeline's position once it is back or failed (``at``: from
        :meth:`pipeline_sent`); called exactly once after it."""
        return at

    # -- digest -----------------------------------------------------------------------

    def record(self, actor: str, what: str, extra: str = "") -> None:
        line = f"{self.step}|{actor}|{what}|{extra}"
        self._digest.update(line.encode())
        self.trace.append(line[:300])

    @property
    def digest(self) -> str:
        return self._digest.hexdigest()

    # -- engines ----------------------------------------------------------------------

    def connect_args(self) -> dict[str, Any]:
        """Driver arguments that make a lock wait fail at once (the actor is parked)."""
        if self.kind == "sqlite":
            return {"timeout": 0, "check_same_thread": False}
        if self.kind == "postgresql":
            return {"options": f"-c lock_timeout={PG_LOCK_TIMEOUT_MS}"}
        if self.kind == "mysql":
            # MariaDB accepts 0 and fails a blocked statement at once; MySQL 8 clamps it to
            # its minimum of 1 s (a blocked statement then costs a second of wall time).
            return {"init_command": "SET SESSION innodb_lock_wait_timeout = 0"}
        return {}

    def make_engine(self, ctx: ActorCtx) -> Engine:
        kind = self.kind
        kw: dict[str, Any] = {"pool_size": 1, "max_overflow": 0, "pool_timeout": self.watchdog}
        if self.connect_args():
            kw["connect_args"] = self.connect_args()
        eng = dialects.create_engine(self.url, **kw)

        @event.listens_for(eng, "connect")
        def _connect(dbapi_conn: Any, rec: Any) -> None:
            if kind == "sqlite":
                return
            cur = dbapi_conn.cursor()
            cur.execute(
                "SELECT pg_backend_pid()" if kind == "postgresql" else "SELECT CONNECTION_ID()"
            )
            rec.info["backend_id"] = cur.fetchone()[0]
            cur.close()
            dbapi_conn.rollback()

        @event.listens_for(eng, "before_cursor_execute")
        def _before(  # noqa: PLR0917 -- SQLAlchemy's event signature
            conn: Connection, cursor: Any, statement: str, params: Any, context: Any, many: bool
        ) -> None:
            ctx._before(conn, statement, params)

        @event.listens_for(eng, "after_cursor_execute")
        def _after(  # noqa: PLR0917 -- SQLAlchemy's event signature
            conn: Connection, cursor: Any, statement: str, params: Any, context: Any, many: bool
        ) -> None:
            if not ctx.crashed:
                self.record(ctx.name, statement, f"{_params(params)}|{cursor.rowcount}")
                ctx._after(conn, statement)

        @event.listens_for(eng, "handle_error")
        def _error(exc_ctx: Any) -> None:
            if ctx.crashed or isinstance(exc_ctx.original_exception, Crashed):
                return
            self.failed(ctx, exc_ctx.statement, exc_ctx.parameters, exc_ctx.original_exception)

        if kind == "mysql":

            @event.listens_for(eng, "before_cursor_execute", retval=True)
            def _skip_locked(  # noqa: PLR0917 -- SQLAlchemy's event signature
                conn: Connection, cursor: Any, statement: str, params: Any, context: Any, many: bool
            ) -> tuple[str, Any]:
                if conn.dialect.is_mariadb and "SKIP LOCKED" in statement:  # type: ignore[attr-defined]
                    statement = MARIADB_SKIP_LOCKED_PREFIX + statement
                return statement, params

        event.listen(eng, "begin", ctx._begin)
        event.listen(eng, "commit", ctx._commit)
        event.listen(eng, "rollback", ctx._rollback)
        # Statements sent in a PostgreSQL pipeline pass no cursor event: these hooks
        # schedule, record and fault a pipeline as one step instead.
        return eng.execution_options(readyq_pipeline_observer=_Pipelines(ctx))

    def failed(self, ctx: ActorCtx, statement: str | None, params: Any, exc: BaseException) -> None:
        """Count and record a statement's error (a lock wait that failed counts as blocked)."""
        err = type(exc).__name__
        text = str(exc).lower()
        if ctx.wait_cancelled:
            ctx.wait_cancelled = False
            self.blocked[_kind_of(statement)] += 1
        elif "lock" in text and ("timeout" in text or "locked" in text or "wait" in text):
            self.blocked[_kind_of(statement)] += 1
        self.errors[err] += 1
        self.record(ctx.name, statement or "", f"{_params(params)}|!{err}")

    def kill(self, ctx: ActorCtx, conn: Connection) -> None:
        """End ``ctx``'s database session as a crash would (from an admin connection)."""
        if self.kind == "sqlite":
            # No server session to kill: closing the file handle mid-transaction rolls it
            # back and releases the write lock, as the process dying would.
            conn.connection.dbapi_connection.close()  # type: ignore[union-attr]
            return
        backend_id = conn.connection.info.get("backend_id")
        if backend_id is None:
            return
        with self.admin.connect() as admin:
            if self.kind == "postgresql":
                admin.execute(
                    sa.text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": backend_id}
                )
                return
            admin.exec_driver_sql(f"KILL CONNECTION {int(backend_id)}")
            for _ in range(5000):  # KILL returns before the session is gone: wait for it
                gone = admin.execute(
                    sa.text("SELECT COUNT(*) FROM information_schema.processlist WHERE id = :i"),
                    {"i": backend_id},
                ).scalar()
                if not gone:
                    return
                time.sleep(0.001)

    # -- actors and the schedule ------------------------------------------------------

    def spawn(self, name: str, fn: Callable[[ActorCtx], None]) -> ActorCtx:
        ctx = ActorCtx(self, name, fn)
        self.actors.append(ctx)
        ctx.thread.start()
        return ctx

    def run(
        self,
        *,
        max_steps: int,
        until: Callable[[], bool] | None = None,
        check_every_us: int = 1_000_000,
        deadline_us: int | None = None,
    ) -> str:
        """Schedule until ``until()`` holds, the step budget or deadline runs out, or all end.

        Returns why it stopped: ``until``, ``steps``, ``deadline`` or ``idle``.
        """
        limit = self.step + max_steps
        next_check = self.clock.now_us()
        while True:
            now = self.clock.now_us()
            if until is not None and now >= next_check:
                next_check = now + check_every_us
                if until():
                    return "until"
            if self.step >= limit:
                return "steps"
            if deadline_us is not None and now > deadline_us:
                return "deadline"
            runnable = [
                a
                for a in self.actors
                if a.state == "stmt" or (a.state == "time" and a.wake_us <= now)
            ]
            if not runnable:
                sleeping = [a.wake_us for a in self.actors if a.state == "time"]
                if not sleeping:
                    return "idle"
                wake = min(sleeping)
                if until is not None:
                    wake = min(wake, max(next_check, now))
                self.clock.set(max(wake, now))
                continue
            actor = self._pick(runnable)
            self.step += 1
            if actor.state == "time":
                self.record(actor.name, "WAKE")
            self._grant(actor)
            self.clock.advance(self.step_us / 1e6)

    def _pick(self, runnable: list[ActorCtx]) -> ActorCtx:
        n = len(self.decisions)
        if self.script is None:
            i = self.schedule.randrange(len(runnable)) if len(runnable) > 1 else 0
            actor = runnable[i]
        elif n < len(self.script):
            named = [a for a in runnable if a.name == self.script[n]]
            if not named:
                self.diverged += 1
            actor = named[0] if named else self._serial(runnable)
        else:
            actor = self._serial(runnable)
        self.decisions.append(actor.name)
        self._last = actor
        return actor

    def _serial(self, runnable: list[ActorCtx]) -> ActorCtx:
        last = self._last
        if last is not None and last.state == "stmt" and last in runnable:
            return last
        return runnable[0]

    def _grant(self, actor: ActorCtx) -> None:
        actor.state = "running"
        actor.wait_cancelled = False
        actor.sem.release()
        if self.kind != "postgresql":
            if not self._back.acquire(timeout=self.watchdog):
                raise self._stuck(actor)
            return
        give_up = time.monotonic() + self.watchdog
        while not self._back.acquire(timeout=PG_WAIT_CHECK_S):
            if time.monotonic() > give_up:
                raise self._stuck(actor)
            self._fail_wait_on_parked(actor)

    def _stuck(self, actor: ActorCtx) -> DriverStuck:
        return DriverStuck(
            f"actor {actor.name} did not yield within {self.watchdog:g}s wall time; "
            f"last statement: {actor.last_statement[:200]!r}"
        )

    def _fail_wait_on_parked(self, actor: ActorCtx) -> None:
        """Cancel ``actor``'s statement if it waits for a lock a session of this run holds.

        Every other actor is parked, so that lock stays held: the wait would never end.
        Sessions of other databases (another test's commit holding the NOTIFY lock) end
        their waits by themselves. Cancelled, the statement fails with 57014.
        """
        if actor.backend_id is None:
            return
        if self._watch is None:
            self._watch = self.admin.connect()
        cancelled = self._watch.execute(_CANCEL_IF_PARKED, {"pid": actor.backend_id}).first()
        if cancelled is not None and cancelled[0]:
            actor.wait_cancelled = True

    def stop(self) -> None:
        """Let every actor run to its next sleep and exit (they see ``Stopped``)."""
        self.stopping = True
        for _ in range(100_000):
            live = [a for a in self.actors if a.state != "done"]
            if not live:
                break
            for a in live:
                if a.state in ("time", "stmt"):
                    self.step += 1
                    self._grant(a)
        for a in self.actors:
            a.thread.join(timeout=self.watchdog)
            a.dispose_engines()

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self.admin.dispose()


class _Pipelines:
    """readyq's pipeline observer for one actor: a pipeline is one scheduling step.

    Its statements leave together and the actor keeps the baton until the results are
    back, so the database runs them with no other actor's statement in between (a lock
    wait on a parked actor fails, as any statement's does). A pipeline on a connection in
    autocommit is a whole transaction (readyq.dialects.PipelineObserver): the COMMIT
    faults strike before it is sent, where the client can still stall or lose its
    session; and it cannot hang halfway (no client step is left inside it), so an armed
    ``hang_in_txn`` goes unused.
    """

    def __init__(self, ctx: ActorCtx) -> None:
        self.ctx = ctx
        #: Between :meth:`Driver.pipeline_sent` and :meth:`Driver.pipeline_back`.
        self.in_flight = False

    def before(
        self, conn: Connection, statements: Sequence[str], params: Sequence[Mapping[str, Any]]
    ) -> None:
        ctx = self.ctx
        if ctx.crashed:
            return
        # In autocommit the pipeline is a transaction of its own, BEGIN and COMMIT or not.
        commits = bool(conn.connection.driver_connection.autocommit)  # type: ignore[union-attr]
        if commits and ctx.slow_commit_s is not None:
            held, ctx.slow_commit_s = ctx.slow_commit_s, None
            ctx.driver.record(ctx.name, "SLOW", f"pipeline held {held:g}s")
            ctx.sleep(held)  # unlike a held COMMIT, no lock is held yet
        ctx._before(conn, ";\n".join(statements), list(params))  # may crash: nothing sent
        if not commits:
            return
        if ctx.drop_at_commit:
            ctx.drop_at_commit = False
            if not ctx.txn_killed:
                ctx.driver.kill(ctx, conn)  # the pipeline meets a dead session: no commit
            ctx.driver.record(ctx.name, "DROP", "before pipelined commit")
            return
        ctx.commit_step = ctx.driver.pipeline_sent(ctx)
        ctx.committed_in_pipeline = self.in_flight = True

    def _back(self) -> None:
        if self.in_flight:  # first, whatever else happened: the position is settled here
            self.in_flight = False
            ctx = self.ctx
            assert ctx.commit_step is not None
            ctx.commit_step = ctx.driver.pipeline_back(ctx, ctx.commit_step)

    def after(self, conn: Connection, statements: Sequence[str], rowcounts: list[int]) -> None:
        self._back()
        ctx = self.ctx
        if ctx.crashed:
            return
        sql = ";\n".join(statements)
        ctx.driver.record(ctx.name, sql, f"{rowcounts}")
        if ctx.committed_in_pipeline:
            ctx.committed = True
        else:
            ctx._after(conn, sql)  # its transaction is still open: it may hang here

    def failed(self, conn: Connection, statements: Sequence[str], exc: BaseException) -> None:
        self._back()
        if not self.ctx.crashed:
            self.ctx.driver.failed(self.ctx, ";\n".join(statements), None, exc)


#: Cancels the statement of session ``pid`` if it waits for a lock that a session of this
#: run's database holds (the admin connection is on that database).
_CANCEL_IF_PARKED = sa.text(
    "SELECT pg_cancel_backend(:pid) WHERE EXISTS (SELECT 1 FROM pg_stat_activity AS b "
    "WHERE b.pid = ANY (pg_blocking_pids(:pid)) AND b.datname = current_database())"
)


def _params(params: Any) -> str:
    """``params`` as recorded: keys sorted, as SQLAlchemy's order of many-row insert keys
    follows set order, which differs between processes (``PYTHONHASHSEED``)."""
    return repr(_sorted_keys(params))[:2000]


def _sorted_keys(params: Any) -> Any:
    if isinstance(params, Mapping):
        return {k: params[k] for k in sorted(params, key=str)}
    if isinstance(params, (list, tuple)):
        return [_sorted_keys(p) for p in params]
    return params


def _kind_of(statement: str | None) -> str:
    return (statement or "?").split(None, 1)[0].upper() if statement else "?"


def _admin_engine(url: str) -> Engine:
    eng = sa.create_engine(url, poolclass=NullPool)
    if backend_kind(url) == "postgresql":
        return eng.execution_options(isolation_level="AUTOCOMMIT")
    return eng
