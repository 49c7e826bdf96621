"""The state machine is declared once, as data; these tests read it as a specification."""

from __future__ import annotations

import itertools

import pytest

from readyq import TERMINAL, TRANSITIONS, InvalidJob, JobState
from readyq.job import allowed, decode_payload, encode_payload

S = JobState

ALLOWED_EDGES = {
    (S.BLOCKED, S.READY),
    (S.BLOCKED, S.CANCELLED),
    (S.READY, S.RUNNING),
    (S.READY, S.CANCELLED),
    (S.RUNNING, S.DONE),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.READY),
    (S.RUNNING, S.CANCELLED),
    (S.WAITING, S.DONE),
    (S.WAITING, S.FAILED),
    (S.WAITING, S.CANCELLED),
    (S.FAILED, S.READY),
    (S.FAILED, S.BLOCKED),
    (S.FAILED, S.WAITING),
    (S.CANCELLED, S.READY),
    (S.CANCELLED, S.BLOCKED),
    (S.CANCELLED, S.WAITING),
}


@pytest.mark.parametrize(("source", "target"), sorted(ALLOWED_EDGES))
def test_allowed_edge_is_in_the_table(source: JobState, target: JobState) -> None:
    """Every intended edge of the state machine is declared."""
    assert allowed(source, target)


@pytest.mark.parametrize(
    ("source", "target"),
    sorted(set(itertools.product(S, S)) - ALLOWED_EDGES),
)
def test_forbidden_edge_is_not_in_the_table(source: JobState, target: JobState) -> None:
    """No other edge exists: e.g. done never changes, and nothing jumps to running but a claim."""
    assert not allowed(source, target)


def test_done_is_final() -> None:
    """A job that finished successfully can never change state again."""
    assert not any(S.DONE in t.sources for t in TRANSITIONS.values())


def test_only_a_claim_starts_a_job() -> None:
    """RUNNING is reached by exactly one transition, the claim, from READY."""
    into_running = [t for t in TRANSITIONS.values() if t.target == S.RUNNING]
    assert [(t.name, t.sources) for t in into_running] == [("claim", frozenset({S.READY}))]


def test_terminal_states_are_done_failed_cancelled() -> None:
    """The terminal set is exactly the states a finished job can be in."""
    assert frozenset({S.DONE, S.FAILED, S.CANCELLED}) == TERMINAL


def test_payload_round_trips_as_json() -> None:
    """Args survive encoding unchanged."""
    args = {"a": [1, 2.5, "x", None, True], "b": {"c": "ü"}}
    assert decode_payload(encode_payload(args, "args")) == args


@pytest.mark.parametrize(
    "bad",
    [
        {"x": {1, 2}},
        {"x": b"bytes"},
        {"x": float("nan")},
        {"x": float("inf")},
        {1: "int key"},
        {"x": object()},
    ],
    ids=["set", "bytes", "nan", "inf", "int-key", "object"],
)
def test_non_json_payload_is_refused(bad: dict[object, object]) -> None:
    """Anything JSON cannot represent exactly is refused with InvalidJob."""
    with pytest.raises(InvalidJob, match="args"):
        encode_payload(bad, "args")


def test_payload_must_be_an_object() -> None:
    """A list or a string is not accepted as args: handlers receive a dict."""
    with pytest.raises(InvalidJob, match="must be a dict"):
        encode_payload([1, 2], "args")


def test_deeply_nested_payload_is_refused() -> None:
    """Nesting beyond the documented depth is refused rather than overflowing the stack."""
    deep: dict[str, object] = {}
    node = deep
    for _ in range(100):
        node["n"] = {}
        node = node["n"]  # type: ignore[assignment]
    with pytest.raises(InvalidJob, match="deeper"):
        encode_payload(deep, "args")


def test_oversized_payload_is_refused() -> None:
    """Payloads over the size cap are refused: big data belongs outside the queue."""
    with pytest.raises(InvalidJob, match="bytes"):
        encode_payload({"blob": "x" * (2 << 20)}, "args")
