"""The distiller's Prometheus metrics, on a registry of their own; each guard has its own counter."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from distill.guards import (
    DEFERRALS_COUNTER,
    DUPLICATE_EVENTS_COUNTER,
    INVALID_TOOL_CALLS_COUNTER,
    SESSION_CAP_COUNTER,
    USER_CAP_COUNTER,
)
from distill.reward import LATE_FEEDBACK_COUNTER
from distill.trajectory import GUARDS, TrajectoryCredit

UNJOINED_FEEDBACK_COUNTER = "liveloop_distill_unjoined_feedback_total"
"""Feedback events that named a generation their session never had (each one is dead-lettered)."""
WITHOUT_FEEDBACK_COUNTER = "liveloop_distill_generations_without_feedback_total"
"""Generations whose reward became final with no feedback event at all."""

TRAJECTORIES_COUNTER = "liveloop_distill_trajectories_total"
"""Agent trajectories finalised, labelled by ``finalised_by`` (outcome or timeout)."""
AGENT_PRUNES_COUNTER = "liveloop_distill_agent_prunes_total"
"""Turns of finalised trajectories whose context was formed after a prune."""
AGENT_GUARD_COUNTERS = {guard: f"liveloop_distill_agent_{guard}_total" for guard in GUARDS}
"""Per agent guard (:data:`distill.trajectory.GUARDS`): finalised trajectories on which it fired (metric > 0)."""

REGISTRY = CollectorRegistry()
_BY_VERSION = ("policy_version",)


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    # prometheus-client appends "_total" to counters itself.
    return Counter(name.removesuffix("_total"), doc, labels, registry=REGISTRY)


METRICS = SimpleNamespace(
    events=_counter("liveloop_distill_events_total", "Events applied to session state."),
    dead_letters=_counter("liveloop_distill_dead_letters_total", "Events sent to the dead-letter topic."),
    duplicates=_counter(DUPLICATE_EVENTS_COUNTER, "Duplicate events dropped."),
    privacy_dropped=_counter("liveloop_distill_privacy_dropped_total", "Privacy-mode events dropped."),
    late_feedback=_counter(LATE_FEEDBACK_COUNTER, "Feedback that came after its generation was final."),
    samples_scored=_counter("liveloop_distill_samples_scored_total", "Generations scored."),
    samples_published=_counter("liveloop_distill_samples_published_total", "Samples published."),
    samples_republished=_counter(
        "liveloop_distill_samples_republished_total", "Samples published again from an outbox after a start."
    ),
    session_capped=_counter(SESSION_CAP_COUNTER, "Samples dropped by the per-session cap."),
    user_capped=_counter(USER_CAP_COUNTER, "Samples dropped by the per-user cap."),
    deferrals=_counter(DEFERRALS_COUNTER, "Deferrals, by policy version.", _BY_VERSION),
    invalid_tool_calls=_counter(
        INVALID_TOOL_CALLS_COUNTER, "Invalid tool calls penalised, by policy version.", _BY_VERSION
    ),
    generations=_counter("liveloop_distill_generations_total", "Generations scored, by policy version.", _BY_VERSION),
    unjoined_feedback=_counter(
        UNJOINED_FEEDBACK_COUNTER, "Feedback that joined no generation of its session (sent to the dead-letter topic)."
    ),
    without_feedback=_counter(WITHOUT_FEEDBACK_COUNTER, "Generations finalised with no feedback at all."),
    trajectories=_counter(TRAJECTORIES_COUNTER, "Agent trajectories finalised, by how.", ("finalised_by",)),
    agent_prunes=_counter(AGENT_PRUNES_COUNTER, "Agent turns whose context was formed after a prune."),
)
AGENT_GUARDS = {
    guard: _counter(name, f"Agent trajectories on which the {guard} guard fired.")
    for guard, name in AGENT_GUARD_COUNTERS.items()
}


def count_trajectories(credits: list[TrajectoryCredit]) -> None:
    """Count finalised trajectories, their prunes and the guards that fired on them."""
    for how in ("outcome", "timeout"):
        if finished := sum(credit.finalised_by == how for credit in credits):
            METRICS.trajectories.labels(how).inc(finished)
    METRICS.agent_prunes.inc(sum(credit.prunes for credit in credits))
    for guard, counter in AGENT_GUARDS.items():
        if fired := sum(credit.guards[guard] > 0 for credit in credits):
            counter.inc(fired)


def agent_guards() -> dict[str, int]:
    """Agent trajectories finalised and, per guard, those it fired on, since this process started (``/status``)."""
    finished = {
        how: int(REGISTRY.get_sample_value(TRAJECTORIES_COUNTER, {"finalised_by": how}) or 0)
        for how in ("outcome", "timeout")
    }
    guards = {guard: int(REGISTRY.get_sample_value(name) or 0) for guard, name in AGENT_GUARD_COUNTERS.items()}
    return {"trajectories": sum(finished.values()), **guards}


def joins() -> dict[str, int]:
    """How well feedback joins its generations, since this process started (the distiller's ``/status``)."""
    return {
        "unjoined_feedback": int(REGISTRY.get_sample_value(UNJOINED_FEEDBACK_COUNTER) or 0),
        "generations_without_feedback": int(REGISTRY.get_sample_value(WITHOUT_FEEDBACK_COUNTER) or 0),
    }


def render() -> tuple[bytes, str]:
    """The metrics in Prometheus text format, with its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
