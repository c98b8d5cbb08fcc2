"""The reward function: one generation plus the feedback it got, under a spec, gives one sample.

Pure and deterministic (no clock, no I/O, no randomness), so that the streaming app and the replay
tooling run the very same code: the same generation, the same set of events and the same spec give
the same sample, bit for bit, in whatever order the events are passed.

Which feedback counts. An event counts when it is a feedback event (suggestion, edit, follow-up,
rating, tests or tool result) about this generation (same ``generation_id``, ``session_id`` and
``tenant``: the streaming app joins within a session, and a replay must see what it saw), not in
privacy mode, and not late (:func:`is_late`). Anything else is ignored, not an error, so a replay
may pass a whole session's events. An ``event_id`` counts once; should a producer have reused an id
for different content, the earliest (then the smallest serialisation) wins, whatever the order.

How signals combine (components are keyed by the weight names of :class:`distill.spec.Weights`):

- suggestion: accepted / rejected / dismissed are exclusive; the last by ``(ts, event_id)`` counts
  (the user's final decision).
- edit: persisted / reverted are measurements of the same edit; the last one counts. Persisted is
  ``edit_persisted * fraction_remaining``; reverted is ``edit_reverted`` in full. An edit and the
  suggestion outcome both count (accepted then reverted: ``accepted + edit_reverted``).
- follow-up: ``followup_dissatisfied`` once if any follow-up was dissatisfied, ``followup_rephrase``
  once if any rephrased; both may apply.
- rating: the last one counts (a user may change their mind).
- tests: the last run counts: ``tests_passed * passed/total`` and ``tests_failed * failed/total``
  (both keys present); a run of zero tests adds no component.
- silent: ``silent`` when no user feedback event (anything but a tool result) counted.
- invalid tool calls: ``invalid_tool_call * n``, see :func:`count_invalid_tool_calls`.
- deferral: ``deferral`` when :func:`is_deferral`.

Then ``raw = fsum(components)``, ``reward = clip(scale * raw + offset)`` with the surface's
normalisation (identity if none). Clipping comes last so that the spec's bounds always hold.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from datetime import datetime, timedelta
from typing import TypeGuard
from uuid import UUID

from distill.errors import PrivacyModeEvent
from distill.samples import SAMPLE_SCHEMA_VERSION, AgentCredit, FinalisedBy, Sample, loss_mask_for, sample_id_for
from distill.spec import RewardSpec
from ingest.events import (
    EditPersistedEvent,
    EditRevertedEvent,
    EventBase,
    FollowupEvent,
    GenerationEvent,
    RatingEvent,
    SuggestionAcceptedEvent,
    SuggestionDismissedEvent,
    SuggestionRejectedEvent,
    TestsResultEvent,
    ToolResultEvent,
    event_to_json,
)
from ingest.payloads import GenerationPayload, TestsResultPayload

LATE_FEEDBACK_COUNTER = "liveloop_distill_late_feedback_total"
"""Counter the streaming app increments for each feedback event :func:`is_late` rejects."""

WORK_TASK_KINDS = frozenset({"edit", "completion"})
"""Task kinds where the user asked for work, so a bare question is a deferral."""
AGENT_SURFACE = "agent"
"""Surfaces named ``agent`` or ``agent.*`` are agents: they are expected to act, not to ask."""

Feedback = (
    SuggestionAcceptedEvent
    | SuggestionRejectedEvent
    | SuggestionDismissedEvent
    | EditPersistedEvent
    | EditRevertedEvent
    | FollowupEvent
    | RatingEvent
    | TestsResultEvent
    | ToolResultEvent
)
_FEEDBACK_CLASSES = (
    SuggestionAcceptedEvent,
    SuggestionRejectedEvent,
    SuggestionDismissedEvent,
    EditPersistedEvent,
    EditRevertedEvent,
    FollowupEvent,
    RatingEvent,
    TestsResultEvent,
    ToolResultEvent,
)
_SUGGESTION_COMPONENT = {
    SuggestionAcceptedEvent: "accepted",
    SuggestionRejectedEvent: "rejected",
    SuggestionDismissedEvent: "dismissed",
}


def _is_feedback(event: EventBase) -> TypeGuard[Feedback]:
    return isinstance(event, _FEEDBACK_CLASSES)


def is_late(generation: GenerationEvent, event: EventBase, spec: RewardSpec) -> bool:
    """Whether ``event`` arrived after its signal's window, counted from the generation's ``ts``.

    An event exactly at the end of its window is in time. Events without a window (session and
    generation events) are never late. Feedback stamped before the generation (clock skew between
    gateway and product) is in time: dropping it would lose real signals.
    """
    window = spec.windows_s.for_event_type(event.type)
    return window is not None and event.ts - generation.ts > timedelta(seconds=window)


def final_at(generation: GenerationEvent, spec: RewardSpec) -> datetime:
    """When the generation's reward becomes final if its session has not ended before: the longest window."""
    return generation.ts + timedelta(seconds=spec.windows_s.longest)


def is_deferral(generation: GenerationPayload) -> bool:
    """Whether the generation asked a question instead of doing the work it was asked for.

    True when all hold: work was expected (``task_kind`` in :data:`WORK_TASK_KINDS`, an agent
    surface, or an agent turn); the generation did nothing (no tool calls, no tool or sub-agent trajectory segment);
    the completion, stripped, ends with ``?``; and it holds no code (no ````` fence, no line indented
    by four spaces or a tab). Deliberately simple: it is watched per policy version, not trusted blindly.
    """
    agent = (
        generation.turn is not None  # an agent turn is an agent's, whatever surface it was shown on
        or generation.surface == AGENT_SURFACE
        or generation.surface.startswith(AGENT_SURFACE + ".")
    )
    if generation.task_kind not in WORK_TASK_KINDS and not agent:
        return False
    acted = bool(generation.tool_calls) or any(s.role in ("tool", "subagent") for s in generation.trajectory or [])
    text = generation.completion.strip()
    has_code = "```" in text or any(line.startswith(("    ", "\t")) for line in text.splitlines())
    return not acted and text.endswith("?") and not has_code


def count_invalid_tool_calls(
    generation: GenerationPayload, results: Iterable[ToolResultEvent], skip: Collection[int] = ()
) -> int:
    """The generation's invalid tool calls: flagged ``valid=False`` by the gateway or failed when run.

    Calls are identified by index: a call flagged invalid and also reported failed (``call_index``)
    counts once, as do several failed results for one index. A failed result without ``call_index``
    cannot be matched to a call, so each such event counts on its own. A successful result never
    clears a call the gateway flagged: a malformed call stays penalised. Calls at the indices in ``skip``
    are not counted (an agent turn's calls the gateway refused for the budget, penalised as overruns).
    """
    indices = {index for index, call in enumerate(generation.tool_calls) if call.valid is False}
    unmatched = 0
    for result in results:
        if result.payload.valid:
            continue
        if result.payload.call_index is None:
            unmatched += 1
        else:
            indices.add(result.payload.call_index)
    return len(indices - set(skip)) + unmatched


def counted_feedback(generation: GenerationEvent, events: Iterable[EventBase], spec: RewardSpec) -> list[Feedback]:
    """The events that count for the generation (see the module docstring), deduplicated, by ``(ts, event_id)``."""
    gen = generation.payload.generation_id
    candidates = [
        event
        for event in events
        if _is_feedback(event)
        and event.payload.generation_id == gen
        and event.session_id == generation.session_id
        and event.tenant == generation.tenant
        and not event.privacy_mode
        and not is_late(generation, event, spec)
    ]
    if len({_order(event) for event in candidates}) == len(candidates):
        # No two share (ts, event_id), so the serialisation below would never be compared: the same order
        # without serialising every event (only copies of one event id can share them).
        candidates.sort(key=_order)
    else:
        candidates.sort(key=lambda event: (event.ts, event.event_id, event_to_json(event)))
    seen: set[UUID] = set()
    kept: list[Feedback] = []
    for event in candidates:
        if event.event_id not in seen:
            seen.add(event.event_id)
            kept.append(event)
    return kept


def _components(feedback: list[Feedback], invalid: int, deferral: bool, spec: RewardSpec) -> dict[str, float]:
    w = spec.weights
    parts: dict[str, float] = {}
    suggestions = [e for e in feedback if isinstance(e, tuple(_SUGGESTION_COMPONENT))]
    if suggestions:
        name = _SUGGESTION_COMPONENT[type(max(suggestions, key=_order))]
        parts[name] = getattr(w, name)
    edits = [e for e in feedback if isinstance(e, EditPersistedEvent | EditRevertedEvent)]
    if edits:
        edit = max(edits, key=_order)
        if isinstance(edit, EditPersistedEvent):
            parts["edit_persisted"] = w.edit_persisted * edit.payload.fraction_remaining
        else:
            parts["edit_reverted"] = w.edit_reverted
    followups = [e.payload for e in feedback if isinstance(e, FollowupEvent)]
    if any(f.dissatisfied for f in followups):
        parts["followup_dissatisfied"] = w.followup_dissatisfied
    if any(f.rephrase for f in followups):
        parts["followup_rephrase"] = w.followup_rephrase
    ratings = [e for e in feedback if isinstance(e, RatingEvent)]
    if ratings:
        up = max(ratings, key=_order).payload.thumbs == "up"
        parts["rating_up" if up else "rating_down"] = w.rating_up if up else w.rating_down
    run = last_tests_run(feedback)
    if run is not None:
        total = run.passed + run.failed
        if total:
            parts["tests_passed"] = w.tests_passed * (run.passed / total)
            parts["tests_failed"] = w.tests_failed * (run.failed / total)
    if not any(not isinstance(e, ToolResultEvent) for e in feedback):
        parts["silent"] = w.silent
    if invalid:
        parts["invalid_tool_call"] = w.invalid_tool_call * invalid
    if deferral:
        parts["deferral"] = w.deferral
    # Adding 0.0 turns -0.0 (e.g. -0.5 * 0/4) into 0.0, so that equal rewards serialise equally.
    return {name: parts[name] + 0.0 for name in sorted(parts)}


def last_tests_run(feedback: Iterable[EventBase]) -> TestsResultPayload | None:
    """The last ``tests.result`` among the feedback (by ``(ts, event_id)``), the run that counts; ``None`` if none."""
    runs = [e for e in feedback if isinstance(e, TestsResultEvent)]
    return max(runs, key=_order).payload if runs else None


def _order(event: Feedback) -> tuple[datetime, UUID]:
    # UUIDs compare as their canonical strings do (fixed-width lower-case hex, hyphens in fixed places),
    # without the cost of writing each one out.
    return event.ts, event.event_id


def score(
    generation: GenerationEvent,
    feedback: Iterable[EventBase],
    spec: RewardSpec,
    finalised_by: FinalisedBy,
    *,
    tokenizer: str | None = None,
) -> Sample:
    """Score one generation: the sample to publish once its reward is final.

    ``feedback`` may hold any events; only those that count are used (see the module docstring).
    ``tokenizer`` names the served model's tokenizer where the caller knows it.
    Raises :class:`PrivacyModeEvent` for a privacy-mode generation and
    :class:`distill.errors.MisalignedTrajectory` when the loss mask cannot be derived.
    """
    if generation.privacy_mode:
        raise PrivacyModeEvent(f"generation {generation.payload.generation_id} is in privacy mode; drop it")
    payload = generation.payload
    counted = counted_feedback(generation, feedback, spec)
    invalid = count_invalid_tool_calls(payload, (e for e in counted if isinstance(e, ToolResultEvent)))
    deferral = is_deferral(payload)
    components = _components(counted, invalid, deferral, spec)
    norm = spec.normalisation_for(payload.surface)
    low, high = spec.clip
    reward = min(max(norm.scale * math.fsum(components.values()) + norm.offset, low), high) + 0.0
    return served_sample(
        generation,
        spec,
        reward=reward,
        components=components,
        sources={generation.event_id, *(e.event_id for e in counted)},
        finalised_by=finalised_by,
        deferral=deferral,
        invalid_tool_calls=invalid,
        tokenizer=tokenizer,
    )


def served_sample(
    generation: GenerationEvent,
    spec: RewardSpec,
    *,
    reward: float,
    components: dict[str, float],
    sources: Iterable[UUID],
    finalised_by: FinalisedBy,
    deferral: bool,
    invalid_tool_calls: int,
    tokenizer: str | None = None,
    agent: AgentCredit | None = None,
) -> Sample:
    """The sample of ``generation`` as it was served (its tokens, logprobs and loss mask), with the reward, its
    components and the ``sources`` (event ids) the caller worked out: a single turn's (:func:`score`) or an agent
    turn's (:func:`distill.trajectory.trajectory_samples`, with its trajectory's ``agent`` credit)."""
    payload = generation.payload
    return Sample(
        sample_id=sample_id_for(payload.generation_id, spec.spec_hash),
        schema_version=SAMPLE_SCHEMA_VERSION,
        generation_id=payload.generation_id,
        policy_version=payload.policy_version,
        model=payload.model,
        tokenizer=tokenizer,
        prompt=payload.prompt,
        completion=payload.completion,
        prompt_token_ids=payload.prompt_token_ids,
        completion_token_ids=payload.completion_token_ids,
        behaviour_logprobs=payload.completion_logprobs,
        loss_mask=loss_mask_for(payload),
        reward=reward,
        components=components,
        source_event_ids=sorted(set(sources)),  # UUIDs sort as their strings do
        spec_version=spec.version,
        spec_hash=spec.spec_hash,
        session_id=generation.session_id,
        user_id=generation.user_id,
        tenant=generation.tenant,
        surface=payload.surface,
        task_kind=payload.task_kind,
        finalised_by=finalised_by,
        deferral=deferral,
        invalid_tool_calls=invalid_tool_calls,
        generated_at=generation.ts,
        agent=agent,
    )
