"""One simulated session, start to end: the product's events around the gateway's completions.

The timeline of a session (every random draw from the session's own ``random.Random``, so that a run repeats):

1. ``session.started``;
2. a few completion requests through the gateway (the gateway emits each ``generation`` event itself); after
   each, the user looks at it (``think_s``) and reacts (:func:`liveloop.demo.simulator.users.react`): tool results,
   accepted / rejected / dismissed, maybe a dissatisfied follow-up, after which they ask again;
3. ``edit_check_delay_s`` after an acceptance, the edit check (persisted or reverted) and any rating;
4. ``session.ended`` once every later event went out (rewards become final then, so nothing may follow it).

What else a session may carry, drawn per session: privacy mode (every event flagged, the gateway told by a
header, so the SDK drops them all), a pasted secret (in the first prompt's context line and in the error text
of invalid tool calls), one malformed event posted to the ingest API.
"""

from __future__ import annotations

import heapq
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol
from uuid import UUID, uuid4

import httpx
import openai

from ingest.events import EventBase, SessionEndedEvent, SessionStartedEvent
from ingest.payloads import SessionEndedPayload, SessionStartedPayload
from liveloop.demo.simulator.feedback import Envelope, immediate_events, later_events
from liveloop.demo.simulator.language import make_prompt, parse
from liveloop.demo.simulator.planted import malformed_event, plant_secret
from liveloop.demo.simulator.profiles import profile_by_name
from liveloop.demo.simulator.settings import SimulatorSettings
from liveloop.demo.simulator.summary import Recorder
from liveloop.demo.simulator.transport import GatewayClient, IngestPoster
from liveloop.demo.simulator.users import Reaction, react

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """Where the product's events go: :class:`ingest.client.Client` (False: dropped for privacy)."""

    def emit(self, event: Any) -> bool: ...


@dataclass
class Wiring:
    """What every session of a run shares."""

    settings: SimulatorSettings
    gateway: GatewayClient
    sink: EventSink
    ingest: IngestPoster | None
    recorder: Recorder
    run_id: str = field(default_factory=lambda: uuid4().hex[:8])
    started: float = field(default_factory=time.monotonic)
    stopping: threading.Event = field(default_factory=threading.Event)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def session_rng(seed: int, index: int) -> random.Random:
    """The RNG of session ``index`` of a run with ``seed`` (string seeds hash the same in every process)."""
    return random.Random(f"liveloop-simulator:{seed}:{index}")  # noqa: S311 - repeatable, not cryptography


def pick_profile(mix: dict[str, float], rng: random.Random) -> str:
    """A profile name drawn from ``mix`` (weights), in sorted-name order so that a mix repeats."""
    names = sorted(mix)
    return rng.choices(names, weights=[mix[n] for n in names])[0]


def _jitter(rng: random.Random, mean: float) -> float:
    return rng.uniform(0.5 * mean, 1.5 * mean) if mean > 0 else 0.0


@dataclass(frozen=True)
class _Pending:
    """An edit check or rating still to send; its events are built when due, with the real times."""

    generation_id: UUID
    reaction: Reaction
    accepted_at: float


def _flush_due(
    w: Wiring,
    envelope: Envelope,
    later: list[tuple[float, int, _Pending]],
    emit: Callable[[EventBase], None],
    *,
    block: bool,
) -> None:
    """Send the later events that are due; with ``block``, wait for all of them (unless the run is stopping)."""
    while later:
        due, _, pending = later[0]
        wait = due - time.monotonic()
        if wait > 0 and not block:
            return
        if wait > 0:
            # A stopping run does not wait: the session must still end, so what is left goes out now.
            w.stopping.wait(wait)
        heapq.heappop(later)
        now = time.monotonic()
        for event in later_events(
            envelope, pending.generation_id, pending.reaction, datetime.now(UTC), now - pending.accepted_at
        ):
            emit(event)


def _send_malformed(
    w: Wiring, rng: random.Random, session_id: str, user_id: str, generation_id: str, private: bool
) -> None:
    what, body = malformed_event(rng, session_id, user_id, generation_id, private)
    if w.ingest is None:
        w.recorder.malformed(sent=False, dead_lettered=False)
        return
    try:
        rejected = w.ingest.post_malformed(body)
    except httpx.HTTPError as exc:
        log.warning("session %s: could not post a malformed event (%s): %s", session_id, what, exc)
        w.recorder.malformed(sent=False, dead_lettered=False)
        return
    w.recorder.malformed(sent=True, dead_lettered=rejected)


def run_session(w: Wiring, index: int) -> None:
    """Run session ``index`` to its end; gateway failures are counted and end the session early."""
    s = w.settings
    rng = session_rng(s.seed, index)
    profile = profile_by_name(pick_profile(s.mix(), rng))
    # The run id keeps two runs with one seed from sharing session ids; everything drawn still repeats.
    session_id = f"sim-{w.run_id}-{index}"
    user_id = f"{profile.name}-{rng.randrange(s.users_per_profile)}"
    privacy = rng.random() < s.privacy_share
    secret = plant_secret(rng) if rng.random() < s.secret_share else None
    # A private session's malformed event is dead-lettered too, keeping nothing of the session: the leak scan checks.
    malformed = rng.random() < s.malformed_share
    envelope = Envelope(session_id, user_id, s.tenant, privacy)
    w.recorder.session(profile.name, session_id, privacy)
    if secret is not None:
        w.recorder.secret(secret[0], secret[1], session_id, index)

    def emit(event: EventBase) -> None:
        w.recorder.event(event.type, w.sink.emit(event))

    emit(
        SessionStartedEvent(
            **envelope.fields(datetime.now(UTC)),  # type: ignore[arg-type]
            payload=SessionStartedPayload(
                surface=s.surface, client="liveloop-simulator", editor="vscode", repo_language="liveloop"
            ),
        )
    )
    later: list[tuple[float, int, _Pending]] = []  # (due, turn, what): edit checks and ratings, soonest first
    requests = rng.randint(s.min_requests, s.max_requests)
    prompt = make_prompt(rng, profile.corpus_mix)
    if secret is not None:
        prompt = f"{secret[2]}\n{prompt}"
    reason = "done"
    for turn in range(requests):
        if w.stopping.is_set():
            reason = "stopped"
            break
        try:
            served = w.gateway.complete(
                prompt,
                session_id=session_id,
                user_id=user_id,
                tenant=s.tenant,
                surface=s.surface,
                privacy=privacy,
                max_tokens=s.max_tokens,
                temperature=s.temperature,
                seed=rng.randrange(2**31),
            )
        except openai.OpenAIError as exc:
            w.recorder.error()
            log.warning("session %s: the gateway failed (%s); ending the session", session_id, exc)
            reason = "gateway error"
            break
        at = w.elapsed()
        time.sleep(_jitter(rng, s.think_s))
        reaction = react(profile, served.text, rng, elapsed_s=at, fickle_period_s=s.fickle_period_s)
        generation_id = UUID(served.generation_id)
        w.recorder.served(
            at,
            served.policy_version,
            served.generation_id,
            accepted=reaction.outcome == "accepted",
            preferred=reaction.preferred,
            invalid_tools=sum(1 for _, valid in reaction.tool_results if not valid),
            privacy=privacy,
            completion=served.text,
            well_formed=parse(served.text).well_formed,
        )
        tool_error = f"tool failed; env had {secret[1]}" if secret is not None else None
        now = datetime.now(UTC)
        for event in immediate_events(envelope, generation_id, reaction, now, tool_error):
            emit(event)
        if malformed and turn == 0:
            _send_malformed(w, rng, session_id, user_id, served.generation_id, privacy)
        if reaction.edit is not None or reaction.rating is not None:
            due = time.monotonic() + _jitter(rng, s.edit_check_delay_s)
            heapq.heappush(later, (due, turn, _Pending(generation_id, reaction, time.monotonic())))
        _flush_due(w, envelope, later, emit, block=False)
        if not reaction.ask_again:
            prompt = make_prompt(rng, profile.corpus_mix)
        time.sleep(_jitter(rng, s.gap_s))
    _flush_due(w, envelope, later, emit, block=True)
    emit(
        SessionEndedEvent(
            **envelope.fields(datetime.now(UTC)),  # type: ignore[arg-type]
            payload=SessionEndedPayload(reason=reason),
        )
    )
