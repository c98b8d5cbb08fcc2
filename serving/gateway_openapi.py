"""The gateway's OpenAPI document: the request bodies, the liveloop headers, the answers and the Bearer key.

The completion routes read their bodies themselves (so that every error gets OpenAI's shape), so
FastAPI cannot infer the bodies from parameters and would publish operations without one. This
module completes the document FastAPI builds from the request models of :mod:`serving.openai_schema`
(with this gateway's limits on ``max_tokens``, ``n`` and the number of prompts), the ``X-Liveloop-*``
headers of :mod:`serving.emission` and the trajectory headers of :mod:`serving.turns` (and those an answer
returns: the session used, the policy version, the context budget's state) and OpenAI's error body.
Clients can generate code from it, and a schema-driven fuzzer (schemathesis) can send meaningful requests.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

from ingest.events import TENANT_PATTERN
from ingest.payloads import MAX_ID_CHARS
from serving.openai_schema import ChatCompletionRequest, CompletionRequest
from serving.settings import ServingSettings

_REF = "#/components/schemas/{model}"
_JSON = "application/json"
_ID = {"type": "string", "minLength": 1, "maxLength": MAX_ID_CHARS, "pattern": r"^[^\x00-\x1F\x7F]+$"}
_EVENT = {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
"""One server-sent event of a streamed completion: ``data`` is a JSON chunk, the last one ``[DONE]``."""
_HEADERS = [
    (
        "X-Liveloop-Session",
        _ID,
        "Session id; default: a session of its own per request. The response names the session used; send the "
        "generations' feedback under it.",
    ),
    ("X-Liveloop-User", _ID, "Pseudonymous user id; default: the body's 'user', else the gateway's default user."),
    ("X-Liveloop-Tenant", {"type": "string", "pattern": TENANT_PATTERN}, "Tenant; default: the gateway's."),
    ("X-Liveloop-Surface", {"type": "string", "pattern": r"^[a-z][a-z0-9_.-]{0,63}$"}, "Where the output is shown."),
    (
        "X-Liveloop-Task-Kind",
        {"type": "string", "pattern": r"^[a-z][a-z0-9_.-]{0,63}$"},
        "The product's kind of task, e.g. 'edit'; default 'completion' or 'chat'. The learner's reward baseline is "
        "kept per task kind.",
    ),
    ("X-Liveloop-Privacy-Mode", {"type": "string"}, "'true', '1' or 'yes': the generation event is never stored."),
    (
        "X-Liveloop-Trajectory",
        {"type": "string", "format": "uuid"},
        "Places the request's turns in this agent trajectory (or send the body's 'liveloop' object instead): the "
        "generation events carry their place, token ids and logprobs as served; a context budget may apply.",
    ),
    ("X-Liveloop-Parent-Turn", {"type": "string", "format": "uuid"}, "The turn (generation id) this one follows."),
    ("X-Liveloop-Agent", {"enum": ["orchestrator", "subagent", "single"]}, "Who serves the turn; default single."),
    ("X-Liveloop-Agent-Id", {"type": "string", "pattern": r"^[a-z][a-z0-9_.-]{0,63}$"}, "Agent instance; 'main'."),
    ("X-Liveloop-Frozen", {"enum": ["true", "false"]}, "true: a sub-agent that is not trained."),
    ("X-Liveloop-Stage", {"type": "string", "pattern": r"^[0-9]{1,4}$"}, "The orchestrator's round: 0, 1, ..."),
    (
        "X-Liveloop-Boundary",
        {"enum": ["none", "summary", "prune", "truncation"]},
        "How the turn's context was formed.",
    ),
]


class ErrorDetail(BaseModel):
    """OpenAI's error object: ``message`` says what is wrong and what to do."""

    message: str = Field(min_length=1)
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every answer other than 200 (OpenAI's shape, which the openai client turns into its exceptions)."""

    error: ErrorDetail


def document_openapi(app: FastAPI, settings: ServingSettings) -> None:
    """Complete ``app``'s OpenAPI document (built now from its routes, then cached by FastAPI)."""
    document = app.openapi()
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    document["components"]["securitySchemes"] = {
        "gatewayKey": {"type": "http", "scheme": "bearer", "description": "The gateway key."}
    }
    error = _component(ErrorBody, schemas)
    headers = [
        {"name": name, "in": "header", "required": False, "schema": schema, "description": description}
        for name, schema, description in _HEADERS
    ]

    def problem(description: str) -> dict[str, Any]:
        return {"description": description, "content": {_JSON: {"schema": error}}}

    served = {
        "description": "The completion (a JSON body, or server-sent events with 'stream': true). The body's (and "
        "every chunk's) 'liveloop' object names generation_id, generation_ids, policy_version and session_id; for a "
        "turn placed in a trajectory, trajectory_id (its turn ids are the generation ids) and, under a context "
        "budget, budget: {state, context_tokens, soft, hard, refused}.",
        "headers": {
            "X-Liveloop-Session": {
                "description": "The session the generations were filed under (the request's, or one made up for "
                "it), as the UTF-8 bytes of the id: feedback events about them must carry this session_id, or they "
                "join nothing.",
                "schema": {"type": "string", "minLength": 1},
            },
            "X-Liveloop-Policy-Version": {
                "description": "The policy version that served the request.",
                "schema": {"type": "integer", "minimum": 0},
            },
            "X-Liveloop-Budget": {
                "description": "A turn placed in a trajectory, under a context budget: ok, soft (past the soft "
                "threshold: prune or finish) or hard (tool calls other than prune_chunks are refused; see "
                "liveloop.budget in the body).",
                "schema": {"enum": ["ok", "soft", "hard"]},
            },
        },
        "content": {_JSON: {"schema": {"type": "object"}}, "text/event-stream": {"schema": _EVENT}},
    }
    for path, model in (("/v1/completions", CompletionRequest), ("/v1/chat/completions", ChatCompletionRequest)):
        operation = document["paths"][path]["post"]
        operation["security"] = [{"gatewayKey": []}]
        operation["parameters"] = headers
        body = _limited(_component(model, schemas), schemas, settings)
        operation["requestBody"] = {"required": True, "content": {_JSON: {"schema": body}}}
        operation["responses"] = {
            "200": served,
            "400": problem("Invalid request: the message names the field and the fix."),
            "401": problem("No key, or a wrong key."),
            "404": problem("The model named is not served here."),
            "413": problem("The body is over the gateway's max_request_bytes."),
            "500": problem("The engine failed."),
            "503": problem("No policy version is loaded yet."),
        }
    models = document["paths"]["/v1/models"]["get"]
    models["security"] = [{"gatewayKey": []}]
    models["responses"]["401"] = problem("No key, or a wrong key.")
    document["paths"]["/readyz"]["get"]["responses"]["503"] = {"description": "No policy version is loaded yet."}
    document["paths"]["/metrics"]["get"]["responses"]["200"]["content"] = {"text/plain": {"schema": {"type": "string"}}}


def _component(model: type[BaseModel], schemas: dict[str, Any]) -> dict[str, Any]:
    """Publish ``model`` (and the models it uses) as components; return a reference to it."""
    schema = model.model_json_schema(ref_template=_REF)
    schemas.update(schema.pop("$defs", {}))
    schemas[model.__name__] = schema
    return {"$ref": _REF.format(model=model.__name__)}


def _limited(reference: dict[str, Any], schemas: dict[str, Any], settings: ServingSettings) -> dict[str, Any]:
    """Write what this gateway serves into the request model's component: its one model, its limits, and the
    OpenAI options it takes only at their neutral values. Return the reference unchanged."""
    properties = schemas[reference["$ref"].rsplit("/", 1)[1]]["properties"]
    properties["model"]["enum"] = [settings.model_name]
    for name in ("frequency_penalty", "presence_penalty"):
        properties[name]["anyOf"] = [{"const": 0}, {"type": "null"}]
    properties["logit_bias"]["anyOf"][0]["maxProperties"] = 0
    stop = {"type": "string", "minLength": 1}
    properties["stop"]["anyOf"] = [stop, {"type": "array", "items": stop, "maxItems": 4}, {"type": "null"}]
    if "echo" in properties:
        properties["echo"]["const"] = False
        properties["suffix"]["anyOf"][0]["maxLength"] = 0
        properties["best_of"]["anyOf"] = [{"const": 1}, {"type": "null"}]
    for name in ("max_tokens", "max_completion_tokens"):
        if name in properties:
            _integer_branch(properties[name])["maximum"] = settings.max_tokens_limit
    properties["n"]["maximum"] = min(properties["n"].get("maximum", settings.max_prompts), settings.max_prompts)
    for branch in properties.get("prompt", {}).get("anyOf", []):
        if branch.get("type") == "array":
            branch["maxItems"] = settings.max_prompts
    return reference


def _integer_branch(prop: dict[str, Any]) -> dict[str, Any]:
    """The integer schema of an optional integer property (``anyOf: [integer, null]``)."""
    return next(branch for branch in prop.get("anyOf", [prop]) if branch.get("type") == "integer")
