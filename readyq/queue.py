"""The Queue: readyq's storage API over one SQLAlchemy engine."""

from __future__ import annotations

import datetime as _dt
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from . import _claim, _dag, _scan, _store, dialects
from ._scan import GroupStats
from .clock import Clock, SystemClock, from_us
from .errors import InvalidJob, LeaseLost, SchemaNotInstalled, UnknownJob
from .graph import DEFAULT_MAX_ATTEMPTS, Graph, Ref
from .job import TERMINAL, JobInfo, JobState, Lease, Outcome, decode_payload, encode_payload
from .retry import Backoff
from .schema import deps, jobs, metadata

__all__ = ["Queue"]

log = logging.getLogger("readyq")

R = TypeVar("R")
c = jobs.c
# Jobs still to run (a waiting container is not: its open children are). The state
# leads the claim index, so a probe for one reads index entries of these states only.
_OPEN = tuple(s.value for s in JobState if s not in TERMINAL and s is not JobState.WAITING)
#: Transactions rerun after a deadlock, serialization failure or busy database.
_RETRIES = 8


def _claim_args(
    worker_id: str, ttl: float, limit: int, groups: Sequence[str] | None
) -> tuple[list[str] | None, int]:
    """A claim's arguments checked: (groups as a list or None, ttl in microseconds)."""
    if not isinstance(worker_id, str) or not worker_id:
        raise InvalidJob("worker_id must be a non-empty string")
    _check_limit(limit)
    if groups is not None:
        if isinstance(groups, str) or not all(isinstance(g, str) for g in groups):
            raise InvalidJob("groups must be a list of group names")
        groups = list(groups)
    return groups, _ttl_us(ttl)


def _check_limit(limit: object, what: str = "limit") -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidJob(f"{what} must be a positive int, not {limit!r:.60}")


def _ttl_us(ttl: float, what: str = "ttl") -> int:
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl < 1e7:
        raise InvalidJob(f"{what} must be a positive number of seconds, not {ttl!r}")
    return round(ttl * 1e6)


class Queue:
    """Jobs and their DAG in one database; every operation is one transaction.

    ``url_or_engine`` is a SQLAlchemy URL (readyq creates the engine) or an Engine. Time
    comes from ``clock`` (default: the system's UTC clock).
    """

    def __init__(
        self,
        url_or_engine: str | sa.URL | Engine,
        clock: Clock | None = None,
        *,
        backoff: Backoff | None = None,
        channel: str = "readyq",
    ) -> None:
        if isinstance(url_or_engine, Engine):
            self._given, self._owned = url_or_engine, False
        elif isinstance(url_or_engine, (str, sa.URL)):
            self._given, self._owned = dialects.create_engine(url_or_engine), True
        else:
            raise InvalidJob("Queue() takes a database URL or a SQLAlchemy Engine")
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.backoff = backoff if backoff is not None else Backoff()
        #: LISTEN/NOTIFY channel (where the database has one) that wakes workers.
        self.channel = channel
        self._adapter: dialects.Adapter | None = None
        self._engine: Engine | None = None

    # -- plumbing ---------------------------------------------------------------------

    @property
    def adapter(self) -> dialects.Adapter:
        """The database adapter (connects once to check the server version)."""
        if self._adapter is None:
            self._adapter = dialects.for_engine(self._given)
            self._engine = self._adapter.prepare_engine(self._given, owned=self._owned)
        return self._adapter

    @property
    def engine(self) -> Engine:
        """The engine readyq's transactions run on."""
        self.adapter  # noqa: B018 -- resolves the adapter and the prepared engine
        assert self._engine is not None
        return self._engine

    def close(self) -> None:
        """Dispose of the engine if readyq created it."""
        if self._owned:
            self._given.dispose()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<readyq.Queue {self._given.url.render_as_string(hide_password=True)}>"

    def _write(
        self,
        fn: Callable[[Connection, dialects.Adapter, int], R],
        *,
        notify: Callable[[R], bool] | bool = False,
        autocommit: bool = False,
    ) -> R:
        """Run ``fn(conn, adapter, now)`` in one write transaction, retried on conflicts.

        ``notify`` (or a predicate of the result) wakes listening workers at commit.
        ``autocommit``: ``fn`` runs one statement, which commits by itself.
        """
        ad = self.adapter
        options = {"isolation_level": "AUTOCOMMIT"} if autocommit else {}
        for attempt in range(_RETRIES):
            try:
                with self.engine.connect().execution_options(**options) as conn, conn.begin():
                    ad.begin_write(conn)
                    result = fn(conn, ad, self.clock.now_us())
                    if notify if isinstance(notify, bool) else notify(result):
                        ad.notify(conn, self.channel)
                    return result
            except sa.exc.IntegrityError:
                # Two enqueues with one idempotency key: the rerun finds the winner's row.
                if attempt == _RETRIES - 1:
                    raise
            except sa.exc.DBAPIError as exc:
                self._raise_if_missing(exc)
                if not ad.is_retryable(exc) or attempt == _RETRIES - 1:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _read(self, fn: Callable[[Connection, int], R]) -> R:
        options = {"isolation_level": "AUTOCOMMIT"} if self.adapter.read_autocommit else {}
        try:
            with self.engine.connect().execution_options(**options) as conn:
                return fn(conn, self.clock.now_us())
        except sa.exc.DBAPIError as exc:
            self._raise_if_missing(exc)
            raise

    def _raise_if_missing(self, exc: sa.exc.DBAPIError) -> None:
        if self.adapter.is_missing_table(exc):
            raise SchemaNotInstalled(
                "readyq's tables do not exist in this database: run Queue.install() "
                "or `readyq install --url ...` first"
            ) from exc

    # -- schema -----------------------------------------------------------------------

    def install(self) -> None:
        """Create the tables and indexes if missing (idempotent, safe to call often)."""
        try:
            metadata.create_all(self.engine, checkfirst=True)
        except sa.exc.DBAPIError:
            # Another process created them between the check and our CREATE.
            if not sa.inspect(self.engine).has_table(jobs.name):
                raise
        self.adapter.after_install(self.engine)

    # -- enqueue ----------------------------------------------------------------------

    def graph(self) -> Graph:
        """Start an all-or-nothing DAG insert: ``with q.graph() as g: g.add(...)``."""
        return Graph(self)

    def enqueue(
        self,
        type: str,
        args: dict[str, Any] | None = None,
        *,
        group: str = "default",
        weight: float = 1,
        priority: int = 0,
        after: Iterable[Ref] = (),
        parent: Ref | None = None,
        run_after: _dt.datetime | _dt.timedelta | None = None,
        key: str | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        container: bool = False,
    ) -> int:
        """Insert one job and return its id (the existing id if ``key`` is taken).

        ``priority``: lower runs first. ``after``: jobs that must be done first.
        ``parent``: a container (enqueued with ``container=True``) this job belongs to.
        ``timeout``: seconds a run may take, heartbeats or not (hang timeout).
        """
        g = Graph(self)
        g.add(
            type,
            args,
            group=group,
            weight=weight,
            priority=priority,
            after=after,
            parent=parent,
            run_after=run_after,
            key=key,
            max_attempts=max_attempts,
            timeout=timeout,
            container=container,
        )
        return g.commit()[0]

    # -- reading ----------------------------------------------------------------------

    def get(self, job_id: int) -> JobInfo:
        """A snapshot of one job; UnknownJob if there is none."""
        job_id = _job_id(job_id)

        def read(conn: Connection, now: int) -> JobInfo:
            row = conn.execute(sa.select(jobs).where(c.id == job_id)).first()
            if row is None:
                raise UnknownJob(f"job {job_id} does not exist", job_id)
            on = conn.execute(
                sa.select(deps.c.depends_on)
                .where(deps.c.job_id == job_id)
                .order_by(deps.c.depends_on)
            ).scalars()
            return _info(row, tuple(on))

        return self._read(read)

    def counts(self) -> dict[str, int]:
        """Jobs per state (every state present, zeros included)."""

        def read(conn: Connection, now: int) -> dict[str, int]:
            rows = conn.execute(sa.select(c.state, sa.func.count()).group_by(c.state))
            out = dict.fromkeys((s.value for s in JobState), 0)
            out.update({r[0]: r[1] for r in rows})
            return out

        return self._read(read)

    def has_open_jobs(self) -> bool:
        """Whether some job is ready (due or not), running or blocked: what a worker
        running ``until_idle`` waits for. One indexed probe, unlike :meth:`counts`, which
        reads every row."""

        def read(conn: Connection, now: int) -> bool:
            probe = sa.select(c.id).where(c.state.in_(_OPEN)).limit(1)
            return conn.execute(probe).first() is not None

        return self._read(read)

    def prune(self, older_than: _dt.timedelta, *, batch: int = 1000) -> int:
        """Delete jobs that finished more than ``older_than`` ago (retention).

        Jobs still needed (a container's unfinished children, an open dependent's
        dependency) are kept. Returns how many were deleted.
        """
        if not isinstance(older_than, _dt.timedelta) or older_than < _dt.timedelta(0):
            raise InvalidJob("older_than must be a non-negative timedelta")
        cut = round(older_than.total_seconds() * 1e6)
        total = 0
        for state in sorted(TERMINAL):
            cursor: _store.PruneCursor | None = (-1, 0)  # before any finished_us
            while cursor is not None:

                def step(
                    conn: Connection,
                    ad: object,
                    now: int,
                    state: JobState = state,
                    after: _store.PruneCursor = cursor,
                ) -> tuple[int, _store.PruneCursor | None]:
                    return _store.prune(
                        conn, state=state, before=now - cut, batch=batch, after=after
                    )

                n, cursor = self._write(step)
                total += n
        return total

    def list_jobs(self, *, state: str | None = None, limit: int = 100) -> list[JobInfo]:
        """The most recent jobs (optionally of one state), newest first."""
        _check_limit(limit)
        if state is not None and state not in {s.value for s in JobState}:
            raise InvalidJob(f"unknown state {state!r}; one of {[s.value for s in JobState]}")

        def read(conn: Connection, now: int) -> list[JobInfo]:
            stmt = sa.select(jobs).order_by(c.id.desc()).limit(limit)
            if state is not None:
                stmt = stmt.where(c.state == state)
            return [_info(row, ()) for row in conn.execute(stmt)]

        return self._read(read)

    def stats(self) -> dict[str, Any]:
        """Counts per state and group, the oldest ready job, running jobs per worker."""

        def read(conn: Connection, now: int) -> dict[str, Any]:
            oldest = conn.execute(
                sa.select(sa.func.min(c.run_after_us)).where(c.state == JobState.READY)
            ).scalar()
            owners = conn.execute(
                sa.select(c.lease_owner, sa.func.count())
                .where(c.state == JobState.RUNNING)
                .group_by(c.lease_owner)
                .order_by(c.lease_owner)
            ).all()
            return {
                "groups": [vars(g) for g in _scan.scan(conn, self.adapter, now=now)],
                "oldest_ready": from_us(oldest),
                "running_per_worker": {row[0]: row[1] for row in owners},
            }

        out = self._read(read)
        return {"counts": self.counts(), **out}

    def scan(self, *, limit: int | None = None) -> list[GroupStats]:
        """Per group: jobs ready now, jobs running (any worker), and the group's weight.

        ``limit``: count at most that many ready jobs per group, and take the weight from
        the running jobs and those (the group's first ``limit`` in claim order). It reads
        about ``limit`` rows per group however long the backlog; with ``limit`` = the free
        slots, :func:`~readyq.fair_share` ranks exactly as with full counts. Without it,
        every ready row is counted.
        """
        if limit is not None:
            _check_limit(limit, "scan limit")
        return self._read(lambda conn, now: _scan.scan(conn, self.adapter, now=now, limit=limit))

    # -- operator actions -------------------------------------------------------------

    def cancel(self, job_id: int) -> bool:
        """Cancel a job, its dependents and (for a container) its contents.

        A running job's lease is retired: its worker's next write gets LeaseLost.
        Returns False if the job had already finished.
        """
        job_id = _job_id(job_id)
        return self._write(lambda conn, ad, now: _dag.cancel(conn, ad, job_id, now=now))

    def retry(self, job_id: int) -> bool:
        """Run a failed or cancelled job again, with everything its failure cancelled.

        Attempts start over. Returns False if the job is not failed or cancelled.
        """
        job_id = _job_id(job_id)
        return self._write(lambda conn, ad, now: _dag.retry(conn, ad, job_id, now=now), notify=bool)

    # -- leases -----------------------------------------------------------------------

    def claim(
        self,
        worker_id: str,
        *,
        ttl: float = 30.0,
        limit: int = 1,
        groups: Sequence[str] | None = None,
    ) -> list[Lease]:
        """Lease up to ``limit`` ready jobs atomically; concurrent claimers never collide.

        ``groups``: a ranked list of group names (repeats ask for several jobs of that
        group); jobs come in that order, groups without ready jobs fall through, and
        leftover slots go to groups that had more. Without it: priority, then age.
        """
        groups, ttl_us = _claim_args(worker_id, ttl, limit, groups)
        if groups == []:
            return []
        if _claim.claim_autocommits(self.adapter, groups, limit):
            # One self-guarding statement that commits by itself; a ranked claim's second
            # pass, if it has one, after it (as after a finalize: :meth:`_top_up`).
            leases, more = self._write(
                lambda conn, ad, now: _claim.first_pass(
                    conn,
                    ad,
                    worker_id=worker_id,
                    now=now,
                    ttl_us=ttl_us,
                    limit=limit,
                    groups=groups,
                ),
                autocommit=True,
            )
            return leases if more is None else leases + self._top_up(more, worker_id, ttl_us)
        return self._write(
            lambda conn, ad, now: _claim.claim(
                conn, ad, worker_id=worker_id, now=now, ttl_us=ttl_us, limit=limit, groups=groups
            )
        )

    def heartbeat(self, lease: Lease, *, ttl: float = 30.0) -> int:
        """Extend a lease by ``ttl`` from now; LeaseLost if it is no longer held.

        Returns the new expiry (epoch microseconds).
        """
        ttl_us = _ttl_us(ttl)
        return self._write(
            lambda conn, ad, now: _store.heartbeat(conn, _lease(lease), now=now, ttl_us=ttl_us)
        )

    def finalize(self, lease: Lease, result: dict[str, Any] | None = None) -> Outcome:
        """Record the result and mark the job done, in one transaction with its effects.

        LeaseLost if the lease is stale. Retried with the same lease after an unknown
        outcome (e.g. a dropped connection), it returns the recorded outcome.
        """
        text = encode_payload({} if result is None else result, "result")
        ((outcome,), _) = self._settle([(_lease(lease), text)], None)
        if isinstance(outcome, LeaseLost):
            raise outcome
        return outcome

    def finalize_many(
        self, results: Iterable[tuple[Lease, dict[str, Any] | None]]
    ) -> list[Outcome | LeaseLost]:
        """Finalize several leases in one transaction: one commit for all of them.

        Each job is still all-or-nothing (its result, its state and its dependents'
        promotion together), and independent of the others: a stale lease does not stop
        the rest, its slot in the returned list holds the LeaseLost (not raised), in the
        order given. If the transaction itself fails (a lost connection, a database
        error), the exception is raised and none of them may be recorded: call again with
        the same leases, those that did commit come back ``replayed``. A dependent's
        promotion is counted once, in the first outcome's ``dependents``.
        """
        items = self._results(results, "finalize_many")
        if not items:
            return []
        return self._settle(items, None)[0]

    def finalize_and_claim(
        self,
        results: Iterable[tuple[Lease, dict[str, Any] | None]],
        worker_id: str,
        *,
        ttl: float = 30.0,
        limit: int = 1,
        groups: Sequence[str] | None = None,
    ) -> tuple[list[Outcome | LeaseLost], list[Lease]]:
        """:meth:`finalize_many` then :meth:`claim`, in one transaction: a worker loop's
        next leases come with the commit of its last results (one commit, not two).

        All or nothing: if the transaction fails, no result is recorded and nothing is
        leased; call again with the same leases (those recorded come back ``replayed``).
        The claim sees the dependents this finalize just promoted.
        """
        items = self._results(results, "finalize_and_claim")
        return self._finalize_encoded_and_claim(items, worker_id, ttl, limit, groups)

    def _finalize_encoded_and_claim(
        self,
        items: list[tuple[Lease, str]],
        worker_id: str,
        ttl: float,
        limit: int,
        groups: Sequence[str] | None,
    ) -> tuple[list[Outcome | LeaseLost], list[Lease]]:
        """:meth:`finalize_and_claim` of results already checked and encoded, each job
        once (internal: a Worker encodes each result in its handler's thread)."""
        claim_groups, ttl_us = _claim_args(worker_id, ttl, limit, groups)
        if claim_groups == []:
            return (self._settle(items, None)[0] if items else []), []
        return self._settle(items, (worker_id, ttl_us, limit, claim_groups))

    def _top_up(self, more: _claim.TopUp, worker_id: str, ttl_us: int) -> list[Lease]:
        """The second pass of a ranked claim that committed with its finalize: slots the
        first left free, offered to the groups that were full, in ranked order. Its own
        claims: if it fails, the results and the leases already taken stand, and the error
        is logged (raising would strand those leases until their TTL).

        Where a claim may commit by itself, each group's claim does: one round trip with
        its kept plan, where a transaction of its own cost BEGIN, a plan and COMMIT. The
        leases of the groups before a failed one stand too."""
        if not _claim.claim_autocommits(self.adapter, more.groups[:1], more.slots):
            return self._top_up_part(more, worker_id, ttl_us, autocommit=False) or []
        leases: list[Lease] = []
        for group in more.groups:
            left = more.slots - len(leases)
            if left <= 0:
                break
            got = self._top_up_part(_claim.TopUp([group], left), worker_id, ttl_us, autocommit=True)
            if got is None:
                break
            leases += got
        return leases

    def _top_up_part(
        self, more: _claim.TopUp, worker_id: str, ttl_us: int, *, autocommit: bool
    ) -> list[Lease] | None:
        """:func:`_claim.top_up` in a write of its own; None (logged) if it failed."""
        try:
            return self._write(
                lambda conn, ad, now: _claim.top_up(
                    conn, ad, more, worker_id=worker_id, now=now, ttl_us=ttl_us
                ),
                autocommit=autocommit,
            )
        except sa.exc.DBAPIError as exc:
            log.warning("claim top-up failed, %d slots left free this round: %r", more.slots, exc)
            return None

    def _settle(
        self,
        items: list[tuple[Lease, str]],
        claim: tuple[str, int, int, list[str] | None] | None,
    ) -> tuple[list[Outcome | LeaseLost], list[Lease]]:
        """Finalize ``items`` and, with ``claim`` = (worker_id, ttl_us, limit, groups),
        claim: one transaction, sent in one round trip where the adapter can."""

        def promoted(r: tuple[Any, ...] | None) -> bool:
            """Whether some result promoted dependents (``r[0]``: the outcomes)."""
            return r is not None and any(isinstance(o, Outcome) and o.dependents for o in r[0])

        groups = None if claim is None else claim[3]
        limit = 1 if claim is None else claim[2]
        at_once = _store.commits_at_once(
            self.adapter, self.engine, claims=bool(claim), groups=groups, limit=limit
        )
        if items and at_once:
            got = self._write(
                lambda conn, ad, now: _store.finalize_at_once(
                    conn, ad, items, now=now, claim=claim
                ),
                autocommit=True,
                notify=promoted,
            )
            if got is not None:
                out, leases, more = got
                if more is not None and claim is not None:
                    leases += self._top_up(more, claim[0], claim[1])
                return out, leases

        def run(
            conn: Connection, ad: dialects.Adapter, now: int
        ) -> tuple[list[Outcome | LeaseLost], list[Lease]]:
            if claim is None:
                return _store.finalize_many(conn, ad, items, now=now), []
            worker_id, ttl_us, limit, groups = claim
            return _store.finalize_and_claim(
                conn,
                ad,
                items,
                worker_id=worker_id,
                now=now,
                ttl_us=ttl_us,
                limit=limit,
                groups=groups,
            )

        return self._write(run, notify=promoted)

    @staticmethod
    def _results(
        results: Iterable[tuple[Lease, dict[str, Any] | None]], what: str
    ) -> list[tuple[Lease, str]]:
        """(lease, result) pairs checked and encoded, each job once."""
        items: list[tuple[Lease, str]] = []
        for pair in results:
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidJob(f"{what}() takes (lease, result) pairs")
            result = {} if pair[1] is None else pair[1]
            items.append((_lease(pair[0]), encode_payload(result, "result")))
        if len({lease.job_id for lease, _ in items}) != len(items):
            raise InvalidJob(f"{what}() got the same job twice; give each lease once")
        return items

    def fail(self, lease: Lease, error: str | BaseException, *, retry: bool = True) -> Outcome:
        """Record a failed attempt: retried after a backoff while attempts remain, else failed."""
        lease = _lease(lease)
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        again = retry and lease.attempt < lease.max_attempts
        delay_us = round(self.backoff.delay(lease.attempt, lease.job_id) * 1e6)
        return self._write(
            lambda conn, ad, now: _store.fail(
                conn, ad, lease, text, now=now, retry_at=now + delay_us if again else None
            )
        )

    def release(self, lease: Lease) -> Outcome:
        """Hand a job back unfinished (graceful shutdown); the attempt does not count."""
        return self._write(
            lambda conn, ad, now: _store.release(conn, _lease(lease), now=now), notify=True
        )

    def reclaim(self, *, batch: int = 500) -> int:
        """Expired leases back to ready, hung jobs timed out; returns how many."""
        return self.sweep(batch=batch).total

    def sweep(self, *, batch: int = 500) -> _store.ReclaimCounts:
        """Like :meth:`reclaim`, with the counts by kind."""
        total = _store.ReclaimCounts()
        while True:
            got = self._write(
                lambda conn, ad, now: _store.reclaim(conn, ad, now=now, batch=batch),
                notify=lambda counts: counts.total > 0,
            )
            total = _store.ReclaimCounts(
                total.expired + got.expired,
                total.timed_out + got.timed_out,
                total.failed + got.failed,
            )
            if got.total < batch:
                return total


def _job_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InvalidJob(f"a job id is a positive int, not {value!r:.60}")
    return value


def _lease(value: object) -> Lease:
    if not isinstance(value, Lease):
        raise InvalidJob(f"expected a readyq.Lease from claim(), not {type(value).__name__}")
    return value


def _info(row: Any, depends_on: tuple[int, ...]) -> JobInfo:
    run_after = from_us(row.run_after_us)
    created = from_us(row.created_us)
    assert run_after is not None
    assert created is not None
    return JobInfo(
        id=row.id,
        type=row.type,
        args=decode_payload(row.args) or {},
        result=decode_payload(row.result),
        state=JobState(row.state),
        group=row.group_key,
        weight=row.weight,
        priority=row.priority,
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        error=row.error,
        parent=row.parent_id,
        key=row.key,
        timeout=None if row.timeout_us is None else row.timeout_us / 1e6,
        container=bool(row.container),
        pending_deps=row.pending_deps,
        lease_owner=row.lease_owner,
        lease_token=row.lease_token,
        lease_expires_at=from_us(row.lease_expires_us),
        run_after=run_after,
        created_at=created,
        started_at=from_us(row.started_us),
        finished_at=from_us(row.finished_us),
        depends_on=depends_on,
    )
