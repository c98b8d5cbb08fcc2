"""Traffic that remembers what was accepted, so that the accounting can prove nothing was lost.

- :class:`RecordingSink` wraps the simulator's ingest SDK client: every event ``emit`` accepted (it is in
  the SDK's journal, which survives the loop's faults) is remembered by id.
- :class:`RecordingGateway` wraps the simulator's gateway client: every completion served is remembered
  with when it was asked, when it was answered and the policy version it named.
- :class:`HttpSessions` posts short sessions (started, ended) to the ingest HTTP API at a steady rate on
  a thread, retrying what fails, and remembers every event id the API answered 202 for; now and then it
  plants a malformed event, which must land in the dead-letter topic and nowhere else.
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx

from ingest.events import SessionEndedEvent, SessionStartedEvent, parse_event
from ingest.payloads import SessionEndedPayload, SessionStartedPayload
from liveloop.demo.simulator.transport import GatewayClient, Served


class RecordingSink:
    """The SDK client, plus the ids of the events it accepted (privacy-mode events are dropped, not accepted)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.accepted: set[str] = set()
        self._lock = threading.Lock()

    def emit(self, event: Any) -> bool:
        kept = bool(self.client.emit(event))
        if kept:
            with self._lock:
                self.accepted.add(str(event.event_id))
        return kept


@dataclass(frozen=True)
class ServedRecord:
    """One completion: when it was asked and answered (wall clock, seconds) and the version it named."""

    asked_at: float
    answered_at: float
    policy_version: int
    generation_id: str
    privacy: bool


class RecordingGateway:
    """The simulator's gateway client, remembering every completion it got."""

    def __init__(self, inner: GatewayClient) -> None:
        self.inner = inner
        self.served: list[ServedRecord] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def complete(self, prompt: str, **kwargs: Any) -> Served:
        asked = time.time()
        served = self.inner.complete(prompt, **kwargs)
        record = ServedRecord(asked, time.time(), served.policy_version, served.generation_id, bool(kwargs["privacy"]))
        with self._lock:
            self.served.append(record)
        return served


GRACE_AFTER_STOP_S = 60.0
"""How long a post under way when the traffic stops keeps trying to be judged."""


@dataclass
class HttpSessions:
    """Short sessions posted to the ingest HTTP API on a thread, ``rate`` events per second in batches."""

    ingest_url: str
    api_key: str
    rate: float
    batch: int = 50
    malformed_every: int = 40
    """Every this many batches, one malformed event (a planted dead letter) rides along."""
    full_sessions: bool = False
    """Sessions shaped like real traffic (14 events, two generations with their feedback) instead of two events."""
    accepted: set[str] = field(default_factory=set)
    planted: int = 0
    """Malformed events the API judged (each left one dead letter)."""
    planted_unanswered: int = 0
    """Posts of a planted malformed event that got no judgement (a 503, a timeout, a dropped connection);
    each may still have left a dead letter (see ``ingest.api``: dead letters have no id a retry reuses)."""
    failed_posts: int = 0
    retried_posts: int = 0
    last_failure: str = ""
    """When and how the latest unanswered post attempt failed (a status and body, or a client error)."""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reliability-http-sessions", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def _run(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}", "Content-Type": "application/json"}
        with httpx.Client(timeout=10.0, headers=headers) as client:
            batches = 0
            next_at = time.monotonic()
            while not self._stop.is_set():
                events = _full_sessions(max(1, self.batch // 14)) if self.full_sessions else _sessions(self.batch // 2)
                body: list[Any] = [event.model_dump(mode="json") for event in events]
                planted = batches % self.malformed_every == self.malformed_every - 1
                if planted:
                    body.append({"type": "session.started", "session_id": "", "event_id": "not-a-uuid"})
                taken, unanswered = self._post(client, body)
                self.accepted.update(taken or ())
                self.planted += planted and taken is not None
                self.planted_unanswered += unanswered if planted else 0
                batches += 1
                next_at += len(events) / self.rate
                self._stop.wait(max(0.0, next_at - time.monotonic()))

    def _post(self, client: httpx.Client, body: list[Any]) -> tuple[set[str] | None, int]:
        """Post until the API judges the batch (it may be down a while: that is the test).

        A post under way when the traffic stops keeps trying for :data:`GRACE_AFTER_STOP_S` more: it
        counts as never answered only if the API stays unable to judge it that long, not because the
        traffic stopped during one slow or refused attempt. Returns the accepted ids (``None`` if never
        judged) and how many posts went unanswered.
        """
        give_up_at: float | None = None
        for attempt in range(600):
            try:
                response = client.post(self.ingest_url.rstrip("/") + "/v1/events", json=body)
            except httpx.HTTPError as exc:
                response, failure = None, f"{type(exc).__name__}: {exc}"
            if response is not None and response.status_code == 200:
                results = response.json()["results"]
                accepted = {r["event_id"] for r in results if r["status"] == "accepted" and r.get("stored", True)}
                return accepted, attempt
            if response is not None:
                failure = f"HTTP {response.status_code}: {response.text[:200]}"
            self.last_failure = f"{datetime.now(UTC).isoformat()} {failure}"
            self.retried_posts += attempt == 0
            if self._stop.is_set():
                give_up_at = give_up_at or time.monotonic() + GRACE_AFTER_STOP_S
                if time.monotonic() > give_up_at:
                    break
            time.sleep(0.5)
        self.failed_posts += 1
        return None, attempt + 1


def _sessions(count: int) -> list[Any]:
    """``count`` sessions of two events each, on sessions of their own."""
    events: list[Any] = []
    now = datetime.now(UTC)
    for _ in range(count):
        session = f"http-{uuid.uuid4().hex[:16]}"
        envelope = {"session_id": session, "user_id": "reliability", "ts": now}
        events.append(
            SessionStartedEvent(
                **envelope, payload=SessionStartedPayload(surface="ide.tab", client="liveloop-reliability")
            )
        )
        events.append(SessionEndedEvent(**envelope, payload=SessionEndedPayload(reason="done")))
    return events


def _full_sessions(count: int) -> list[Any]:
    """``count`` sessions shaped like the simulator's: started, two generations each followed by two tool
    results, an acceptance, the edit check and a rating, then ended (14 events, one generation in seven)."""
    events: list[Any] = []
    now = datetime.now(UTC).isoformat()
    for _ in range(count):
        session = f"load-{uuid.uuid4().hex[:16]}"
        envelope = {"session_id": session, "user_id": f"load-{uuid.uuid4().hex[:4]}", "ts": now}
        steps: list[tuple[str, dict[str, Any]]] = [
            ("session.started", {"surface": "ide.tab", "client": "liveloop-load"})
        ]
        for _turn in range(2):
            generation = str(uuid.uuid4())
            feedback = {"generation_id": generation}
            steps += [
                ("generation", {**_GENERATION, "generation_id": generation}),
                ("tool.result", {**feedback, "tool": "run_tests", "valid": True}),
                ("tool.result", {**feedback, "tool": "lint", "valid": True}),
                ("suggestion.accepted", feedback),
                ("edit.persisted", {**feedback, "fraction_remaining": 1.0, "seconds_after": 30.0}),
                ("rating", {**feedback, "thumbs": "up"}),
            ]
        steps.append(("session.ended", {"reason": "done"}))
        for kind, payload in steps:
            events.append(parse_event({**envelope, "event_id": str(uuid.uuid4()), "type": kind, "payload": payload}))
    return events


_GENERATION = {
    "model": "liveloop-policy",
    "policy_version": 0,
    "prompt": "def add(a, b):\n",
    "completion": "    return a + b;\n",
    "prompt_token_ids": [100, 101, 102],
    "completion_token_ids": [103, 104],
    "completion_logprobs": [-0.5, -0.25],
    "surface": "ide.tab",
    "task_kind": "completion",
}
