"""The dead-letter contract: what goes to ``liveloop.events.dlq`` when input is rejected.

Every stage that rejects input (the HTTP API, the SDK's callers, the distiller) publishes one
``DeadLetter`` per rejected item, keyed by session id when one could be read, so that nothing
rejected is lost and a person can see why. The archiver stores them in the ``dead_letters`` table.
The raw payload is kept as received (base64, as it may not even be UTF-8), except that secrets are
redacted when the payload is readable text.

One rule for privacy mode, applied here and nowhere else (:meth:`DeadLetter.of`): an item that says
``privacy_mode: true`` (:func:`says_private`, which also reads items too malformed to parse) keeps
nothing that identifies its session: no payload, no session id (so no Kafka key), and a reason with
every value quoted from the item masked (:func:`withheld_reason`). What stays is what a person needs
to fix the producer: the source, the masked reason, the field, the tenant of the API key, the size.
An item read only in part (a body over the size limit, not read further) may say so past what was
read; it cannot be ruled private or not, so it keeps no payload and no session id either
(:data:`PARTIAL`). No keyed hash of the session is kept (it would need a per-deployment secret in every stage); a
private item's dead letter cannot be tied to its session.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ingest.redaction import redact_text

MAX_RAW_BYTES = 1 << 20
"""Longest raw payload kept in a dead letter; longer ones are cut (the reason says the size)."""

Source = Literal["ingest-api", "sdk", "distill", "archiver"]

WITHHELD = " [payload withheld: privacy_mode is true]"
"""Ends the reason of a privacy-mode item's dead letter (letters written before this rule ended so too)."""

PARTIAL = " [payload withheld: read only in part, so privacy mode could not be ruled out]"
"""Ends the reason of a dead letter whose item was not read whole (and did not say privacy mode in what was)."""

MASK = "\u2026"
"""What a value quoted from a private item becomes in its dead letter's reason."""

# ``"privacy_mode": true`` as a key of some object: the lookbehind skips the escaped quote of a key
# written inside a JSON string (a prompt that mentions it). Found by a regex so that an item too
# malformed to parse still counts as private.
_SAYS_PRIVATE = re.compile(rb'(?<!\\)"privacy_mode"\s*:\s*true\b')
_JSON_STRING = re.compile(rb'"((?:[^"\\]|\\.)*)"(\s*:)?')
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"|`[^`]*`")
_MIN_MASKED = 4
"""Unquoted values shorter than this are left in a reason: masking "a" or "id" would garble its words,
and no generated reason writes a short value unquoted (an event id, the one unquoted value, is a UUID)."""


def says_private(raw: bytes) -> bool:
    """Whether ``raw``, an item or a whole body that may not even parse, says ``privacy_mode: true``.

    Errs towards private: any object in it saying so counts (a batch with one private item, an item
    whose ``privacy_mode`` sits next to a broken field).
    """
    return b"privacy_mode" in raw and _SAYS_PRIVATE.search(raw) is not None


def withheld_reason(reason: str, raw: bytes, field: str | None = None) -> str:
    """``reason`` without any value of the private item ``raw``, marked as withheld.

    Reasons may quote input (a tenant, a duplicate event id, a validator's message), so every quoted
    span is masked unless it is the field or a key of the item (never also one of its values), and so
    is every string value of the item wherever it appears. Keys say where the problem is.
    """
    values, keys = _strings(raw)
    names = (keys - values) | ({field} if field else set())
    kept = {f"{quote}{name}{quote}" for name in names for quote in "'\"`"}
    masked = _QUOTED.sub(lambda m: m.group(0) if m.group(0) in kept else MASK, reason.removesuffix(WITHHELD))
    for value in sorted((v for v in values if len(v) >= _MIN_MASKED), key=len, reverse=True):
        masked = masked.replace(value, MASK)
    return (masked + WITHHELD) if masked.strip() else "rejected" + WITHHELD


def _strings(raw: bytes) -> tuple[set[str], set[str]]:
    """``(values, keys)``: the JSON strings in ``raw``, decoded where they can be, split by whether a
    colon follows (a key) or not (a value)."""
    values: set[str] = set()
    keys: set[str] = set()
    for match in _JSON_STRING.finditer(raw):
        try:
            text = json.loads(match.group(0).rstrip(b": \t\n\r"))
        except ValueError:
            text = match.group(1).decode("utf-8", "replace")
        (keys if match.group(2) else values).add(text)
    return values, keys


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
        *,
        keep: int = MAX_RAW_BYTES,
        size: int | None = None,
    ) -> DeadLetter:
        """Build a dead letter from the raw bytes, redacting secrets if they decode as text.

        At most ``keep`` bytes of the payload are kept (never over :data:`MAX_RAW_BYTES`); ``size`` is
        the item's true size when ``raw`` is only what was read of it. A privacy-mode item keeps no
        payload, no session id and no value in its reason (see the module's docstring).
        """
        size = len(raw) if size is None else size
        private = says_private(raw)
        if private or size > len(raw):
            return cls(
                source=source,
                reason=(withheld_reason(reason, raw, field) if private else reason + PARTIAL)[:4096],
                field=field,
                tenant=tenant,
                raw_b64="",
                raw_size=size,
            )
        kept = raw[: min(keep, MAX_RAW_BYTES)]
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

    def kept(self) -> DeadLetter:
        """This letter as the privacy rule lets it be stored: one from an older or foreign producer that
        still holds a private item's payload, or a withheld one that kept its session id, loses them."""
        raw = self.raw()
        if not says_private(raw) and not (self.reason.endswith(WITHHELD) and self.session_id):
            return self
        reason = withheld_reason(self.reason, raw, self.field)[:4096]
        return self.model_copy(update={"reason": reason, "session_id": None, "raw_b64": ""})

    def raw(self) -> bytes:
        """The (redacted) payload bytes."""
        return base64.b64decode(self.raw_b64)

    def key(self) -> bytes | None:
        """The Kafka key: the session id when one is known."""
        return self.session_id.encode("utf-8") if self.session_id else None

    def to_json(self) -> bytes:
        return self.model_dump_json().encode("utf-8")
