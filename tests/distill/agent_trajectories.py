"""Builders of agent trajectories as event dicts, and the fixed trees of the hand-computed reference.

A :class:`Tree` makes turns (generation events with a ``turn``) with fresh, reproducible ids, their tool
results and the trajectory's outcome. The three reference trees (``orchestrator_tree``, ``summary_tree``,
``pruned_search_tree``) are what ``test_trajectory.py`` works out by hand; the stream test and the benchmark
send them (and variants) through the real distiller.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from distill.samples import sample_to_json
from distill.spec import RewardSpec
from distill.trajectory import trajectory_samples
from ingest.events import Event, GenerationEvent, TrajectoryOutcomeEvent, parse_event

Json = dict[str, Any]
BASE = datetime(2026, 12, 1, 9, 0, 0, tzinfo=UTC)


def iso(ts: datetime) -> str:
    """An event time as the contract writes it."""
    return ts.astimezone(UTC).isoformat().replace("+00:00", "Z")


def segment(role: str, token_ids: list[int]) -> Json:
    """One trajectory segment with token ids (and logprobs for policy spans)."""
    logprobs = [-0.5] * len(token_ids) if role == "policy" else None
    return {"role": role, "text": f"{role} text", "token_ids": token_ids, "logprobs": logprobs}


@dataclass
class Tree:
    """One trajectory being written: each call adds an event (as a dict) at the next second."""

    session_id: str = "session-agent"
    user_id: str = "user-agent"
    seed: int = 0
    base: datetime = BASE
    tool_results: bool = False  # every tool call of a turn gets a successful tool.result right after it
    trajectory_id: str = ""
    events: list[Json] = field(default_factory=list)
    clock: float = 0.0
    _counter: int = 0

    def __post_init__(self) -> None:
        self.trajectory_id = self.trajectory_id or self.uuid()

    def uuid(self) -> str:
        """A fresh id, the same on every run for the same seed."""
        self._counter += 1
        return str(uuid.UUID(int=(self.seed << 64) | self._counter, version=4))

    def _envelope(self, kind: str, payload: Json) -> Json:
        self.clock += 1.0
        event = {
            "event_id": self.uuid(),
            "type": kind,
            "ts": iso(self.base + timedelta(seconds=self.clock)),
            "session_id": self.session_id,
            "user_id": self.user_id,
            "tenant": "acme",
            "payload": payload,
        }
        self.events.append(event)
        return event

    def turn(
        self,
        agent: str = "single",
        *,
        agent_id: str = "main",
        stage: int = 0,
        parent: str | None = None,
        frozen: bool = False,
        boundary: str = "none",
        calls: list[str] | tuple[str, ...] = (),
        invalid: tuple[int, ...] = (),
        segments: list[Json] | None = None,
        completion: str = "working on it",
        context_tokens: int | None = None,
        budget_tokens: int | None = None,
    ) -> str:
        """Add a turn; returns its turn id (= its generation id). Without segments its completion is 2 tokens."""
        turn_id = self.uuid()
        tokens = [t for s in segments for t in s["token_ids"]] if segments else [7, 8]
        payload: Json = {
            "generation_id": turn_id,
            "model": "liveloop-tiny",
            "policy_version": 1,
            "prompt": "task",
            "completion": completion,
            "prompt_token_ids": [1, 2],
            "completion_token_ids": tokens,
            "completion_logprobs": [-0.5] * len(tokens),
            "tool_calls": [
                {"name": name, "arguments": "{}", "valid": index not in invalid} for index, name in enumerate(calls)
            ],
            "surface": "agent",
            "task_kind": "chat",
            "turn": {
                "trajectory_id": self.trajectory_id,
                "turn_id": turn_id,
                "parent_turn_id": parent,
                "agent": agent,
                "agent_id": agent_id,
                "frozen": frozen,
                "stage": stage,
                "boundary": boundary,
                "context_tokens": context_tokens,
                "budget_tokens": budget_tokens,
            },
        }
        if segments:
            payload["trajectory"] = segments
        self._envelope("generation", payload)
        if self.tool_results:
            for index, name in enumerate(calls):
                self.tool_result(turn_id, name, call_index=index)
        return turn_id

    def tool_result(self, turn_id: str, tool: str, *, valid: bool = True, call_index: int | None = 0) -> None:
        """Add the result of one of the turn's tool calls."""
        payload = {"generation_id": turn_id, "tool": tool, "valid": valid, "call_index": call_index}
        self._envelope("tool.result", payload)

    def tests_result(
        self, turn_id: str, *, passed: int, failed: int, spans: list[tuple[int, int, bool]] | None = None
    ) -> None:
        """Add the product's own check of one turn (``tests.result``), with its verdicts on parts of the completion
        as ``(start, end, passed)`` where given."""
        payload: dict[str, Any] = {"generation_id": turn_id, "passed": passed, "failed": failed}
        if spans is not None:
            payload["spans"] = [{"start": start, "end": end, "passed": ok} for start, end, ok in spans]
        self._envelope("tests.result", payload)

    def outcome(
        self,
        success: bool = True,
        *,
        score: float | None = None,
        gave_up: bool = False,
        subagents: dict[str, bool] | None = None,
    ) -> None:
        """Add the trajectory's outcome."""
        subs = [{"agent_id": name, "finished": done} for name, done in (subagents or {}).items()]
        payload = {
            "trajectory_id": self.trajectory_id,
            "success": success,
            "score": score,
            "verifier": "tests",
            "gave_up": gave_up,
            "subagents": subs,
        }
        self._envelope("trajectory.outcome", payload)

    def expected(self, spec: RewardSpec) -> list[bytes]:
        """The samples the pure code gives for this trajectory's events, as bytes, by turn time."""
        events = self.parsed()
        turns = [e for e in events if isinstance(e, GenerationEvent)]
        outcome = next((e for e in events if isinstance(e, TrajectoryOutcomeEvent)), None)
        return [sample_to_json(s) for s in trajectory_samples(turns, events, outcome, spec)[1]]

    def parsed(self) -> list[Event]:
        """The events, parsed as the distiller parses them."""
        return [parse_event(event_json(event)) for event in self.events]


def event_json(event: Json) -> bytes:
    """An event dict as the bytes on the topic."""
    return json.dumps(event).encode()


def orchestrator_tree(**options: Any) -> tuple[Tree, list[str]]:
    """Three stages: the orchestrator spawns two frozen sub-agents (2 and 3 turns), then three (1, 2 and 4
    turns; ``sub-4`` does not finish), then answers in two turns. Returns the tree and its orchestrator turns."""
    tree = Tree(**options)
    mask_segments = [segment("policy", [10, 11]), segment("subagent", [12, 13]), segment("policy", [14])]
    o1 = tree.turn("orchestrator", calls=["create_subagent", "create_subagent", "assign_task"])
    for name, turns in (("sub-1", 2), ("sub-2", 3)):
        for _ in range(turns):
            tree.turn("subagent", agent_id=name, frozen=True, parent=o1, calls=["search"])
    o2 = tree.turn("orchestrator", stage=1, parent=o1, segments=mask_segments, calls=["create_subagent"] * 3)
    for name, turns in (("sub-3", 1), ("sub-4", 2), ("sub-5", 4)):
        for _ in range(turns):
            tree.turn("subagent", agent_id=name, stage=1, frozen=True, parent=o2, calls=["read"])
    o3 = tree.turn("orchestrator", stage=2, parent=o2, calls=["assign_task"])
    o4 = tree.turn("orchestrator", stage=2, parent=o3, completion="All five parts are merged.")
    finished = {"sub-1": True, "sub-2": True, "sub-3": True, "sub-4": False, "sub-5": True}
    tree.outcome(True, score=0.8, subagents=finished)
    return tree, [o1, o2, o3, o4]


def summary_tree(**options: Any) -> tuple[Tree, list[str]]:
    """A single coding agent whose context is summarised twice: turns 2 and 4 write the summaries that turns 3
    and 5 continue from. Returns the tree and its five turns."""
    tree = Tree(**options)
    t1 = tree.turn(calls=["read"])
    t2 = tree.turn(parent=t1, segments=[segment("policy", [20, 21, 22])], completion="summary of the work so far")
    t3 = tree.turn(
        parent=t2, boundary="summary", segments=[segment("summary", [23, 24]), segment("policy", [25])], calls=["edit"]
    )
    t4 = tree.turn(parent=t3, segments=[segment("policy", [26, 27])], completion="second summary")
    t5 = tree.turn(parent=t4, boundary="summary", segments=[segment("summary", [28]), segment("policy", [29, 30])])
    tree.outcome(True)
    return tree, [t1, t2, t3, t4, t5]


def pruned_search_tree(**options: Any) -> tuple[Tree, list[str]]:
    """A search agent with a 1000-token budget: two searches, then a turn served at 1200 tokens whose search
    is refused (only ``prune_chunks`` passes), then a pruned context, a read and an answer; partial credit."""
    tree = Tree(**options)
    t1 = tree.turn(calls=["search"], context_tokens=300, budget_tokens=1000)
    t2 = tree.turn(
        parent=t1,
        calls=["search", "read"],
        context_tokens=700,
        budget_tokens=1000,
        segments=[segment("policy", [40]), segment("tool", [41, 42]), segment("policy", [43])],
    )
    t3 = tree.turn(parent=t2, calls=["search", "prune_chunks"], invalid=(0,), context_tokens=1200, budget_tokens=1000)
    t4 = tree.turn(parent=t3, boundary="prune", calls=["read"], context_tokens=500, budget_tokens=1000)
    t5 = tree.turn(parent=t4, completion="The answer is in chunk 12.", context_tokens=600, budget_tokens=1000)
    tree.outcome(False, score=0.25)
    return tree, [t1, t2, t3, t4, t5]
