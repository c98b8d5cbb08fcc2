"""Hand-written golden sessions: events as dicts, with the components and reward worked out by hand.

Every session scores one generation (its first event) under the packaged default spec, unless
``spec_update`` replaces some top-level fields. Default weights, for checking the arithmetic:
accepted +0.75, rejected -0.25, dismissed 0, silent 0, edit_persisted +1.0 x fraction_remaining,
edit_reverted -1.0, followup_dissatisfied -0.5, followup_rephrase -0.25, rating_up +0.5,
rating_down -0.5, tests_passed +0.5 x passed/total, tests_failed -0.5 x failed/total,
invalid_tool_call -1.0 each, deferral -0.1; clip [-2, 2]; windows: suggestion 60 s, edit 600 s,
followup 300 s, rating 3600 s, tests 1800 s, tool 300 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

GENERATION_ID = "6f1d3c2a-9b7e-4c55-8a10-2e4f5d6c7b80"
OTHER_GENERATION_ID = "0c9a8b7d-1e2f-4a3b-9c4d-5e6f7a8b9c0d"
SESSION_ID = "session-golden"
GENERATED_AT = datetime(2026, 11, 2, 10, 0, 0, tzinfo=UTC)


def event_id(number: int) -> str:
    return f"00000000-0000-4000-8000-{number:012x}"


def at(seconds: float) -> str:
    return (GENERATED_AT + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def envelope(number: int, kind: str, seconds: float, payload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "event_id": event_id(number),
        "type": kind,
        "ts": at(seconds),
        "session_id": SESSION_ID,
        "user_id": "user-1",
        "tenant": "acme",
        "payload": payload,
        **extra,
    }


def generation(**payload: Any) -> dict[str, Any]:
    body = {
        "generation_id": GENERATION_ID,
        "model": "liveloop-tiny",
        "policy_version": 3,
        "prompt": "def add(a, b):\n",
        "completion": "    return a + b\n",
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "completion_logprobs": [-0.5, -0.25],
        "surface": "ide.tab",
        "task_kind": "completion",
        **payload,
    }
    return envelope(0, "generation", 0, body)


def feedback(number: int, kind: str, seconds: float, **payload: Any) -> dict[str, Any]:
    return envelope(number, kind, seconds, {"generation_id": GENERATION_ID, **payload})


@dataclass(frozen=True)
class Golden:
    """One session and what scoring its generation must give."""

    name: str
    events: list[dict[str, Any]]
    components: dict[str, float]
    reward: float
    counted: int = 0  # feedback events that count (source_event_ids holds these plus the generation)
    invalid_tool_calls: int = 0
    deferral: bool = False
    spec_update: dict[str, Any] = field(default_factory=dict)


_INVALID_CALLS = [
    {"name": "edit_file", "arguments": '{"path": ', "valid": False},
    {"name": "read_file", "arguments": '{"path": "a.py"}', "valid": True},
    {"name": "run", "arguments": "rm -rf", "valid": False},
]

GOLDEN: list[Golden] = [
    Golden("accepted only", [generation(), feedback(1, "suggestion.accepted", 5)], {"accepted": 0.75}, 0.75, 1),
    Golden("rejected only", [generation(), feedback(1, "suggestion.rejected", 5)], {"rejected": -0.25}, -0.25, 1),
    Golden("silent", [generation()], {"silent": 0.0}, 0.0),
    Golden(
        "accepted then reverted: both count",
        [
            generation(),
            feedback(1, "suggestion.accepted", 5),
            feedback(2, "edit.reverted", 300, fraction_remaining=0.1, seconds_after=295),
        ],
        {"accepted": 0.75, "edit_reverted": -1.0},
        -0.25,
        2,
    ),
    Golden(
        "edit persisted at 0.6",
        [
            generation(),
            feedback(1, "suggestion.accepted", 5),
            feedback(2, "edit.persisted", 120, fraction_remaining=0.6, seconds_after=115),
        ],
        {"accepted": 0.75, "edit_persisted": 0.6},
        1.35,
        2,
    ),
    Golden(
        "the last edit measurement counts",
        [
            generation(),
            feedback(1, "edit.persisted", 60, fraction_remaining=0.9, seconds_after=55),
            feedback(2, "edit.persisted", 600, fraction_remaining=0.5, seconds_after=595),
        ],
        {"edit_persisted": 0.5},
        0.5,
        2,
    ),
    Golden(
        "dissatisfied follow-up",
        [generation(), feedback(1, "followup", 30, dissatisfied=True, rephrase=False)],
        {"followup_dissatisfied": -0.5},
        -0.5,
        1,
    ),
    Golden(
        "two dissatisfied follow-ups, one a rephrase: each flag once",
        [
            generation(),
            feedback(1, "followup", 30, dissatisfied=True, rephrase=False),
            feedback(2, "followup", 90, dissatisfied=True, rephrase=True),
        ],
        {"followup_dissatisfied": -0.5, "followup_rephrase": -0.25},
        -0.75,
        2,
    ),
    Golden("thumbs down", [generation(), feedback(1, "rating", 100, thumbs="down")], {"rating_down": -0.5}, -0.5, 1),
    Golden(
        "rating changed: the last one counts",
        [generation(), feedback(1, "rating", 100, thumbs="up"), feedback(2, "rating", 200, thumbs="down")],
        {"rating_down": -0.5},
        -0.5,
        2,
    ),
    Golden(
        "accepted then rejected: the last outcome counts",
        [generation(), feedback(1, "suggestion.accepted", 5), feedback(2, "suggestion.rejected", 20)],
        {"rejected": -0.25},
        -0.25,
        2,
    ),
    Golden(
        "tests 3 passed 1 failed",
        [generation(), feedback(1, "tests.result", 600, passed=3, failed=1)],
        {"tests_failed": -0.125, "tests_passed": 0.375},
        0.25,
        1,
    ),
    Golden(
        "two invalid tool calls, one also failed when run: counted once",
        [
            generation(surface="agent", task_kind="edit", completion="Done.", tool_calls=_INVALID_CALLS),
            feedback(1, "tool.result", 10, tool="edit_file", valid=False, error="bad json", call_index=0),
            feedback(2, "tool.result", 11, tool="read_file", valid=True, call_index=1),
        ],
        {"invalid_tool_call": -2.0, "silent": 0.0},
        -2.0,
        2,
        invalid_tool_calls=2,
    ),
    Golden(
        "deferral: a question instead of the edit",
        [generation(surface="ide.chat", task_kind="edit", completion="Which file should I change?\n")],
        {"deferral": -0.1, "silent": 0.0},
        -0.1,
        deferral=True,
    ),
    Golden(
        "duplicate accept event counted once",
        [generation(), feedback(1, "suggestion.accepted", 5), feedback(1, "suggestion.accepted", 5)],
        {"accepted": 0.75},
        0.75,
        1,
    ),
    Golden(
        "accept exactly at the end of its window counts",
        [generation(), feedback(1, "suggestion.accepted", 60)],
        {"accepted": 0.75},
        0.75,
        1,
    ),
    Golden(
        "late accept outside its window is ignored",
        [generation(), feedback(1, "suggestion.accepted", 61)],
        {"silent": 0.0},
        0.0,
    ),
    Golden(
        "late rating ignored, accept in time counts",
        [generation(), feedback(1, "suggestion.accepted", 5), feedback(2, "rating", 3601, thumbs="down")],
        {"accepted": 0.75},
        0.75,
        1,
    ),
    Golden(
        "feedback of another generation, another session or in privacy mode is ignored",
        [
            generation(),
            {**feedback(1, "suggestion.accepted", 5), "payload": {"generation_id": OTHER_GENERATION_ID}},
            {**feedback(2, "suggestion.accepted", 6), "session_id": "session-other"},
            {**feedback(3, "suggestion.accepted", 7), "privacy_mode": True},
        ],
        {"silent": 0.0},
        0.0,
    ),
    Golden(
        "clipped to the upper bound",
        [
            generation(),
            feedback(1, "suggestion.accepted", 5),
            feedback(2, "edit.persisted", 600, fraction_remaining=1.0, seconds_after=595),
            feedback(3, "rating", 1000, thumbs="up"),
            feedback(4, "tests.result", 1200, passed=4, failed=0),
        ],
        {"accepted": 0.75, "edit_persisted": 1.0, "rating_up": 0.5, "tests_failed": 0.0, "tests_passed": 0.5},
        2.0,
        4,
    ),
    Golden(
        "clipped to the lower bound",
        [
            generation(),
            feedback(1, "edit.reverted", 100, fraction_remaining=0.0, seconds_after=95),
            feedback(2, "followup", 120, dissatisfied=True, rephrase=True),
            feedback(3, "rating", 130, thumbs="down"),
            feedback(4, "tests.result", 140, passed=0, failed=2),
        ],
        {
            "edit_reverted": -1.0,
            "followup_dissatisfied": -0.5,
            "followup_rephrase": -0.25,
            "rating_down": -0.5,
            "tests_failed": -0.5,
            "tests_passed": 0.0,
        },
        -2.0,
        4,
    ),
    Golden(
        "surface normalisation: 0.5 * 0.75 - 0.25",
        [generation(), feedback(1, "suggestion.accepted", 5)],
        {"accepted": 0.75},
        0.125,
        1,
        spec_update={"surface_normalisation": {"ide.tab": {"scale": 0.5, "offset": -0.25}}},
    ),
    Golden(
        "normalisation of another surface does not apply",
        [generation(surface="ide.chat", task_kind="chat"), feedback(1, "rating", 50, thumbs="up")],
        {"rating_up": 0.5},
        0.5,
        1,
        spec_update={"surface_normalisation": {"ide.tab": {"scale": 0.5, "offset": -0.25}}},
    ),
]
