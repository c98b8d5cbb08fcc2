"""The shared settings field types: every stage refuses a malformed Kafka bootstrap, topic name, DSN or
MLflow URI at start-up with a message naming the value, and every default is what it was.

No service is needed: these tests only build settings objects from the environment.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from pydantic import ValidationError

from distill.settings import DistillSettings
from infra.settings import LiveloopSettings, StackSettings, TopicsSettings
from ingest.settings import ArchiverSettings, IngestSettings, SdkSettings
from learner.settings import LearnerSettings
from liveloop.demo.simulator.settings import SimulatorSettings
from liveloop.settings import OperatorSettings
from serving.settings import GateSettings, ServingSettings

DSN = "postgresql://liveloop@127.0.0.1:5433/liveloop"
# What a class needs besides the field under test (its required fields).
REQUIRED: dict[type[LiveloopSettings], dict[str, Any]] = {
    ArchiverSettings: {"dsn": DSN},
    DistillSettings: {"dsn": DSN},
    GateSettings: {"dsn": DSN},
}

# Env variable -> default, for every Kafka bootstrap and topic field: users' deployments rely on both.
BOOTSTRAPS: list[tuple[type[LiveloopSettings], str, str | None]] = [
    (StackSettings, "LIVELOOP_INFRA_KAFKA_BOOTSTRAP", None),
    (SdkSettings, "LIVELOOP_SDK_BOOTSTRAP", "127.0.0.1:9092"),
    (IngestSettings, "LIVELOOP_INGEST_BOOTSTRAP", "127.0.0.1:9092"),
    (ArchiverSettings, "LIVELOOP_ARCHIVER_BOOTSTRAP", "127.0.0.1:9092"),
    (DistillSettings, "LIVELOOP_DISTILL_BOOTSTRAP", "127.0.0.1:9092"),
    (LearnerSettings, "LIVELOOP_LEARNER_BOOTSTRAP", "127.0.0.1:9092"),
    (ServingSettings, "LIVELOOP_SERVING_BOOTSTRAP", "127.0.0.1:9092"),
    (GateSettings, "LIVELOOP_GATE_BOOTSTRAP", "127.0.0.1:9092"),
    (SimulatorSettings, "LIVELOOP_SIMULATOR_BOOTSTRAP", "127.0.0.1:9092"),
    (OperatorSettings, "LIVELOOP_OPERATOR_BOOTSTRAP", None),
]
TOPICS: list[tuple[type[LiveloopSettings], str, str]] = [
    (SdkSettings, "LIVELOOP_SDK_TOPIC", "liveloop.events"),
    (IngestSettings, "LIVELOOP_INGEST_EVENTS_TOPIC", "liveloop.events"),
    (IngestSettings, "LIVELOOP_INGEST_DLQ_TOPIC", "liveloop.events.dlq"),
    (ArchiverSettings, "LIVELOOP_ARCHIVER_EVENTS_TOPIC", "liveloop.events"),
    (ArchiverSettings, "LIVELOOP_ARCHIVER_DLQ_TOPIC", "liveloop.events.dlq"),
    (DistillSettings, "LIVELOOP_DISTILL_EVENTS_TOPIC", "liveloop.events"),
    (DistillSettings, "LIVELOOP_DISTILL_SAMPLES_TOPIC", "liveloop.samples"),
    (DistillSettings, "LIVELOOP_DISTILL_DLQ_TOPIC", "liveloop.events.dlq"),
    (LearnerSettings, "LIVELOOP_LEARNER_SAMPLES_TOPIC", "liveloop.samples"),
    (LearnerSettings, "LIVELOOP_LEARNER_CHECKPOINTS_TOPIC", "liveloop.checkpoints"),
    (ServingSettings, "LIVELOOP_SERVING_EVENTS_TOPIC", "liveloop.events"),
    (ServingSettings, "LIVELOOP_SERVING_PROMOTIONS_TOPIC", "liveloop.promotions"),
    (ServingSettings, "LIVELOOP_SERVING_CHECKPOINTS_TOPIC", "liveloop.checkpoints"),
    (GateSettings, "LIVELOOP_GATE_CHECKPOINTS_TOPIC", "liveloop.checkpoints"),
    (GateSettings, "LIVELOOP_GATE_PROMOTIONS_TOPIC", "liveloop.promotions"),
    (SimulatorSettings, "LIVELOOP_SIMULATOR_EVENTS_TOPIC", "liveloop.events"),
    (OperatorSettings, "LIVELOOP_OPERATOR_PROMOTIONS_TOPIC", "liveloop.promotions"),
]
DSNS = [
    (StackSettings, "LIVELOOP_INFRA_POSTGRES_DSN"),
    (ArchiverSettings, "LIVELOOP_ARCHIVER_DSN"),
    (DistillSettings, "LIVELOOP_DISTILL_DSN"),
    (LearnerSettings, "LIVELOOP_LEARNER_DSN"),
    (GateSettings, "LIVELOOP_GATE_DSN"),
    (OperatorSettings, "LIVELOOP_OPERATOR_DSN"),
]
MLFLOW_URLS: list[tuple[type[LiveloopSettings], str, str | None]] = [
    (StackSettings, "LIVELOOP_INFRA_MLFLOW_URL", None),
    (LearnerSettings, "LIVELOOP_LEARNER_MLFLOW_URI", None),
    (ServingSettings, "LIVELOOP_SERVING_MLFLOW_URL", "http://127.0.0.1:5000"),
    (GateSettings, "LIVELOOP_GATE_MLFLOW_URL", "http://127.0.0.1:5000"),
    (OperatorSettings, "LIVELOOP_OPERATOR_MLFLOW_URL", None),
]


def _field(cls: type[LiveloopSettings], env: str) -> str:
    prefix = cls.model_config.get("env_prefix", "")
    assert env.startswith(prefix), f"{env} does not start with {cls.__name__}'s prefix {prefix}"
    return env.removeprefix(prefix).lower()


def _build(cls: type[LiveloopSettings], env: str) -> LiveloopSettings:
    """The class from the environment, with its required fields given except the one ``env`` sets."""
    given = {name: value for name, value in REQUIRED.get(cls, {}).items() if name != _field(cls, env)}
    return cls(**given)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Defaults are the classes' own: no LIVELOOP_* variable of the test's environment leaks in."""
    for name in list(os.environ):
        if name.startswith("LIVELOOP_"):
            monkeypatch.delenv(name)


def _id(case: tuple[Any, ...]) -> str:
    return str(case[1])


@pytest.mark.parametrize("case", BOOTSTRAPS + TOPICS + MLFLOW_URLS, ids=_id)
def test_defaults_are_unchanged(case: tuple[type[LiveloopSettings], str, str | None]) -> None:
    cls, env, default = case
    assert getattr(_build(cls, env), _field(cls, env)) == default


@pytest.mark.parametrize("case", BOOTSTRAPS, ids=_id)
@pytest.mark.parametrize("value", ["127.0.0.1:9092;kafka:9092", "kafka", "kafka:", "kafka:99999", "a:1, b:2", ""])
def test_a_malformed_bootstrap_is_refused_naming_it(
    case: tuple[type[LiveloopSettings], str, str | None], value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, env, _ = case
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError, match="Kafka bootstrap") as raised:
        _build(cls, env)
    assert repr(value) in str(raised.value)


@pytest.mark.parametrize("case", BOOTSTRAPS, ids=_id)
@pytest.mark.parametrize("value", ["kafka-1:9092", "kafka-1:9092,kafka-2:9093", "[::1]:9092"])
def test_a_well_formed_bootstrap_is_taken(
    case: tuple[type[LiveloopSettings], str, str | None], value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, env, _ = case
    monkeypatch.setenv(env, value)
    assert getattr(_build(cls, env), _field(cls, env)) == value


@pytest.mark.parametrize("case", TOPICS, ids=_id)
@pytest.mark.parametrize("value", ["liveloop events", "liveloop/events", ".", "..", "t" * 250, ""])
def test_an_illegal_topic_name_is_refused_naming_it(
    case: tuple[type[LiveloopSettings], str, str], value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, env, _ = case
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError, match="not a legal Kafka topic name") as raised:
        _build(cls, env)
    assert repr(value)[:20] in str(raised.value)


@pytest.mark.parametrize("case", TOPICS, ids=_id)
def test_the_longest_legal_topic_name_is_taken(
    case: tuple[type[LiveloopSettings], str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, env, _ = case
    monkeypatch.setenv(env, "t." * 124 + "t")
    assert getattr(_build(cls, env), _field(cls, env)) == "t." * 124 + "t"


@pytest.mark.parametrize("value", ["liveloop events", ".."])
def test_the_provisioned_topics_follow_the_same_rule(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVELOOP_TOPICS_EVENTS__NAME", value)
    with pytest.raises(ValidationError, match="not a legal Kafka topic name") as raised:
        TopicsSettings()
    assert repr(value) in str(raised.value)


@pytest.mark.parametrize("case", DSNS, ids=_id)
def test_an_empty_dsn_is_refused(case: tuple[type[LiveloopSettings], str], monkeypatch: pytest.MonkeyPatch) -> None:
    cls, env = case
    monkeypatch.setenv(env, "")
    with pytest.raises(ValidationError, match=_field(cls, env)):
        _build(cls, env)


@pytest.mark.parametrize("case", MLFLOW_URLS, ids=_id)
def test_an_mlflow_uri_without_a_scheme_is_refused_naming_it(
    case: tuple[type[LiveloopSettings], str, str | None], monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, env, _ = case
    monkeypatch.setenv(env, "127.0.0.1:5000")
    if cls is LearnerSettings:  # it publishes only with both the DSN and the URI set
        monkeypatch.setenv("LIVELOOP_LEARNER_DSN", DSN)
    with pytest.raises(ValidationError, match=re.escape("MLflow tracking URI '127.0.0.1:5000'")):
        _build(cls, env)


def test_every_class_reports_all_its_bad_fields_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVELOOP_SERVING_BOOTSTRAP", "kafka")
    monkeypatch.setenv("LIVELOOP_SERVING_EVENTS_TOPIC", "bad topic")
    monkeypatch.setenv("LIVELOOP_SERVING_MLFLOW_URL", "mlflow")
    with pytest.raises(ValidationError) as raised:
        ServingSettings()
    assert {error["loc"][0] for error in raised.value.errors()} == {"bootstrap", "events_topic", "mlflow_url"}


def test_one_field_of_a_topic_is_overridden_and_the_others_keep_their_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    # The documented override (TopicsSettings' docstring, and the Kubernetes provisioning job's env): without a
    # partial update of the nested default, pydantic-settings built the topic from this one key and refused it
    # for a missing name.
    monkeypatch.setenv("LIVELOOP_TOPICS_EVENTS__PARTITIONS", "12")
    topics = TopicsSettings()
    assert topics.events.partitions == 12
    assert topics.events.name == "liveloop.events"
    assert topics.events.retention_ms == 7 * 24 * 3600 * 1000
    assert topics.samples.partitions == 3
