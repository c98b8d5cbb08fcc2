"""Valid events of every type, as decoded JSON, for the ingest tests; and the InvalidEvent a bad one raises."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from ingest import (
    SCHEMA_VERSION,
    InvalidEvent,
    parse_event,
)

GENERATION_ID = "0b7e6f7e-2f4a-4c1e-9d51-5b1f3c1e8a01"
TRAJECTORY_ID = "5d1a7a52-3f0e-4b8e-8a43-0d7b9c2e6f10"


def payloads() -> dict[str, dict[str, Any]]:
    """A valid payload of every event type, by type (a fresh copy on every call)."""
    feedback = {"generation_id": GENERATION_ID}
    edit = {**feedback, "fraction_remaining": 0.75, "seconds_after": 30}
    return {
        "session.started": {
            "surface": "ide.chat",
            "client": "acme-vscode",
            "client_version": "1.4.2",
            "editor": "vscode",
            "editor_version": "1.96.0",
            "repo_language": "python",
        },
        "generation": {
            "generation_id": GENERATION_ID,
            "model": "liveloop-tiny",
            "policy_version": 7,
            "prompt": "def add(a, b):\n",
            "completion": "    return a + b\n",
            "prompt_token_ids": [1, 2, 3],
            "completion_token_ids": [4, 5],
            "completion_logprobs": [-0.25, -1.5],
            "latency_ms": 41.5,
            "tool_calls": [{"name": "run_tests", "arguments": '{"path": "tests"}', "valid": True}],
            "surface": "agent",
            "task_kind": "edit",
            "trajectory": [
                {"role": "user", "text": "fix the bug", "token_ids": None, "logprobs": None},
                {"role": "policy", "text": "calling tests", "token_ids": [9, 8], "logprobs": [-0.1, -0.2]},
                {"role": "tool", "text": "1 failed", "token_ids": [7], "logprobs": None},
                {"role": "subagent", "text": "searched the repo", "token_ids": None, "logprobs": None},
                {"role": "summary", "text": "context so far", "token_ids": None, "logprobs": None},
            ],
            "turn": {
                "trajectory_id": TRAJECTORY_ID,
                "turn_id": GENERATION_ID,
                "parent_turn_id": "0b7e6f7e-2f4a-4c1e-9d51-5b1f3c1e8a00",
                "agent": "orchestrator",
                "agent_id": "main",
                "frozen": False,
                "stage": 1,
                "boundary": "summary",
                "context_tokens": 812,
                "budget_tokens": 4096,
            },
        },
        "suggestion.accepted": feedback,
        "suggestion.rejected": feedback,
        "suggestion.dismissed": feedback,
        "edit.persisted": edit,
        "edit.reverted": {**edit, "fraction_remaining": 0.0},
        "followup": {**feedback, "dissatisfied": True, "rephrase": False},
        "rating": {**feedback, "thumbs": "down"},
        "tool.result": {**feedback, "tool": "run_tests", "valid": False, "error": "timeout", "call_index": 0},
        "tests.result": {**feedback, "passed": 12, "failed": 1, "spans": [{"start": 0, "end": 6, "passed": True}]},
        "trajectory.outcome": {
            "trajectory_id": TRAJECTORY_ID,
            "success": True,
            "score": 0.75,
            "verifier": "tests",
            "gave_up": False,
            "subagents": [{"agent_id": "sub-1", "finished": True}, {"agent_id": "sub-2", "finished": False}],
        },
        "session.ended": {"reason": "closed"},
    }


def sample_event(event_type: str) -> dict[str, Any]:
    """A valid event of ``event_type`` as decoded JSON (a fresh copy on every call)."""
    return {
        "event_id": "6f1c1f5e-8d3e-4d0a-b5a4-2f8e4f1d9c10",
        "schema_version": SCHEMA_VERSION,
        "type": event_type,
        "ts": "2025-01-31T12:00:00.250000Z",
        "session_id": "sess-1",
        "user_id": "user-9f2c",
        "tenant": "acme",
        "privacy_mode": False,
        "payload": copy.deepcopy(payloads()[event_type]),
    }


def reason_of(data: bytes | str | dict[str, Any]) -> InvalidEvent:
    """The InvalidEvent that parsing ``data`` raises (failing the test if it parses)."""
    with pytest.raises(InvalidEvent) as caught:
        parse_event(data)
    return caught.value
