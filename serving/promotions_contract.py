"""The contract of the ``liveloop.promotions`` topic (key: the model name).

Owned by serving; written by the gate, the operator CLI and the dashboard (decisions) and by the
hot-swap controller (``swap-failed``); read by every serving instance. Light on purpose: pydantic only.

Two kinds of value share the topic, told apart by ``kind``:

- :class:`PromotionEvent` (``kind="decision"``): one row of the ``promotions`` history table, after
  it was committed: ``promote`` and ``rollback`` moved the ``champion`` alias from ``from_version``
  to ``to_version`` (MLflow model versions, which are the checkpoints' policy versions: one number);
  ``reject`` marked ``to_version`` as refused (it never moves ``champion``). A consumer treats the
  event as a hint to reconcile with the alias, which stays the source of truth: events can be missed,
  the alias cannot.
- :class:`SwapFailedEvent` (``kind="swap-failed"``): a serving instance could not swap to a version
  (download, checksum, NaN/Inf weights, load) and keeps serving what it served before.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from serving.errors import ServingError

PROMOTIONS_SCHEMA_VERSION = 1
"""The schema version this code writes and the newest it reads."""

Action = Literal["promote", "rollback", "reject"]
"""What a decision did (the ``promotions.action`` column)."""


def _now() -> datetime:
    return datetime.now(UTC)


class PromotionEvent(BaseModel):
    """A committed decision about a model version: the promotions history row, as an event."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["decision"] = "decision"
    schema_version: int = Field(default=PROMOTIONS_SCHEMA_VERSION, ge=1, le=PROMOTIONS_SCHEMA_VERSION)
    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    history_id: int = Field(ge=1, description="The promotions table row id this event reports.")
    model_name: str = Field(min_length=1)
    action: Action
    alias: str = Field(default="champion", description="The alias the decision is about.")
    from_version: int | None = Field(default=None, ge=1, description="The champion before (its version).")
    to_version: int | None = Field(default=None, ge=1, description="The champion after, or the rejected version.")
    actor: str = Field(min_length=1, description="Who decided: 'gate' or an operator's name.")
    reason: str = Field(min_length=1)
    evaluation_id: uuid.UUID | None = None
    at: AwareDatetime = Field(default_factory=_now)


class SwapFailedEvent(BaseModel):
    """A serving instance refused or failed to swap to a version and kept serving its current one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["swap-failed"] = "swap-failed"
    schema_version: int = Field(default=PROMOTIONS_SCHEMA_VERSION, ge=1, le=PROMOTIONS_SCHEMA_VERSION)
    event_id: uuid.UUID = Field(default_factory=uuid.uuid4)
    model_name: str = Field(min_length=1)
    model_version: int = Field(
        ge=1, description="The version that could not be served (its MLflow version: a checkpoint's one number)."
    )
    role: Literal["champion", "candidate"] = Field(description="Which alias the version was loaded for.")
    stage: Literal["download", "verify", "load"] = Field(description="Where it failed.")
    error: str = Field(min_length=1, description="Why, as the failing check said it.")
    serving_model_version: int | None = Field(default=None, ge=1, description="What keeps serving.")
    serving_policy_version: int | None = Field(
        default=None, ge=0, description="The policy version responses report; equal to serving_model_version."
    )
    instance: str = Field(min_length=1, description="The serving instance (host:pid) that failed.")
    at: AwareDatetime = Field(default_factory=_now)


PromotionsMessage = Annotated[PromotionEvent | SwapFailedEvent, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[PromotionEvent | SwapFailedEvent] = TypeAdapter(PromotionsMessage)


class InvalidPromotionsMessage(ServingError):
    """A value on the promotions topic is not a valid message; skip it (it is logged) and go on.

    Raised by :func:`parse_message` after validation, never inside a pydantic validator, and caught by
    name (``serving.swap``), so it needs no ``ValueError`` base.
    """


def message_to_json(message: PromotionEvent | SwapFailedEvent) -> bytes:
    """Compact UTF-8 JSON of a promotions-topic value."""
    return message.model_dump_json().encode("utf-8")


def parse_message(data: bytes | bytearray | str) -> PromotionEvent | SwapFailedEvent:
    """Validate a promotions-topic value; InvalidPromotionsMessage names every problem."""
    try:
        return _ADAPTER.validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(value)'}: {e['msg']}" for e in exc.errors())
        raise InvalidPromotionsMessage(f"not a promotions message: {problems}") from exc
