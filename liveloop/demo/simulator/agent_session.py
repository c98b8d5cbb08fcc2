"""What the agent scenarios' sessions share: who the session is, how it starts and ends, and the gateway fields
every one of its turns carries (:mod:`~liveloop.demo.simulator.swarm_session`,
:mod:`~liveloop.demo.simulator.summary_session`, :mod:`~liveloop.demo.simulator.prune_session`).

A session is one trajectory: the product opens it (``session.started``, surface ``agent``), serves its turns
through the gateway under the session's ids, reports each turn it could not accept as a failed action, posts the
verified outcome, and closes it (``session.ended``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID, uuid4

from ingest.events import SessionEndedEvent, SessionStartedEvent, TestsResultEvent, ToolResultEvent
from ingest.payloads import (
    CheckedSpan,
    SessionEndedPayload,
    SessionStartedPayload,
    TestsResultPayload,
    ToolResultPayload,
)
from liveloop.demo.simulator.feedback import Envelope
from liveloop.demo.simulator.session import EventSink

SURFACE = "agent"
"""The surface agent sessions name (the code scenario's are the IDE's)."""
USERS = 12
"""Distinct users the sessions spread over (a user flooding feedback is a hack the audits look for)."""


@dataclass(frozen=True)
class AgentSession:
    """One agent session: its envelope (session, user, tenant) and the one trajectory it runs."""

    envelope: Envelope
    trajectory_id: UUID = field(default_factory=uuid4)

    def request(self) -> dict[str, Any]:
        """The fields of :meth:`~liveloop.demo.simulator.transport.GatewayClient.complete` every turn carries."""
        return {
            "session_id": self.envelope.session_id,
            "user_id": self.envelope.user_id,
            "tenant": self.envelope.tenant,
            "surface": SURFACE,
            "privacy": False,
        }


def start_session(sink: EventSink, session_id: str, index: int, tenant: str) -> AgentSession:
    """Open agent session ``index`` (its user is one of :data:`USERS`): send ``session.started`` and return it."""
    session = AgentSession(Envelope(session_id, f"user-{index % USERS}", tenant))
    started = SessionStartedPayload(surface=SURFACE, client="liveloop-simulator")
    sink.emit(SessionStartedEvent(**session.envelope.fields(datetime.now(UTC)), payload=started))  # type: ignore[arg-type]
    return session


def end_session(sink: EventSink, session: AgentSession) -> None:
    """Close the session: ``session.ended``, after its outcome."""
    ended = SessionEndedPayload(reason="done")
    sink.emit(SessionEndedEvent(**session.envelope.fields(datetime.now(UTC)), payload=ended))  # type: ignore[arg-type]


def turn_check_event(
    envelope: Envelope,
    generation_id: UUID,
    ts: datetime,
    *,
    passed: int,
    failed: int,
    spans: list[CheckedSpan] | None = None,
) -> TestsResultEvent:
    """The ``tests.result`` the product sends for its own check of one turn's output: ``passed`` of its checks held,
    ``failed`` did not, and ``spans``, where given, which parts of the output passed and which failed. The distiller
    adds ``turn_check`` times the pass share to that turn's reward alone, and ``span_check`` credit to each span's
    tokens (:mod:`distill.trajectory`)."""
    payload = TestsResultPayload(generation_id=generation_id, passed=passed, failed=failed, spans=spans)
    return TestsResultEvent(**envelope.fields(ts), payload=payload)  # type: ignore[arg-type]


def failed_action_event(
    envelope: Envelope, generation_id: UUID, ts: datetime, *, tool: str, error: str
) -> ToolResultEvent:
    """The ``tool.result`` (``valid`` false, no ``call_index``: it matches no call the gateway read) the product sends
    for one thing a turn did that it could not accept. The distiller charges each as an invalid tool call of that
    turn (-0.5 by default, :mod:`distill.trajectory`)."""
    payload = ToolResultPayload(generation_id=generation_id, tool=tool, valid=False, error=error)
    return ToolResultEvent(**envelope.fields(ts), payload=payload)  # type: ignore[arg-type]
