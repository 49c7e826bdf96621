"""Jobs as data: the state machine (declared once, here), and the records readyq returns.

Pure module: no SQL. Every statement that changes a job's state takes its allowed source
states from :data:`TRANSITIONS`, so the table below *is* the state machine.
"""

from __future__ import annotations

import datetime as _dt
import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .clock import from_us
from .errors import InvalidJob

__all__ = [
    "MAX_ERROR_CHARS",
    "TERMINAL",
    "TRANSITIONS",
    "JobInfo",
    "JobState",
    "Lease",
    "Outcome",
    "Transition",
    "check_text",
    "decode_payload",
    "encode_payload",
]

#: Error texts stored in the table are cut to this many characters.
MAX_ERROR_CHARS = 4000
#: Encoded args/result larger than this are refused (keep big data outside the queue).
MAX_PAYLOAD_BYTES = 1 << 20
_MAX_DEPTH = 64


class JobState(enum.StrEnum):
    """Where a job is in its life."""

    #: Waiting for at least one dependency to finish.
    BLOCKED = "blocked"
    #: Claimable once ``run_after`` is reached.
    READY = "ready"
    #: Leased to a worker; the lease token fences every write of that worker.
    RUNNING = "running"
    #: A container: never dispatched, rolls up when its last child finishes.
    WAITING = "waiting"
    #: Finished successfully; the result is stored.
    DONE = "done"
    #: Finished unsuccessfully for good (attempts exhausted, non-retryable, failed children).
    FAILED = "failed"
    #: Cancelled by a user, or because something it needed failed or was cancelled.
    CANCELLED = "cancelled"


TERMINAL = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


@dataclass(frozen=True)
class Transition:
    """One named edge set of the state machine: any of ``sources`` may become ``target``."""

    name: str
    sources: frozenset[JobState]
    target: JobState


def _t(name: str, sources: set[JobState], target: JobState) -> tuple[str, Transition]:
    return name, Transition(name, frozenset(sources), target)


S = JobState
TRANSITIONS: Mapping[str, Transition] = dict(
    [
        _t("promote", {S.BLOCKED}, S.READY),  # last open dependency finished
        _t("claim", {S.READY}, S.RUNNING),
        _t("finalize", {S.RUNNING}, S.DONE),
        _t("fail", {S.RUNNING}, S.FAILED),  # no attempts left, or retry=False
        _t("retry_later", {S.RUNNING}, S.READY),  # failed attempt, backoff via run_after
        _t("release", {S.RUNNING}, S.READY),  # graceful shutdown hands the job back
        _t("reclaim", {S.RUNNING}, S.READY),  # lease expired or hang timeout, attempts left
        _t("reclaim_exhausted", {S.RUNNING}, S.FAILED),
        _t("rollup_done", {S.WAITING}, S.DONE),
        _t("rollup_failed", {S.WAITING}, S.FAILED),
        _t("cancel", {S.BLOCKED, S.READY, S.RUNNING, S.WAITING}, S.CANCELLED),
        _t("retry", {S.FAILED, S.CANCELLED}, S.READY),
        _t("retry_blocked", {S.FAILED, S.CANCELLED}, S.BLOCKED),
        _t("retry_container", {S.FAILED, S.CANCELLED}, S.WAITING),
    ]
)
del S


def diagram() -> str:
    """The state machine as a Mermaid diagram, generated from :data:`TRANSITIONS`."""
    lines = ["stateDiagram-v2", "    [*] --> blocked", "    [*] --> ready", "    [*] --> waiting"]
    for t in TRANSITIONS.values():
        lines += [f"    {s.value} --> {t.target.value}: {t.name}" for s in sorted(t.sources)]
    lines += [f"    {s.value} --> [*]" for s in sorted(TERMINAL)]
    return "\n".join(lines)


def allowed(source: JobState, target: JobState) -> bool:
    """Whether some transition takes ``source`` to ``target``."""
    return any(source in t.sources and t.target == target for t in TRANSITIONS.values())


@dataclass(frozen=True)
class Lease:
    """A claimed job. ``token`` fences every write made on the lease's behalf."""

    job_id: int
    token: int
    type: str
    args: dict[str, Any]
    worker_id: str
    group: str
    attempt: int
    max_attempts: int
    expires_us: int
    deadline_us: int | None

    @property
    def expires_at(self) -> _dt.datetime:
        """When the lease becomes reclaimable unless renewed by a heartbeat (UTC)."""
        value = from_us(self.expires_us)
        assert value is not None
        return value

    @property
    def idempotency_key(self) -> str:
        """Stable per (job, lease): use it to make external side effects idempotent."""
        return f"readyq:{self.job_id}:{self.token}"


@dataclass(frozen=True)
class Outcome:
    """What a finalize/fail recorded. ``replayed`` is True for an idempotent retry."""

    job_id: int
    token: int
    state: JobState
    replayed: bool = False
    #: Dependent jobs (and containers) this outcome changed: promoted, cancelled, rolled up.
    dependents: int = 0


@dataclass(frozen=True)
class JobInfo:
    """A snapshot of one job row, as returned by ``Queue.get``."""

    id: int
    type: str
    args: dict[str, Any]
    result: dict[str, Any] | None
    state: JobState
    group: str
    weight: float
    priority: int
    attempts: int
    max_attempts: int
    error: str | None
    parent: int | None
    key: str | None
    timeout: float | None
    container: bool
    pending_deps: int
    lease_owner: str | None
    lease_token: int
    lease_expires_at: _dt.datetime | None
    run_after: _dt.datetime
    created_at: _dt.datetime
    started_at: _dt.datetime | None
    finished_at: _dt.datetime | None
    depends_on: tuple[int, ...] = ()


def check_text(value: str, where: str) -> None:
    """Strings must be valid Unicode (no lone surrogates): every driver encodes UTF-8."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidJob(f"{where} contains a lone surrogate; pass valid Unicode text") from None


def _check_json(value: object, where: str, depth: int = 0) -> None:
    if depth > _MAX_DEPTH:
        raise InvalidJob(f"{where} is nested deeper than {_MAX_DEPTH} levels")
    if isinstance(value, str):
        check_text(value, where)
        return
    if value is None or isinstance(value, (bool, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidJob(f"{where} contains {value!r}, which JSON cannot represent")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{where}[{i}]", depth + 1)
        return
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                raise InvalidJob(f"{where} has a non-string key {k!r}; JSON keys are strings")
            check_text(k, f"{where} key")
            _check_json(item, f"{where}[{k!r}]", depth + 1)
        return
    raise InvalidJob(
        f"{where} contains a {type(value).__name__} ({value!r:.60}); "
        "payloads are JSON: use dict, list, str, int, float, bool or None"
    )


#: One encoder for every payload: ``json.dumps`` with options builds a new one per call.
_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def encode_payload(value: object, what: str) -> str:
    """Validate a JSON object payload (args or result) and encode it. Never pickles."""
    if not isinstance(value, dict):
        raise InvalidJob(f"{what} must be a dict (a JSON object), not {type(value).__name__}")
    _check_json(value, what)
    try:
        text = _ENCODER.encode(value)
    except ValueError as exc:  # e.g. an int longer than sys.get_int_max_str_digits()
        raise InvalidJob(f"{what} cannot be encoded as JSON: {exc}") from None
    if len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise InvalidJob(
            f"{what} encodes to more than {MAX_PAYLOAD_BYTES} bytes; store large data "
            "elsewhere and pass a reference"
        )
    return text


def decode_payload(text: str | None) -> dict[str, Any] | None:
    """Decode a stored payload (JSON only)."""
    if text is None:
        return None
    value = json.loads(text)
    if not isinstance(value, dict):  # pragma: no cover - only readyq writes these columns
        raise InvalidJob("stored payload is not a JSON object")
    return value
