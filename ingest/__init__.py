"""liveloop ingest: the event contract of the ``liveloop.events`` topic, and getting events onto it.

Importing this package is light by design: a product backend embeds it to send events, so it pulls
in pydantic and nothing heavy (no torch, Faust, MLflow or web framework).

    from ingest import Client, GenerationEvent

    with Client(bootstrap="127.0.0.1:9092") as client:
        client.emit(event)
"""

from ingest.client import Client
from ingest.errors import (
    BrokerUnavailable,
    EventTooLarge,
    IngestError,
    InvalidEvent,
    UnsupportedSchemaVersion,
)
from ingest.events import (
    EVENT_ADAPTER,
    EVENT_TYPES,
    FEEDBACK_TYPES,
    SCHEMA_VERSION,
    EditPersistedEvent,
    EditRevertedEvent,
    Event,
    EventBase,
    FollowupEvent,
    GenerationEvent,
    RatingEvent,
    SessionEndedEvent,
    SessionStartedEvent,
    SuggestionAcceptedEvent,
    SuggestionDismissedEvent,
    SuggestionRejectedEvent,
    TestsResultEvent,
    ToolResultEvent,
    TrajectoryOutcomeEvent,
    event_to_json,
    parse_event,
)
from ingest.payloads import (
    EditPayload,
    FeedbackPayload,
    FollowupPayload,
    GenerationPayload,
    RatingPayload,
    SessionEndedPayload,
    SessionStartedPayload,
    SubagentOutcome,
    SuggestionPayload,
    TestsResultPayload,
    ToolCall,
    ToolResultPayload,
    TrajectoryOutcomePayload,
    TrajectorySegment,
    TurnPlace,
)
from ingest.settings import SdkSettings

__all__ = [
    "EVENT_ADAPTER",
    "EVENT_TYPES",
    "FEEDBACK_TYPES",
    "SCHEMA_VERSION",
    "BrokerUnavailable",
    "Client",
    "EditPayload",
    "EditPersistedEvent",
    "EditRevertedEvent",
    "Event",
    "EventBase",
    "EventTooLarge",
    "FeedbackPayload",
    "FollowupEvent",
    "FollowupPayload",
    "GenerationEvent",
    "GenerationPayload",
    "IngestError",
    "InvalidEvent",
    "RatingEvent",
    "RatingPayload",
    "SdkSettings",
    "SessionEndedEvent",
    "SessionEndedPayload",
    "SessionStartedEvent",
    "SessionStartedPayload",
    "SubagentOutcome",
    "SuggestionAcceptedEvent",
    "SuggestionDismissedEvent",
    "SuggestionPayload",
    "SuggestionRejectedEvent",
    "TestsResultEvent",
    "TestsResultPayload",
    "ToolCall",
    "ToolResultEvent",
    "ToolResultPayload",
    "TrajectoryOutcomeEvent",
    "TrajectoryOutcomePayload",
    "TrajectorySegment",
    "TurnPlace",
    "UnsupportedSchemaVersion",
    "event_to_json",
    "parse_event",
]
