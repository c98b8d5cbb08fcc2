"""The ingest package's exceptions: one root, with subclasses that tell the caller what to do.

- :class:`InvalidEvent` and its subclasses: the event can never be accepted as it is. Do not retry;
  dead-letter the raw payload together with ``reason`` so that a person can fix the producer.
- :class:`BrokerUnavailable`: the event was fine but could not be delivered. Transient: retry with
  back-off, or journal the event locally and replay it later.
"""

from __future__ import annotations

from infra.errors import LiveloopError


class IngestError(LiveloopError):
    """Root of every error raised by ``ingest``."""


class InvalidEvent(IngestError):
    """The event violates the contract. Do not retry: dead-letter it with ``reason``.

    ``reason`` is one line a person can act on (it names the field, the bad value's problem and,
    where there is one, the fix). ``field`` is the dotted path of the offending field
    (``"payload.tool_calls[2].name"``), or ``None`` when the problem is not tied to one field
    (malformed JSON, wrong encoding, an oversized event).
    """

    def __init__(self, reason: str, field: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.reason!r}, field={self.field!r})"


class UnsupportedSchemaVersion(InvalidEvent):
    """The event was written for a newer schema than this ingest knows.

    Dead-letter it (it can be replayed once liveloop is upgraded); the producer is ahead of us.
    """


class EventTooLarge(InvalidEvent):
    """The event, or one of its fields, exceeds a size limit of the contract.

    Dead-letter it; the producer must truncate or split the offending field (the reason names it).
    """


class BrokerUnavailable(IngestError):
    """The event broker could not be reached. Transient: retry with back-off or journal the event."""


class BackPressure(IngestError):
    """The SDK's journal is full: Kafka has been unreachable for long. Retry later; nothing was written."""


class JournalError(IngestError):
    """The SDK's on-disk journal cannot be used (in use by another client, or corrupt). Crash and fix it."""
