"""Build valid :class:`distill.samples.Sample` objects for learner tests, with only the fields a test cares about."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from distill.samples import AgentCredit, CreditedSpan, Sample, sample_id_for

SPEC_HASH = "ab" * 32
_NAMESPACE = uuid.UUID("6f1d0c4e-8a55-4f0e-9a57-1c0f6d1b2a30")


def make_sample(number: int, **overrides: Any) -> Sample:
    """A trainable sample whose ids derive from ``number`` (same number, same sample_id); override any field.

    Defaults: policy version 0, a 3-token prompt, a 2-token completion with logprobs and an all-ones mask,
    reward 1.0, surface ``ide.tab``, no task kind, not private.
    """
    generation_id = uuid.uuid5(_NAMESPACE, str(number))
    completion = overrides.pop("completion_token_ids", [20, 21])
    fields: dict[str, Any] = {
        "sample_id": sample_id_for(generation_id, SPEC_HASH),
        "generation_id": generation_id,
        "policy_version": 0,
        "model": "tiny",
        "prompt": "abc",
        "completion": "de",
        "prompt_token_ids": [10, 11, 12],
        "completion_token_ids": completion,
        "behaviour_logprobs": None if completion is None else [-1.0] * len(completion),
        "loss_mask": None if completion is None else [1] * len(completion),
        "reward": 1.0,
        "components": {"accepted": 1.0},
        "source_event_ids": [uuid.uuid5(_NAMESPACE, f"event-{number}")],
        "spec_version": "1",
        "spec_hash": SPEC_HASH,
        "session_id": f"session-{number}",
        "user_id": "user-1",
        "tenant": "tenant-1",
        "surface": "ide.tab",
        "finalised_by": "session_end",
        "deferral": False,
        "invalid_tool_calls": 0,
        "generated_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    fields.update(overrides)
    return Sample(**fields)


def make_agent_sample(
    number: int,
    trajectory: int,
    turn: int,
    turns: int,
    *,
    reward: float = 0.0,
    r_parallel: float = 0.0,
    r_finish: float = 0.0,
    frozen: bool = False,
    agent: str = "orchestrator",
    spans: tuple[CreditedSpan, ...] = (),
    **overrides: Any,
) -> Sample:
    """The sample of turn ``turn`` of trajectory ``trajectory`` (ids derived from the numbers), one of its
    ``turns`` trainable turns, with the trajectory-level ``reward`` and shaping terms, and credited ``spans`` of its
    completion text. A frozen turn gets an all-zero loss mask, as the contract requires. Other fields as
    :func:`make_sample`, overridable."""
    completion = overrides.get("completion_token_ids", [20, 21])
    if frozen:
        overrides["loss_mask"] = [0] * len(completion)
    credit = AgentCredit(
        trajectory_id=uuid.uuid5(_NAMESPACE, f"trajectory-{trajectory}"),
        turn_id=uuid.uuid5(_NAMESPACE, f"trajectory-{trajectory}-turn-{turn}"),
        agent=agent,  # type: ignore[arg-type]
        agent_id=f"{agent}-{trajectory}",
        stage=0,
        boundary="none",
        summary_turn=False,
        frozen=frozen,
        trajectory_turns=turns,
        critical_steps=turns,
        r_perf=reward,
        r_parallel=r_parallel,
        r_finish=r_finish,
        spans=list(spans),
    )
    fields: dict[str, Any] = {"reward": reward, "surface": "agent", "session_id": f"session-t{trajectory}"}
    return make_sample(number, agent=credit, **{**fields, **overrides})
