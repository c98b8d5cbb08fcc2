"""Turning a user's :class:`~liveloop.demo.simulator.users.Reaction` into the feedback events a product would send.

Pure: the caller gives the envelope (session, user, tenant, privacy flag) and the times; nothing here sleeps,
sends or draws at random. The session loop (:mod:`liveloop.demo.simulator.session`) sends the events of the
"immediate" stage right after the user looked at the completion and the "later" stage (the edit check, a
rating) after a delay, compressed from minutes to seconds in the demo.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from ingest.events import (
    EditPersistedEvent,
    EditRevertedEvent,
    EventBase,
    FollowupEvent,
    RatingEvent,
    SuggestionAcceptedEvent,
    SuggestionDismissedEvent,
    SuggestionRejectedEvent,
    ToolResultEvent,
)
from ingest.payloads import EditPayload, FollowupPayload, RatingPayload, SuggestionPayload, ToolResultPayload
from liveloop.demo.simulator.users import Reaction


@dataclass(frozen=True)
class Envelope:
    """The envelope fields every event of one session shares."""

    session_id: str
    user_id: str
    tenant: str = "default"
    privacy_mode: bool = False

    def fields(self, ts: datetime) -> dict[str, object]:
        """Keyword arguments for an event class."""
        return {
            "session_id": self.session_id,
            "user_id": self.user_id,
            "tenant": self.tenant,
            "privacy_mode": self.privacy_mode,
            "ts": ts,
        }


def immediate_events(
    envelope: Envelope, generation_id: UUID, reaction: Reaction, ts: datetime, tool_error: str | None = None
) -> list[EventBase]:
    """What follows at once: the tool runs' results, the suggestion's outcome, a follow-up.

    ``tool_error`` is the error text of an invalid tool call (the runner may plant a secret in it).
    """
    events: list[EventBase] = []
    for index, (tool, valid) in enumerate(reaction.tool_results):
        error = None if valid else (tool_error or f"tool {tool}: malformed call")
        payload = ToolResultPayload(generation_id=generation_id, tool=tool, valid=valid, error=error, call_index=index)
        events.append(ToolResultEvent(**envelope.fields(ts), payload=payload))  # type: ignore[arg-type]
    suggestion = SuggestionPayload(generation_id=generation_id)
    outcome_class = {
        "accepted": SuggestionAcceptedEvent,
        "rejected": SuggestionRejectedEvent,
        "dismissed": SuggestionDismissedEvent,
    }[reaction.outcome]
    events.append(outcome_class(**envelope.fields(ts), payload=suggestion))
    if reaction.followup is not None:
        followup = FollowupPayload(
            generation_id=generation_id,
            dissatisfied=reaction.followup.dissatisfied,
            rephrase=reaction.followup.rephrase,
        )
        events.append(FollowupEvent(**envelope.fields(ts), payload=followup))  # type: ignore[arg-type]
    return events


def later_events(
    envelope: Envelope, generation_id: UUID, reaction: Reaction, ts: datetime, seconds_after: float
) -> list[EventBase]:
    """What follows later: the edit check of an accepted edit (``seconds_after`` its acceptance), a rating."""
    events: list[EventBase] = []
    if reaction.edit is not None:
        payload = EditPayload(
            generation_id=generation_id,
            fraction_remaining=reaction.edit.fraction_remaining,
            seconds_after=max(0.0, seconds_after),
        )
        edit_class = EditPersistedEvent if reaction.edit.persisted else EditRevertedEvent
        events.append(edit_class(**envelope.fields(ts), payload=payload))  # type: ignore[arg-type]
    if reaction.rating is not None:
        rating = RatingPayload(generation_id=generation_id, thumbs=reaction.rating)
        events.append(RatingEvent(**envelope.fields(ts), payload=rating))  # type: ignore[arg-type]
    return events
