"""The dead-letter contract: what goes to ``liveloop.events.dlq`` when input is rejected.

Every stage that rejects input (the HTTP API, the SDK's callers, the distiller) publishes one
``DeadLetter`` per rejected item, keyed by session id when one could be read, so that nothing
rejected is lost and a person can see why. The archiver stores them in the ``dead_letters`` table.
The raw payload is kept as received (base64, as it may not even be UTF-8), except that secrets are
redacted when the payload is readable text.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ingest.redaction import redact_text

MAX_RAW_BYTES = 1 << 20
"""Longest raw payload kept in a dead letter; longer ones are cut (the reason says the size)."""

Source = Literal["ingest-api", "sdk", "distill", "archiver"]


class DeadLetter(BaseModel):
    """One rejected input, with the reason a person can act on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Source
    reason: str = Field(min_length=1, max_length=4096)
    field: str | None = None
    received_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    tenant: str | None = None
    session_id: str | None = None
    raw_b64: str = Field(description="The rejected payload, base64 (secrets redacted where it was text).")
    raw_size: int = Field(ge=0, description="Size of the payload as received, in bytes.")

    @classmethod
    def of(
        cls,
        raw: bytes,
        reason: str,
        source: Source,
        field: str | None = None,
        tenant: str | None = None,
        session_id: str | None = None,
    ) -> DeadLetter:
        """Build a dead letter from the raw bytes, redacting secrets if they decode as text."""
        size = len(raw)
        kept = raw[:MAX_RAW_BYTES]
        try:
            text, _ = redact_text(kept.decode("utf-8"))
            kept = text.encode("utf-8")
        except UnicodeDecodeError:
            pass  # not text: kept as bytes, nothing to redact that a regex could find reliably
        return cls(
            source=source,
            reason=reason[:4096],
            field=field,
            tenant=tenant,
            session_id=session_id,
            raw_b64=base64.b64encode(kept).decode("ascii"),
            raw_size=size,
        )

    def raw(self) -> bytes:
        """The (redacted) payload bytes."""
        return base64.b64decode(self.raw_b64)

    def key(self) -> bytes | None:
        """The Kafka key: the session id when one is known."""
        return self.session_id.encode("utf-8") if self.session_id else None

    def to_json(self) -> bytes:
        return self.model_dump_json().encode("utf-8")
