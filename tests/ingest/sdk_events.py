"""Deterministic valid events for the SDK tests: a session start and generations with feedback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

from ingest.events import Event, parse_event


def event_id(seed: str, i: int) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"liveloop-test/{seed}/{i}")


def session_events(n: int, seed: str, sessions: int = 97) -> Iterator[Event]:
    """``n`` events over ``sessions`` sessions, with ids reproducible from ``seed``."""
    for i in range(n):
        session = f"{seed}-s{i % sessions}"
        common = {"event_id": str(event_id(seed, i)), "session_id": session, "user_id": f"u{i % 13}"}
        if i % 3 == 0:
            yield parse_event({**common, "type": "session.started", "payload": {"surface": "ide.tab", "client": "t"}})
        else:
            gen = str(event_id(seed + "-gen", i))
            yield parse_event(
                {
                    **common,
                    "type": "generation",
                    "payload": {
                        "generation_id": gen,
                        "model": "tiny",
                        "policy_version": 1,
                        "prompt": f"def f{i}(x):\n    ",
                        "completion": "return x + 1\n",
                        "surface": "ide.tab",
                    },
                }
            )
