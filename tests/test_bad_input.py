"""Bad input and misuse: every wrong thing a user can pass gets a readyq error or a failed job.

Each case asserts three things: the exception is a :class:`readyq.ReadyqError` (or the job
fails with the reason), its message says what was wrong, and the queue's other jobs are
untouched (the table is compared before and after). Cases marked ``xfail(strict=True)`` are
readyq bugs found here: the lead removes the mark with the fix.

The grep for string-built SQL lives in tests/test_boundaries.py; here: error truncation,
JSON-only payloads (nothing is ever pickled), and passwords never printed by the CLI.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import readyq
from readyq import (
    Budget,
    Concurrency,
    CycleError,
    InvalidJob,
    JobState,
    RateLimit,
    ReadyqError,
    SchemaNotInstalled,
    UnknownJob,
    UnsupportedDatabase,
    Worker,
)
from readyq.dialects import MariaDBAdapter, MySQLAdapter, PostgreSQLAdapter, SQLiteAdapter
from readyq.job import MAX_ERROR_CHARS, MAX_PAYLOAD_BYTES, encode_payload
from readyq.schema import jobs

ROOT = Path(__file__).resolve().parent.parent
S = JobState
FIXTURE_OK = settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)


def bug(reason: str) -> pytest.MarkDecorator:
    return pytest.mark.xfail(
        strict=True, raises=(AssertionError, pytest.fail.Exception), reason=f"readyq bug: {reason}"
    )


def snapshot(q: readyq.Queue) -> list[tuple[Any, ...]]:
    """Every job row, every column: 'the other jobs are untouched' means this is equal."""
    with q.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(jobs).order_by(jobs.c.id))]


@pytest.fixture
def seeded(queue: readyq.Queue) -> readyq.Queue:
    """A queue that already holds other jobs in several states (ready, blocked, running)."""
    with queue.graph() as g:
        a = g.add("seed", {"n": 1}, group="other")
        g.add("seed", {"n": 2}, after=[a], group="other")
        box = g.add("seed-box", container=True, group="other")
        g.add("seed", {"n": 3}, parent=box, group="other", key="seed-key")
    queue.claim("seed-worker", groups=["other"], ttl=300)
    return queue


def refused(
    q: readyq.Queue,
    call: Callable[[], object],
    match: str,
    kind: type[BaseException] = ReadyqError,
) -> None:
    """``call`` raises a readyq error matching ``match`` and changes no row."""
    before = snapshot(q)
    exc = raised(call)
    assert isinstance(exc, kind), f"{type(exc).__name__}: {exc}"
    assert re.search(match, str(exc)), f"message {str(exc)!r} does not say {match!r}"
    assert snapshot(q) == before


def raised(call: Callable[[], object]) -> ReadyqError:
    """The readyq error ``call`` raises; any other exception (or none) fails the test."""
    with pytest.raises(Exception) as info:  # noqa: PT011 -- the type is the assertion
        call()
    exc = info.value
    assert isinstance(exc, ReadyqError), f"not a readyq error: {type(exc).__name__}: {exc}"
    return exc


class Reducer:
    """Unpicklable by contract: pickling it would run code (and flag that it did)."""

    reduced = False

    def __reduce__(self) -> Any:
        Reducer.reduced = True
        return (print, ("pickled!",))


def deep(n: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(n):
        value = {"x": value}
    return value


# -- enqueue: every parameter ---------------------------------------------------------------

ENQUEUE_CASES: list[tuple[dict[str, Any], str]] = [
    # args: JSON objects only
    ({"args": {"s": {1, 2}}}, "set"),
    ({"args": {"b": b"bytes"}}, "bytes"),
    ({"args": {"f": math.nan}}, "nan"),
    ({"args": {"f": math.inf}}, "inf"),
    ({"args": {"o": object()}}, "object"),
    ({"args": {"c": 1j}}, "complex"),
    ({"args": {"d": dt.datetime(2024, 1, 1)}}, "datetime"),
    ({"args": {1: "int key"}}, "non-string key"),
    ({"args": [1, 2]}, "must be a dict"),
    ({"args": "text"}, "must be a dict"),
    ({"args": deep(100)}, "nested deeper"),
    ({"args": {"big": "x" * (MAX_PAYLOAD_BYTES + 1)}}, "more than"),
    ({"args": {"r": Reducer()}}, "Reducer"),
    # type and group
    ({"type": ""}, "type"),
    ({"type": "   "}, "type"),
    ({"type": None}, "type"),
    ({"type": 7}, "type"),
    ({"type": "t" * 201}, "longer than"),
    ({"group": ""}, "group"),
    ({"group": None}, "group"),
    ({"group": ["a"]}, "group"),
    # weight, priority, attempts, timeout
    ({"weight": 0}, "weight"),
    ({"weight": -1}, "weight"),
    ({"weight": math.nan}, "weight"),
    ({"weight": math.inf}, "weight"),
    ({"weight": "2"}, "weight"),
    ({"weight": True}, "weight"),
    ({"weight": None}, "weight"),
    ({"priority": 1.5}, "priority"),
    ({"priority": "1"}, "priority"),
    ({"priority": True}, "priority"),
    ({"priority": 2**31}, "priority"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": -3}, "max_attempts"),
    ({"max_attempts": 1001}, "max_attempts"),
    ({"max_attempts": 2.0}, "max_attempts"),
    ({"max_attempts": None}, "max_attempts"),
    ({"timeout": 0}, "timeout"),
    ({"timeout": -5}, "timeout"),
    ({"timeout": math.nan}, "timeout"),
    ({"timeout": math.inf}, "timeout"),
    ({"timeout": "5"}, "timeout"),
    ({"timeout": True}, "timeout"),
    # graph edges
    ({"after": "abc"}, "after"),
    ({"after": 5}, "after"),
    ({"after": [0]}, "after"),
    ({"after": [-1]}, "after"),
    ({"after": [True]}, "after"),
    ({"after": ["1"]}, "after"),
    ({"after": [1.0]}, "after"),
    ({"parent": 0}, "parent"),
    ({"parent": "1"}, "parent"),
    ({"parent": -2}, "parent"),
    # scheduling, keys, containers
    ({"run_after": dt.datetime(2030, 1, 1)}, "timezone-aware"),
    ({"run_after": 5}, "run_after"),
    ({"run_after": "tomorrow"}, "run_after"),
    ({"key": ""}, "key"),
    ({"key": 5}, "key"),
    ({"key": "k" * 256}, "key"),
    ({"container": 1}, "container"),
    ({"container": "yes"}, "container"),
]


ENQUEUE_BUGS: list[Any] = [
    pytest.param(
        {"args": {"s": "\ud800"}},
        "surrogate|unicode|UTF",
        id="args-lone-surrogate",
    ),
    pytest.param(
        {"args": {"n": 10**5000}},
        "digits|int",
        id="args-huge-int",
    ),
]


def each_case(cases: list[tuple[dict[str, Any], str]], check: Callable[..., None]) -> None:
    """Run every case on one fixture (setting up a database per case costs seconds on
    servers); report every failing case at once, named by its arguments."""
    failures = []
    for kwargs, match in cases:
        try:
            check(kwargs, match)
        except (AssertionError, pytest.fail.Exception) as exc:
            failures.append(f"{kwargs!r:.80}: {exc}")
    assert failures == []


def _enqueue_refused(q: readyq.Queue, kwargs: dict[str, Any], match: str) -> None:
    call = {"type": "t", **kwargs}
    kind = call.pop("type")
    refused(q, lambda: q.enqueue(kind, **call), match, InvalidJob)
    Reducer.reduced = False


@pytest.mark.backend
def test_enqueue_refuses_bad_arguments(seeded: readyq.Queue) -> None:
    """Each bad enqueue argument (table above): InvalidJob naming the problem; nothing written."""
    each_case(ENQUEUE_CASES, lambda kwargs, match: _enqueue_refused(seeded, kwargs, match))


@pytest.mark.backend
@pytest.mark.parametrize(("kwargs", "match"), ENQUEUE_BUGS)
def test_enqueue_refuses_bad_arguments_known_bugs(
    seeded: readyq.Queue, kwargs: dict[str, Any], match: str
) -> None:
    _enqueue_refused(seeded, kwargs, match)


def test_payloads_are_never_pickled() -> None:
    """An object whose __reduce__ would run code is refused without being pickled."""
    Reducer.reduced = False
    with pytest.raises(InvalidJob, match="Reducer"):
        encode_payload({"evil": Reducer()}, "args")
    with pytest.raises(InvalidJob, match="must be a dict"):
        encode_payload(Reducer(), "args")  # type: ignore[arg-type]
    assert Reducer.reduced is False
    core = "\n".join(p.read_text() for p in (ROOT / "readyq").rglob("*.py"))
    assert not re.search(r"^\s*(import|from)\s+(pickle|cPickle|marshal|shelve|dill)\b", core, re.M)


@pytest.mark.backend
def test_references_to_missing_or_finished_jobs_are_refused(seeded: readyq.Queue) -> None:
    """after= a missing, failed or cancelled job; parent= a missing or plain job."""
    gone = seeded.enqueue("doomed")
    seeded.cancel(gone)
    plain = seeded.enqueue("plain")
    with seeded.graph() as g:
        handle = g.add("box", container=True)
        g.add("child", parent=handle)
    box = handle.id
    for lease in seeded.claim("w", limit=5, groups=["default"]):
        if lease.type == "child":
            seeded.finalize(lease)  # the container rolled up: done, no more children
    refused(seeded, lambda: seeded.enqueue("t", after=[10**9]), "does not exist", UnknownJob)
    refused(seeded, lambda: seeded.enqueue("t", after=[gone]), "cancelled", InvalidJob)
    refused(seeded, lambda: seeded.enqueue("t", parent=10**9), "does not exist", UnknownJob)
    refused(seeded, lambda: seeded.enqueue("t", parent=plain), "not a container", InvalidJob)
    refused(seeded, lambda: seeded.enqueue("t", parent=box), "already done", InvalidJob)
    refused(seeded, lambda: seeded.enqueue("box2", container=True, after=[plain]), "container")


@pytest.mark.backend
def test_cycles_through_graph_are_refused(seeded: readyq.Queue) -> None:
    """Cycles (self, two jobs, three jobs, a child waiting on its container): CycleError."""

    def cycle(build: Callable[[readyq.Graph], None]) -> Callable[[], None]:
        def run() -> None:
            with seeded.graph() as g:
                build(g)

        return run

    def self_loop(g: readyq.Graph) -> None:
        a = g.add("a")
        g.depends(a, a)

    def two(g: readyq.Graph) -> None:
        a = g.add("a")
        b = g.add("b", after=[a])
        g.depends(a, b)

    def three(g: readyq.Graph) -> None:
        a = g.add("a")
        b = g.add("b", after=[a])
        c = g.add("c", after=[b])
        g.depends(a, c)

    def child_waits_for_box(g: readyq.Graph) -> None:
        box = g.add("box", container=True)
        g.add("child", after=[box], parent=box)

    for build in (self_loop, two, three, child_waits_for_box):
        refused(seeded, cycle(build), "wait for each other|contains it", CycleError)


@pytest.mark.backend
def test_graph_misuse_is_refused(seeded: readyq.Queue) -> None:
    """Handles of an uncommitted graph elsewhere, adding after commit, foreign handles."""
    g1 = seeded.graph()
    h = g1.add("a")
    g2 = seeded.graph()
    refused(seeded, lambda: g2.add("b", after=[h]), "only after its graph has committed")
    refused(seeded, lambda: g2.depends(h, 1), "handle returned by this graph")
    g1.commit()
    refused(seeded, lambda: g1.add("c"), "already committed")
    refused(seeded, g1.commit, "already committed")


# -- leases: claim, heartbeat, finalize, fail, release ----------------------------------------

CLAIM_CASES: list[tuple[dict[str, Any], str]] = [
    ({"worker_id": ""}, "worker_id"),
    ({"worker_id": None}, "worker_id"),
    ({"worker_id": 5}, "worker_id"),
    ({"ttl": 0}, "ttl"),
    ({"ttl": -1}, "ttl"),
    ({"ttl": math.nan}, "ttl"),
    ({"ttl": math.inf}, "ttl"),
    ({"ttl": "30"}, "ttl"),
    ({"ttl": True}, "ttl"),
    ({"limit": 0}, "limit"),
    ({"limit": -1}, "limit"),
    ({"limit": 1.5}, "limit"),
    ({"limit": True}, "limit"),
    ({"groups": "other"}, "groups"),
    ({"groups": [1]}, "groups"),
]


@pytest.mark.backend
def test_claim_refuses_bad_arguments(seeded: readyq.Queue) -> None:
    """Bad claim arguments (table above): InvalidJob, no job leased."""

    def check(kwargs: dict[str, Any], match: str) -> None:
        call = {"worker_id": "w", **kwargs}
        worker_id = call.pop("worker_id")
        refused(seeded, lambda: seeded.claim(worker_id, **call), match, InvalidJob)

    each_case(CLAIM_CASES, check)


@pytest.mark.backend
def test_lease_operations_refuse_bad_arguments(seeded: readyq.Queue) -> None:
    """heartbeat/finalize/fail/release with something that is not a Lease, or bad values."""
    seeded.enqueue("mine", group="mine")
    (lease,) = seeded.claim("w", groups=["mine"])
    fake = {"job_id": lease.job_id, "token": lease.token}
    for op in (seeded.heartbeat, seeded.finalize, seeded.release):
        refused(seeded, lambda op=op: op(fake), "expected a readyq.Lease", InvalidJob)
    refused(seeded, lambda: seeded.fail(fake, "x"), "expected a readyq.Lease", InvalidJob)
    refused(seeded, lambda: seeded.fail(None, "x"), "expected a readyq.Lease", InvalidJob)
    for ttl in (0, -1, math.nan, "5", None):
        refused(seeded, lambda ttl=ttl: seeded.heartbeat(lease, ttl=ttl), "ttl", InvalidJob)
    refused(seeded, lambda: seeded.finalize(lease, {"x": {1}}), "set", InvalidJob)
    refused(seeded, lambda: seeded.finalize(lease, [1]), "must be a dict", InvalidJob)
    refused(seeded, lambda: seeded.finalize(lease, {"r": Reducer()}), "Reducer", InvalidJob)
    # The lease survived every refusal: the holder can still finish the job.
    assert seeded.finalize(lease, {"ok": True}).state == S.DONE
    assert seeded.get(lease.job_id).result == {"ok": True}


@pytest.mark.backend
def test_stored_errors_are_truncated_to_max_error_chars(seeded: readyq.Queue) -> None:
    """A 50,000-character error is stored cut to MAX_ERROR_CHARS, ending in '...'."""
    seeded.enqueue("mine", group="mine", max_attempts=1)
    (lease,) = seeded.claim("w", groups=["mine"])
    seeded.fail(lease, "E" * 50_000)
    error = seeded.get(lease.job_id).error
    assert error is not None
    assert len(error) == MAX_ERROR_CHARS
    assert error.endswith("...")
    assert error.startswith("EEEE")


@pytest.mark.backend
def test_operator_actions_on_missing_jobs(seeded: readyq.Queue) -> None:
    """get/cancel/retry of a job that does not exist: UnknownJob with its id."""
    for op in (seeded.get, seeded.cancel, seeded.retry):
        refused(seeded, lambda op=op: op(10**9), "does not exist", UnknownJob)
    refused(seeded, lambda: seeded.list_jobs(state="bogus"), "unknown state", InvalidJob)
    refused(seeded, lambda: seeded.prune(5), "timedelta", InvalidJob)  # type: ignore[arg-type]
    refused(seeded, lambda: seeded.prune(dt.timedelta(-1)), "non-negative", InvalidJob)


@pytest.mark.backend
@pytest.mark.parametrize(
    "bad_id",
    [
        pytest.param("abc"),
        pytest.param(None),
        pytest.param(1.5),
    ],
)
def test_job_ids_must_be_ints(seeded: readyq.Queue, bad_id: Any) -> None:
    """A job id that is not an int is refused with InvalidJob before any SQL runs."""
    refused(seeded, lambda: seeded.get(bad_id), "int", InvalidJob)


@pytest.mark.backend
@pytest.mark.parametrize(
    "limit",
    [
        pytest.param(-1),
        pytest.param("x"),
    ],
)
def test_list_jobs_limit_is_validated(seeded: readyq.Queue, limit: Any) -> None:
    refused(seeded, lambda: seeded.list_jobs(limit=limit), "limit", InvalidJob)


# -- construction: Queue, Worker, limits, adapters --------------------------------------------


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("nosuchdb://u@h/x", "no adapter for the 'nosuchdb' dialect"),
        ("postgresql+nosuchdriver://u@h/x", "dialect/driver|driver"),
        ("not a url at all", "not a database URL"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
    ],
)
def test_queue_refuses_unusable_urls(url: str, match: str) -> None:
    """Unknown dialects, unknown drivers, garbage and in-memory SQLite: UnsupportedDatabase."""
    with pytest.raises(UnsupportedDatabase, match=match):
        readyq.Queue(url)


def test_queue_refuses_a_non_url() -> None:
    with pytest.raises(InvalidJob, match="URL or a SQLAlchemy Engine"):
        readyq.Queue(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cls", "version", "minimum"),
    [
        (PostgreSQLAdapter, (12, 17), "PostgreSQL >= 13"),
        (PostgreSQLAdapter, (9, 6), "PostgreSQL >= 13"),
        (MySQLAdapter, (8, 0, 0), "MySQL >= 8.0.1"),
        (MySQLAdapter, (5, 7, 44), "MySQL >= 8.0.1"),
        (MariaDBAdapter, (10, 5, 22), "MariaDB >= 10.6"),
        (SQLiteAdapter, (3, 34, 1), "SQLite >= 3.35"),
    ],
)
def test_old_servers_are_refused_naming_the_minimum(
    cls: type[Any], version: tuple[int, ...], minimum: str
) -> None:
    """An adapter built for an old server version refuses with the minimum and the reason."""
    with pytest.raises(UnsupportedDatabase) as info:
        cls(version)
    text = str(info.value)
    assert minimum in text
    assert ".".join(map(str, version)) in text
    assert "too old" in text


@pytest.mark.backend
def test_operations_on_an_uninstalled_schema(db_url: str) -> None:
    """No tables yet: enqueue, claim, counts, get say SchemaNotInstalled, and how to fix it."""
    with readyq.Queue(db_url) as q:
        for op in (
            lambda: q.enqueue("t"),
            lambda: q.claim("w"),
            q.counts,
            lambda: q.get(1),
            q.reclaim,
        ):
            with pytest.raises(SchemaNotInstalled, match="install"):
                op()


def _ok(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
    return {}


WORKER_CASES: list[Any] = [
    ({"lease_ttl": 0}, "lease_ttl"),
    ({"lease_ttl": -1}, "lease_ttl"),
    ({"lease_ttl": "30"}, "lease_ttl"),
    ({"lease_ttl": True}, "lease_ttl"),
    ({"heartbeat_every": 0}, "heartbeat_every"),
    ({"heartbeat_every": None}, "heartbeat_every"),
    ({"poll_interval": -0.5}, "poll_interval"),
    ({"grace": 0}, "grace"),
    ({"lease_ttl": 10, "heartbeat_every": 6}, "at least twice"),
    ({"executor": "fibers"}, "executor"),
    ({"executor": None}, "executor"),
    ({"handlers": {"": _ok}}, "non-empty string"),
    ({"handlers": {"t": 5}}, "not callable"),
    pytest.param(
        {"handlers": 5},
        "handlers",
        id="handlers-int",
    ),
    pytest.param(
        {"handlers": [("t", _ok)]},
        "handlers",
        id="handlers-list",
    ),
    pytest.param(
        {"limits": [5]},
        "limit",
        id="limits-int",
    ),
    pytest.param(
        {"reclaim_every": "x"},
        "reclaim_every",
        id="reclaim-every-str",
    ),
    pytest.param(
        {"reclaim_every": -1},
        "reclaim_every",
        id="reclaim-every-negative",
    ),
    pytest.param(
        {"scan_max_age": -0.1},
        "scan_max_age",
        id="scan-max-age-negative",
    ),
    pytest.param(
        {"scan_max_age": "0.05"},
        "scan_max_age",
        id="scan-max-age-str",
    ),
    pytest.param(
        {"scan_max_age": float("nan")},
        "scan_max_age",
        id="scan-max-age-nan",
    ),
    pytest.param(
        {"group_caps": {"a": "x"}},
        "group_caps",
        id="group-caps-str",
    ),
]


@pytest.mark.parametrize(("kwargs", "match"), WORKER_CASES)
def test_worker_refuses_bad_configuration(
    tmp_path: Path, kwargs: dict[str, Any], match: str
) -> None:
    """Bad Worker arguments: InvalidJob at construction, naming the argument."""
    with readyq.Queue(f"sqlite:///{tmp_path / 'w.db'}") as q:
        call = {"handlers": {"t": _ok}, **kwargs}
        handlers = call.pop("handlers")
        assert re.search(match, str(raised(lambda: Worker(q, handlers, **call))))


def test_worker_refuses_a_non_queue() -> None:
    exc = raised(lambda: Worker("sqlite:///x.db", {"t": _ok}))  # type: ignore[arg-type]
    assert "Queue" in str(exc)


LIMIT_CASES: list[Any] = [
    (lambda: Concurrency(0), "Concurrency"),
    (lambda: Concurrency(-1), "Concurrency"),
    (lambda: Concurrency(1.5), "Concurrency"),
    (lambda: Concurrency(True), "Concurrency"),
    (lambda: Concurrency("4"), "Concurrency"),
    (lambda: RateLimit(0), "rate"),
    (lambda: RateLimit(-1), "rate"),
    (lambda: RateLimit(math.nan), "rate"),
    (lambda: RateLimit(math.inf), "rate"),
    (lambda: RateLimit("5"), "rate"),
    (lambda: RateLimit(5, burst=0), "burst"),
    (lambda: RateLimit(5, burst=1.5), "burst"),
    (lambda: RateLimit(5, burst=True), "burst"),
    (lambda: Budget(5), "callable"),
    pytest.param(
        lambda: RateLimit(True),
        "rate",
        id="ratelimit-true",
    ),
    pytest.param(
        lambda: Budget(lambda: "x").available(0),
        "Budget",
        id="budget-returns-str",
    ),
]


@pytest.mark.parametrize(("make", "match"), LIMIT_CASES)
def test_limits_refuse_bad_arguments(make: Callable[[], object], match: str) -> None:
    assert re.search(match, str(raised(make)))


# -- dispatch: what handlers do wrong ------------------------------------------------------


@pytest.mark.backend
def test_bad_handlers_fail_their_jobs_and_the_worker_keeps_going(seeded: readyq.Queue) -> None:
    """Unknown type, raising, non-JSON, non-dict and hung handlers: each job fails with the
    reason; good jobs in between are done; the worker ends normally; seeded jobs untouched."""
    release = threading.Event()

    def raises(ctx: Any, args: dict[str, Any]) -> None:
        raise RuntimeError("E" * 10_000)

    handlers = {
        "good": lambda ctx, args: {"n": args["n"]},
        "raises": raises,
        "non-json": lambda ctx, args: {"when": dt.datetime.now(dt.UTC)},
        "non-dict": lambda ctx, args: [1, 2, 3],
        "nan": lambda ctx, args: {"x": math.nan},
        "hangs": lambda ctx, args: release.wait(60) and None,
    }
    others = snapshot(seeded)
    expect = {
        seeded.enqueue(
            "nobody-handles-this", group="bad", max_attempts=1
        ): "no handler for job type",
        seeded.enqueue("raises", group="bad", max_attempts=1): "RuntimeError: EEE",
        seeded.enqueue("non-json", group="bad", max_attempts=1): "datetime",
        seeded.enqueue("non-dict", group="bad", max_attempts=1): "returned list",
        seeded.enqueue("nan", group="bad", max_attempts=1): "nan",
        seeded.enqueue("hangs", group="bad", max_attempts=1, timeout=0.5): "timed out",
    }
    good = [seeded.enqueue("good", {"n": i}, group="bad") for i in range(5)]
    worker = Worker(
        seeded,
        handlers,
        group_caps={"other": 0},  # leave the seeded jobs alone
        poll_interval=0.05,
        heartbeat_every=0.1,
        lease_ttl=5,
        reclaim_every=0.1,
    )
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        deadline = time.monotonic() + 30
        ids = [*expect, *good]
        while any(seeded.get(j).state not in readyq.TERMINAL for j in ids):
            assert time.monotonic() < deadline, [seeded.get(j).state for j in ids]
            time.sleep(0.05)
    finally:
        worker.stop()
        runner.join(30)
        release.set()
    assert not runner.is_alive()
    for job_id, reason in expect.items():
        info = seeded.get(job_id)
        assert info.state == S.FAILED, (info.type, info.state)
        assert reason in (info.error or ""), (info.type, info.error)
        assert len(info.error or "") <= MAX_ERROR_CHARS
    assert [seeded.get(j).result for j in good] == [{"n": i} for i in range(5)]
    assert [r for r in snapshot(seeded) if r[0] in {o[0] for o in others}] == others


# -- the CLI never prints a password -------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["stats"],
        ["jobs", "list"],
        ["install"],
        ["worker", "--handlers", "worker_handlers:handlers", "--until-idle"],
    ],
    ids=["stats", "jobs-list", "install", "worker"],
)
def test_cli_never_prints_the_password_of_a_url(argv: list[str]) -> None:
    """Connection errors and banners show the URL with the password masked.

    A worker keeps retrying an unreachable database (it survives server restarts), so it
    is given a few seconds and then SIGTERM; the others exit 1 with the masked URL.
    """
    url = "postgresql+psycopg://u:secretpw@127.0.0.1:1/x"
    proc = subprocess.Popen(
        [sys.executable, "-m", "readyq", *argv, "--url", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT / "tests"), "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )
    try:
        out, err = proc.communicate(timeout=60 if argv[0] != "worker" else 8)
    except subprocess.TimeoutExpired:
        proc.terminate()
        out, err = proc.communicate(timeout=60)
    text = out + err
    if argv[0] != "worker":
        assert proc.returncode == 1, text
    assert "secretpw" not in text
    assert "u:***@127.0.0.1" in text
    assert "Traceback" not in text


# -- Hypothesis ---------------------------------------------------------------------------

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20),
)
hostile_leaf = st.one_of(
    st.floats(),  # NaN and infinities included
    st.binary(max_size=8),
    st.sets(st.integers(), max_size=3),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
    st.dates(),
    st.builds(object),
    st.builds(Reducer),
)
payloads = st.recursive(
    st.one_of(json_leaf, hostile_leaf),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.tuples(inner, inner),
        st.dictionaries(st.text(max_size=5), inner, max_size=4),
        st.dictionaries(st.integers(), inner, min_size=1, max_size=2),
    ),
    max_leaves=12,
)


def _is_json(value: Any) -> bool:
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return json.loads(text) == _normal(value)


def _normal(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


@pytest.mark.backend
@FIXTURE_OK
@given(value=payloads)
def test_any_args_are_stored_exactly_or_refused(seeded: readyq.Queue, value: Any) -> None:
    """Arbitrary nested values as args: JSON round-trips exactly, anything else InvalidJob."""
    args = {"v": value}
    Reducer.reduced = False
    if _is_json(args):
        job = seeded.enqueue("h", args)
        assert seeded.get(job).args == _normal(args)
    else:
        refused(seeded, lambda: seeded.enqueue("h", args), ".", InvalidJob)
    assert Reducer.reduced is False


anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


@pytest.mark.backend
@FIXTURE_OK
@given(weight=anything, priority=anything, max_attempts=anything, timeout=anything)
def test_any_job_options_are_stored_or_refused(
    seeded: readyq.Queue, weight: Any, priority: Any, max_attempts: Any, timeout: Any
) -> None:
    """weight/priority/max_attempts/timeout of any type: stored as given, or InvalidJob."""
    kwargs = {"weight": weight, "priority": priority, "max_attempts": max_attempts}
    kwargs["timeout"] = timeout
    before = snapshot(seeded)
    try:
        job = seeded.enqueue("h", group="hyp", **kwargs)
    except InvalidJob:
        assert snapshot(seeded) == before
        return
    info = seeded.get(job)
    assert info.weight == weight
    assert info.priority == priority
    assert info.max_attempts == max_attempts
    assert info.timeout == (None if timeout is None else pytest.approx(timeout, abs=1e-6))


@pytest.mark.backend
@FIXTURE_OK
@given(worker_id=anything, ttl=anything, limit=anything)
def test_any_claim_arguments_lease_or_are_refused(
    seeded: readyq.Queue, worker_id: Any, ttl: Any, limit: Any
) -> None:
    """claim() with arbitrary arguments: a list of leases, or InvalidJob and no change."""
    before = snapshot(seeded)
    try:
        leases = seeded.claim(worker_id, ttl=ttl, limit=limit, groups=["nothing-here"])
    except InvalidJob:
        assert snapshot(seeded) == before
        return
    assert leases == []


_serial = iter(range(10**9))


@pytest.mark.backend
@FIXTURE_OK
@given(
    name=st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        min_size=1,
        max_size=30,
    )
)
def test_any_type_and_group_names_are_stored_or_refused(seeded: readyq.Queue, name: str) -> None:
    """Arbitrary unicode names: stored exactly, or InvalidJob (NUL and lone surrogates are
    test_awkward_names_are_stored_or_refused)."""
    before = snapshot(seeded)
    key = f"{next(_serial)}:{name}"  # unique: key collisions are test_keys_differing_in_case
    try:
        job = seeded.enqueue(name, group=name, key=key)
    except InvalidJob:
        assert snapshot(seeded) == before
        return
    except Exception as exc:
        raise AssertionError(f"{name!r}: not a readyq error: {type(exc).__name__}: {exc}") from exc
    info = seeded.get(job)
    assert (info.type, info.group, info.key) == (name, name, key)


@pytest.mark.backend
@pytest.mark.parametrize(
    "name",
    [
        "nul\x00inside",
        pytest.param(
            "\ud800lone-surrogate",
            id="lone-surrogate",
        ),
        "emoji \U0001f600",
        "tab\tnewline\n",
    ],
)
def test_awkward_names_are_stored_or_refused(seeded: readyq.Queue, name: str) -> None:
    """NUL bytes, lone surrogates, 4-byte UTF-8: stored exactly, or a readyq error."""
    before = snapshot(seeded)
    try:
        job = seeded.enqueue(name, group=name, key=name)
    except ReadyqError:
        assert snapshot(seeded) == before
        return
    except Exception as exc:
        raise AssertionError(f"{name!r}: not a readyq error: {type(exc).__name__}: {exc}") from exc
    info = seeded.get(job)
    assert (info.type, info.group, info.key) == (name, name, name)


@pytest.mark.backend
def test_keys_differing_only_in_case_or_accents(seeded: readyq.Queue) -> None:
    """Idempotency keys 'Key' then 'key' (then 'kéy'): a job id each time, never a raw
    IntegrityError (MySQL/MariaDB compare them with the column's case-insensitive collation)."""
    first = seeded.enqueue("t", key="Key")
    for other in ("key", "KEY", "kéy"):
        try:
            job = seeded.enqueue("t", key=other)
        except ReadyqError:
            continue
        except Exception as exc:
            raise AssertionError(f"{other!r}: {type(exc).__name__}: {exc}") from exc
        assert job == first or seeded.get(job).key == other
