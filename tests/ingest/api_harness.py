"""The HTTP ingest API under test: a valid event factory, the running app (``Api``) and its dead letters.
The fixtures that start an app are in ``tests/ingest/conftest.py``."""

from __future__ import annotations

import json
import uuid
from typing import Any

from fastapi.testclient import TestClient
from kafka.consumer.fetcher import ConsumerRecord

from ingest.dead_letters import DeadLetter
from ingest.settings import IngestSettings
from tests.topic_reader import read_topic

GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5" * 3 + "f6G7h8"  # built by concatenation: no scanner sees a real token
AWS_KEY_ID = "AKIA" + "QZ7TWV3XKP2M9RJD"
OTHER_TENANT = "acme"
GENERATION_ID = "0b7e6f7e-2f4a-4c1e-9d51-5b1f3c1e8a01"


# ---------------------------------------------------------------------------------------------- helpers


def event(kind: str = "suggestion.accepted", session: str = "sess-1", **envelope: Any) -> dict[str, Any]:
    """A valid event of ``kind`` as decoded JSON, with a fresh event_id."""
    payloads: dict[str, dict[str, Any]] = {
        "suggestion.accepted": {"generation_id": GENERATION_ID},
        "rating": {"generation_id": GENERATION_ID, "thumbs": "up"},
        "session.started": {"surface": "ide.tab", "client": "acme-vscode"},
        "generation": {
            "generation_id": GENERATION_ID,
            "model": "tiny",
            "policy_version": 3,
            "prompt": "def add(a, b):\n",
            "completion": "    return a + b\n",
            "completion_token_ids": [4, 5],
            "completion_logprobs": [-0.25, -1.5],
            "surface": "ide.tab",
        },
    }
    data: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "type": kind,
        "ts": "2025-01-31T12:00:00Z",
        "session_id": session,
        "user_id": "user-1",
        "payload": payloads[kind],
    }
    return data | envelope


def dead_letters(bootstrap: str, topic: str) -> list[DeadLetter]:
    return [DeadLetter.model_validate_json(record.value) for record in read_topic(bootstrap, topic)]


class Api:
    """One running app, its topics and keys."""

    def __init__(self, client: TestClient, settings: IngestSettings, keys: dict[str, str]) -> None:
        self.client = client
        self.settings = settings
        self.keys = keys

    def post(self, body: object, tenant: str = "default", raw: bytes | None = None) -> Any:
        content = raw if raw is not None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.keys[tenant]}", "Content-Type": "application/json"}
        return self.client.post("/v1/events", content=content, headers=headers)

    def events(self) -> list[ConsumerRecord]:
        return read_topic(self.settings.bootstrap, self.settings.events_topic)

    def letters(self) -> list[DeadLetter]:
        return dead_letters(self.settings.bootstrap, self.settings.dlq_topic)

    def metric(self, name: str, **labels: str) -> float:
        wanted = name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "")
        for line in self.client.get("/metrics").text.splitlines():
            if line.startswith(wanted + " "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0
