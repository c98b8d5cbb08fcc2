"""The ingest API's OpenAPI document: what ``POST /v1/events`` takes and answers, and the Bearer key it needs.

The route reads its body itself (so that every rejection gets the API's own reason and a dead letter),
so FastAPI cannot infer the body from a parameter and would publish an operation without one. This
module completes the document FastAPI builds: the request body is the event contract itself (one
event or a batch, from :data:`ingest.events.Event`), the answers are described by the small models
below, and every ``/v1`` operation requires ``Authorization: Bearer <tenant key>``. Clients can
generate code from it, and a schema-driven fuzzer (schemathesis) can send meaningful requests.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, Field, TypeAdapter

from ingest.events import Event

_REF = "#/components/schemas/{model}"
_EVENTS = "/v1/events"
_JSON = "application/json"


class ItemResult(BaseModel):
    """The fate of one event of a request, in request order."""

    index: int = Field(ge=0, description="Position of the event in the batch (0 for a single event).")
    status: Literal["accepted", "rejected"]
    event_id: str | None = Field(default=None, description="The accepted event's id.")
    stored: bool | None = Field(default=None, description="false for privacy-mode events: acknowledged, not stored.")
    reason: str | None = Field(default=None, description="Why the event was rejected, naming the fix.")
    field: str | None = Field(default=None, description="The rejected event's offending field, when one is known.")


class IngestAnswer(BaseModel):
    """The answer to a processed request: every event's result and the counts."""

    results: list[ItemResult]
    accepted: int = Field(ge=0)
    rejected: int = Field(ge=0)


class Problem(BaseModel):
    """The answer to a request rejected as a whole; ``detail`` says why and what to do."""

    detail: str = Field(min_length=1)


def document_openapi(app: FastAPI, max_batch_items: int) -> None:
    """Complete ``app``'s OpenAPI document (built now from its routes, then cached by FastAPI)."""
    document = app.openapi()
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    event = _schema(TypeAdapter(Event), schemas)
    answer = _schema(TypeAdapter(IngestAnswer), schemas)
    problem = _schema(TypeAdapter(Problem), schemas)
    document["components"]["securitySchemes"] = {
        "tenantKey": {"type": "http", "scheme": "bearer", "description": "The tenant's ingest key."}
    }
    batch = {"type": "array", "items": event, "maxItems": max_batch_items}

    def json_answer(description: str, schema: dict[str, Any]) -> dict[str, Any]:
        return {"description": description, "content": {_JSON: {"schema": schema}}}

    operation = document["paths"][_EVENTS]["post"]
    operation["security"] = [{"tenantKey": []}]
    operation["requestBody"] = {
        "required": True,
        "description": "One event (a JSON object) or a batch (a JSON array of events).",
        "content": {_JSON: {"schema": {"oneOf": [event, batch]}}},
    }
    operation["responses"] = {
        "200": json_answer("A batch was processed (some events may be rejected), or one event was accepted.", answer),
        "400": json_answer("The body is not UTF-8, not JSON, nested too deep, or neither object nor array.", problem),
        "401": json_answer("No key, or an unknown key; nothing was read or stored.", problem),
        "413": json_answer("The body is over the size limit, or the batch over the item limit.", problem),
        "422": json_answer("The single event sent was rejected (its reason is in the result).", answer),
        "503": json_answer("Kafka is unavailable; nothing was accepted; retry after Retry-After seconds.", problem),
    }
    probes = document["paths"]
    probes["/readyz"]["get"]["responses"]["503"] = {"description": "Kafka is not connected or a topic is missing."}
    probes["/metrics"]["get"]["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}


def _schema(adapter: TypeAdapter[Any], schemas: dict[str, Any]) -> dict[str, Any]:
    """The adapter's JSON Schema, its definitions moved into the document's components."""
    schema = adapter.json_schema(ref_template=_REF)
    schemas.update(schema.pop("$defs", {}))
    if "title" in schema and schema.get("type") == "object":
        # A model: published as a component of its own and referred to.
        name = schema["title"]
        schemas[name] = schema
        return {"$ref": _REF.format(model=name)}
    return schema
