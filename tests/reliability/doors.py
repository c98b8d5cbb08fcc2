"""The three doors of a deployment, each with one credential file: the ingest API, the gateway, the operator CLI.

Everything is real: the ingest app and the gateway run in-process (Starlette's ``TestClient`` runs
their lifespans, which connect to the session's Kafka broker; the gateway serves a tiny CPU model),
the operator commands run through the ``liveloop`` Typer app against the session's PostgreSQL,
MLflow and Kafka. The access-control and SQL-injection tests of the reliability suite share them.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from fastapi.testclient import TestClient
from kafka import KafkaConsumer, TopicPartition
from prometheus_client import CollectorRegistry
from pydantic import SecretStr
from typer.testing import CliRunner

from infra.credentials import ensure_credentials
from infra.registry import CANDIDATE, CHAMPION, AliasNotSet, Registry
from infra.settings import TopicSpec
from infra.stack import Endpoints
from infra.topics import ensure_topics
from ingest.api import create_app
from ingest.client import Client
from ingest.settings import IngestSettings, SdkSettings
from learner.tiny_model import TinyModelSpec, save_tiny_model
from liveloop.cli import app as liveloop_cli
from serving.gateway import create_app as create_gateway
from serving.settings import ServingSettings
from serving.torch_engine import TorchEngine
from tests.serving.checkpoints import register

OTHER_TENANT = "acme"


@dataclass(frozen=True)
class Keys:
    """Every key of one deployment's credential file, revealed."""

    path: Path
    ingest: dict[str, str]
    gateway: str
    operator: str


def make_credentials(path: Path) -> Keys:
    """A credential file (mode 0600) with two tenants' ingest keys, the gateway key and the operator key."""
    creds = ensure_credentials(path)
    other = SecretStr("llik_" + secrets.token_urlsafe(32))
    creds = creds.model_copy(update={"ingest_keys": {**creds.ingest_keys, OTHER_TENANT: other}})
    path.write_text(creds.to_json(), encoding="utf-8")  # the file keeps its 0600 mode
    return Keys(
        path=path,
        ingest={tenant: key.get_secret_value() for tenant, key in creds.ingest_keys.items()},
        gateway=creds.gateway_key.get_secret_value(),
        operator=creds.operator_key.get_secret_value(),
    )


def new_topic(endpoints: Endpoints, prefix: str, partitions: int = 1) -> str:
    """A fresh topic (module-scoped fixtures cannot use the function-scoped ``make_topic``)."""
    name = f"{prefix}.{uuid.uuid4().hex[:12]}"
    ensure_topics(endpoints.kafka_bootstrap, [TopicSpec(name=name, partitions=partitions)])
    return name


def topic_size(bootstrap: str, topic: str) -> int:
    """Records ever written to ``topic`` (the sum of its partitions' end offsets)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert partitions, f"topic {topic} has no partitions"
        return sum(consumer.end_offsets(partitions).values())
    finally:
        consumer.close()


@dataclass
class IngestDoor:
    """One running ingest app and its two topics."""

    client: TestClient
    settings: IngestSettings

    def post(self, body: object, authorization: str | None) -> Any:
        headers = {"Content-Type": "application/json"}
        if authorization is not None:
            headers["Authorization"] = authorization
        return self.client.post("/v1/events", content=json.dumps(body).encode(), headers=headers)

    def sizes(self) -> tuple[int, int]:
        """(events topic, DLQ topic) record counts."""
        bootstrap = self.settings.bootstrap
        return topic_size(bootstrap, self.settings.events_topic), topic_size(bootstrap, self.settings.dlq_topic)


@contextlib.contextmanager
def ingest_door(endpoints: Endpoints, keys: Keys) -> Iterator[IngestDoor]:
    """The ingest API on fresh topics (3-partition events topic), with ``keys``' credential file."""
    settings = IngestSettings(
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=new_topic(endpoints, "events", partitions=3),
        dlq_topic=new_topic(endpoints, "dlq"),
        credentials_path=keys.path,
    )
    with TestClient(create_app(settings)) as client:
        yield IngestDoor(client, settings)


@dataclass
class GatewayDoor:
    """The gateway app serving policy version 1 of a tiny model; its generation events go to ``topic``."""

    client: TestClient
    sdk: Client
    topic: str
    bootstrap: str
    metrics: CollectorRegistry

    def generated(self) -> float:
        """Choices the engine generated so far (the gateway's own counter)."""
        return self.metrics.get_sample_value("liveloop_gateway_generations_total", {"policy_version": "1"}) or 0.0

    def emitted(self) -> int:
        """Generation events on the topic, once the SDK delivered everything emitted so far."""
        assert self.sdk.flush(timeout=30), "the SDK did not deliver its events within 30 s"
        return topic_size(self.bootstrap, self.topic)


@contextlib.contextmanager
def gateway_door(endpoints: Endpoints, keys: Keys, root: Path) -> Iterator[GatewayDoor]:
    """The gateway (tiny CPU model, fresh events topic) with ``keys``' credential file."""
    engine = TorchEngine(device="cpu", max_batch=4, batch_wait_ms=1)
    engine.load(save_tiny_model(root / "v1", TinyModelSpec(seed=1)), 1)
    topic = new_topic(endpoints, "generations")
    settings = ServingSettings(
        credentials_path=keys.path,
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=topic,
        sdk_journal_dir=root / "journal",
        default_max_tokens=4,
    )
    sdk = Client(SdkSettings(bootstrap=settings.bootstrap, topic=topic, journal_dir=settings.sdk_journal_dir))
    registry = CollectorRegistry()
    try:
        app = create_gateway(settings, engine, emitter=sdk, metrics_registry=registry)
        with TestClient(app) as client:
            yield GatewayDoor(client, sdk, topic, endpoints.kafka_bootstrap, registry)
    finally:
        sdk.close()
        engine.close()


@dataclass
class OperatorDoor:
    """``liveloop promote/rollback/reject`` on a registered model, its promotions topic and audit database."""

    env: dict[str, str | None]
    dsn: str
    model: str
    versions: int
    registry: Registry
    topic: str
    bootstrap: str

    def run(self, args: list[str], env_key: str | None = None) -> tuple[int, str]:
        """Run the ``liveloop`` CLI in-process; ``env_key`` is LIVELOOP_OPERATOR_KEY (None: unset)."""
        env = self.env | {"LIVELOOP_OPERATOR_KEY": env_key}
        result = CliRunner().invoke(liveloop_cli, args, env=env)
        return result.exit_code, result.output

    def alias(self, alias: str) -> int | None:
        try:
            return int(self.registry.version_by_alias(self.model, alias).version)
        except AliasNotSet:
            return None

    def tags(self, version: int) -> dict[str, str]:
        return dict(self.registry.client.get_model_version(self.model, str(version)).tags)

    def history(self) -> list[tuple[Any, ...]]:
        """(id, action, from_version, to_version, actor, reason) of every promotions row, oldest first."""
        with psycopg.connect(self.dsn) as conn:
            return conn.execute(
                "SELECT id, action, from_version, to_version, actor, reason FROM promotions "
                "WHERE model_name = %s ORDER BY id",
                (self.model,),
            ).fetchall()

    def state(self) -> dict[str, Any]:
        """Everything an operator action changes: the history, both aliases, the topic, the version tags."""
        return {
            "rows": self.history(),
            "champion": self.alias(CHAMPION),
            "candidate": self.alias(CANDIDATE),
            "published": topic_size(self.bootstrap, self.topic),
            "tags": {v: self.tags(v) for v in range(1, self.versions + 1)},
        }


def operator_door(endpoints: Endpoints, keys: Keys, dsn: str, root: Path, versions: int) -> OperatorDoor:
    """A new registered model with ``versions`` versions (no alias yet) and a fresh promotions topic."""
    model = f"reliability-{uuid.uuid4().hex[:8]}"
    for i in range(1, versions + 1):
        folder = root / model / f"v{i}"
        folder.mkdir(parents=True)
        (folder / "weights.bin").write_bytes(f"weights {i}".encode())
        register(endpoints.mlflow_url, folder, model)
    topic = new_topic(endpoints, "promotions")
    env: dict[str, str | None] = {
        "LIVELOOP_OPERATOR_MODEL_NAME": model,
        "LIVELOOP_OPERATOR_DSN": dsn,
        "LIVELOOP_OPERATOR_MLFLOW_URL": endpoints.mlflow_url,
        "LIVELOOP_OPERATOR_BOOTSTRAP": endpoints.kafka_bootstrap,
        "LIVELOOP_OPERATOR_PROMOTIONS_TOPIC": topic,
        "LIVELOOP_OPERATOR_CREDENTIALS_PATH": str(keys.path),
    }
    registry = Registry(endpoints.mlflow_url)
    return OperatorDoor(env, dsn, model, versions, registry, topic, endpoints.kafka_bootstrap)
