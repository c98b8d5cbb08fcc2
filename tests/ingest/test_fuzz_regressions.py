"""Regressions from fuzzing the ingest API (issue #8, tests/reliability/test_fuzz_ingest.py).

Finding: the API's OpenAPI document described ``POST /v1/events`` without a request body, a key or its
answers (the route reads its body itself, so FastAPI inferred nothing); schema-driven clients and
fuzzers could only send empty requests. The document now carries the event contract as the body.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode

from infra.credentials import ensure_credentials
from ingest.api import create_app
from ingest.events import EVENT_CLASSES
from ingest.settings import IngestSettings


def _document(tmp_path: Path, max_batch_items: int = 7) -> dict[str, Any]:
    credentials = tmp_path / "credentials.json"
    ensure_credentials(credentials)
    # The document is built when the app is created; nothing connects to Kafka before its lifespan starts.
    return create_app(IngestSettings(credentials_path=credentials, max_batch_items=max_batch_items)).openapi()


def _refs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [ref for key, value in node.items() for ref in ([value] if key == "$ref" else _refs(value))]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def test_the_openapi_document_describes_the_body_the_key_and_every_answer(tmp_path: Path) -> None:
    document = _document(tmp_path)
    operation = document["paths"]["/v1/events"]["post"]
    schemas = document["components"]["schemas"]

    event, batch = operation["requestBody"]["content"]["application/json"]["schema"]["oneOf"]
    assert operation["requestBody"]["required"] is True
    assert sorted(event["discriminator"]["mapping"]) == sorted(EVENT_CLASSES)
    assert batch == {"type": "array", "items": event, "maxItems": 7}
    assert operation["security"] == [{"tenantKey": []}]
    assert document["components"]["securitySchemes"]["tenantKey"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "The tenant's ingest key.",
    }
    assert sorted(operation["responses"]) == ["200", "400", "401", "413", "422", "503"]
    problem = {"$ref": "#/components/schemas/Problem"}
    assert operation["responses"]["401"]["content"]["application/json"]["schema"] == problem
    assert schemas["Problem"]["required"] == ["detail"]
    # Every reference resolves inside the document.
    assert {ref.rsplit("/", 1)[1] for ref in _refs(document)} <= set(schemas)


def test_schemathesis_makes_event_bodies_from_the_document(tmp_path: Path) -> None:
    operation = schemathesis.openapi.from_dict(_document(tmp_path))["/v1/events"]["POST"]
    bodies: list[Any] = []

    @settings(
        max_examples=25, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy(generation_mode=GenerationMode.POSITIVE))
    def collect(case: Case) -> None:
        bodies.append(case.body)

    collect()
    assert len(bodies) == 25
    assert all(isinstance(body, dict | list) for body in bodies)
    events = [body for body in bodies if isinstance(body, dict)] + [e for b in bodies if isinstance(b, list) for e in b]
    assert events
    assert all(event["type"] in EVENT_CLASSES for event in events)
