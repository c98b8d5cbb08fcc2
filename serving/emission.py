"""Who asked (session, user, tenant, surface) and the ``generation`` event every completion becomes.

Request headers, and the defaults when one is missing:

- ``X-Liveloop-Session``: the session id. Default ``gateway-<generation_id>`` of the request's first
  choice: a request without one is a session of its own. The canary router sees ``None`` then.
  Either way the response names the session used (``X-Liveloop-Session`` header, ``liveloop.session_id``);
  feedback about these generations must be sent under it, or it joins nothing (the distiller
  dead-letters it).
- ``X-Liveloop-User``: the pseudonymous user id. Default the OpenAI body's ``user`` field, else
  ``ServingSettings.default_user`` (``anonymous``).
- ``X-Liveloop-Tenant``: default ``ServingSettings.default_tenant`` (``default``).
- ``X-Liveloop-Surface``: where the output is shown, e.g. ``ide.tab``. Default
  ``ServingSettings.default_surface`` (``api``).
- ``X-Liveloop-Task-Kind``: the product's own name for the kind of task, e.g. ``edit`` or ``lookup.batch``.
  Default ``completion`` (``/v1/completions``) or ``chat`` (``/v1/chat/completions``). The learner keeps a reward
  baseline per task kind (:mod:`learner.baseline`), so kinds whose rewards differ by nature (a one-item lookup
  against a batch of five) each have their advantage taken against their own mean; off an agent surface, only
  ``edit`` and ``completion`` count a bare question as a deferral (:data:`distill.reward.WORK_TASK_KINDS`).
- ``X-Liveloop-Privacy-Mode: true``: the event is marked privacy mode; the SDK drops it unsent.

A header that the event contract would refuse (control characters, too long, a bad tenant name) is
refused with 400 before anything runs, so that emission can never be the part that fails.

Emission never blocks or fails a response: :meth:`GenerationEmitter.emit` hands the event to the
ingest SDK (one append to its on-disk journal; a thread sends it to Kafka) and only counts and logs
whatever goes wrong there.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from ingest.events import TENANT_PATTERN, GenerationEvent
from ingest.payloads import MAX_ID_CHARS, GenerationPayload, ToolCall, TurnPlace
from serving.engine import Generation
from serving.errors import InvalidRequest
from serving.metrics import GatewayMetrics
from serving.settings import ServingSettings

log = logging.getLogger(__name__)

_ID = re.compile(r"^[^\x00-\x1F\x7F]+$")
_TENANT = re.compile(TENANT_PATTERN)
_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
"""A surface's or a task kind's form, the event contract's ``Identifier``."""


class EventSink(Protocol):
    """Where events go: :class:`ingest.client.Client` (``emit`` journals and returns at once)."""

    def emit(self, event: Any) -> bool: ...


@dataclass(frozen=True)
class RequestContext:
    """The caller of one request, from its headers (see the module docstring)."""

    session_id: str | None
    user_id: str
    tenant: str
    surface: str
    privacy_mode: bool
    task_kind: str | None = None
    """The ``X-Liveloop-Task-Kind`` header; None: the endpoint's own kind."""

    @classmethod
    def from_headers(cls, headers: Any, body_user: str | None, settings: ServingSettings) -> RequestContext:
        """Read and check the liveloop headers; InvalidRequest names a bad one."""
        session = _header(headers, "X-Liveloop-Session")
        named_user = _header(headers, "X-Liveloop-User")
        user = named_user or body_user or settings.default_user
        tenant = _header(headers, "X-Liveloop-Tenant") or settings.default_tenant
        surface = _header(headers, "X-Liveloop-Surface") or settings.default_surface
        if session is not None:
            _check_id("X-Liveloop-Session", session)
        _check_id("X-Liveloop-User" if named_user else "user", user)
        if not _TENANT.match(tenant):
            raise InvalidRequest(f"X-Liveloop-Tenant {tenant[:80]!r} must match {TENANT_PATTERN}")
        if not _NAME.match(surface):
            raise InvalidRequest(f"X-Liveloop-Surface {surface[:80]!r} must be a lower-case name such as 'ide.tab'")
        task_kind = _header(headers, "X-Liveloop-Task-Kind")
        if task_kind is not None and not _NAME.match(task_kind):
            raise InvalidRequest(
                f"X-Liveloop-Task-Kind {task_kind[:80]!r} must be a lower-case name such as 'edit' or 'lookup.batch'",
                param="X-Liveloop-Task-Kind",
            )
        privacy = (headers.get("x-liveloop-privacy-mode") or "").strip().lower() in ("1", "true", "yes")
        return cls(session or None, user, tenant, surface, privacy, task_kind)


def _storable(text: str) -> str:
    """``text`` with each NUL as U+FFFD. The audit store cannot keep a NUL, so ingest refuses an event
    holding one; a prompt may hold one, and a byte-level model may write one, yet the completion was
    served and must become a sample. Its token ids keep the exact sequence the model read and wrote."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _header(headers: Any, name: str) -> str | None:
    """A header's value as UTF-8 text: Starlette reads header bytes as latin-1, so a user id such as
    'zoë' sent as UTF-8 would otherwise arrive as 'zoÃ«' (and be stored so)."""
    value = headers.get(name.lower())
    if value is None:
        return None
    try:
        text: str = value.encode("latin-1").decode("utf-8")
    except UnicodeError as exc:
        raise InvalidRequest(f"{name} is not valid UTF-8; send the header's value as UTF-8", param=name) from exc
    return text


def _check_id(name: str, value: str) -> None:
    if not value or len(value) > MAX_ID_CHARS or not _ID.match(value):
        raise InvalidRequest(f"{name} {value[:80]!r} must be 1-{MAX_ID_CHARS} printable characters", param=name)


class GenerationEmitter:
    """Turns a served completion into a ``generation`` event and hands it to the SDK, never raising."""

    def __init__(self, sink: EventSink, model_name: str, metrics: GatewayMetrics) -> None:
        self.sink = sink
        self.model_name = model_name
        self.metrics = metrics

    def emit(
        self,
        context: RequestContext,
        session_id: str,
        generation_id: UUID,
        prompt: str,
        generation: Generation,
        task_kind: str,
        latency_ms: float,
        tool_calls: list[ToolCall] | None = None,
        turn: TurnPlace | None = None,
    ) -> None:
        """Emit one generation event (with the tool calls read from it and its place in a trajectory, if any);
        failures are counted in metrics and logged, never raised."""
        try:
            payload = GenerationPayload(
                generation_id=generation_id,
                model=self.model_name,
                policy_version=generation.policy_version,
                prompt=_storable(prompt),
                completion=_storable(generation.text),
                prompt_token_ids=generation.prompt_token_ids,
                completion_token_ids=generation.token_ids,
                completion_logprobs=generation.logprobs,
                latency_ms=latency_ms,
                surface=context.surface,
                task_kind=task_kind,
                tool_calls=tool_calls or [],
                turn=turn,
            )
            event = GenerationEvent(
                session_id=session_id,
                user_id=context.user_id,
                tenant=context.tenant,
                privacy_mode=context.privacy_mode,
                payload=payload,
            )
            self.sink.emit(event)
        except (
            Exception
        ) as exc:  # the SDK's BackPressure, a contract violation, a disk error: the answer goes out anyway
            self.metrics.emit_failures.inc()
            if context.privacy_mode:
                # A validation error quotes its input (the session, the user, the text): for a private
                # session the log keeps only the error's kind, as its dead letter would.
                log.warning(
                    "could not emit the generation event %s of a privacy-mode session: %s (details withheld)",
                    generation_id,
                    type(exc).__name__,
                )
            else:
                log.warning("could not emit the generation event %s", generation_id, exc_info=True)
