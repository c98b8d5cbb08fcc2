"""The real gateway and engine serving a scripted list of completions, for the agent scenarios' session tests.

What those tests check is the product's side of a trajectory (the turns served, the headers, the events sent,
the outcome), not what a tiny model writes: :class:`~tests.serving.gateway_server.ScriptedEngine` serves each
scripted text in turn, as the real engine's byte tokens, through the real gateway, which emits its generation
events to a fresh Kafka topic; the product's SDK sends to the same topic.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.client import Client
from ingest.settings import SdkSettings
from learner.tiny_model import TinyModelSpec, build_tiny_model, byte_tokenizer
from liveloop.demo.simulator.transport import GatewayClient
from tests.conftest import free_port
from tests.serving.gateway_server import ScriptedEngine, serve_in_thread


@dataclass(frozen=True)
class Served:
    """The scripted gateway: a client for it, the product's SDK on its events topic, and how to reach it."""

    client: GatewayClient
    product: Client
    topic: str
    url: str
    key: str


@contextmanager
def scripted_gateway(
    endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path, script: list[str], **serving: Any
) -> Iterator[Served]:
    """The gateway serving ``script`` as version 1 to a fresh topic (``serving``: more ServingSettings, e.g. a
    budget), a client for it, and the product's SDK on the same topic."""
    from serving.gateway import create_app
    from serving.settings import ServingSettings
    from serving.torch_engine import TorchEngine

    folder = tmp_path / "tiny"
    build_tiny_model(TinyModelSpec()).save_pretrained(folder, safe_serialization=True)
    byte_tokenizer().save_pretrained(folder)
    credentials = tmp_path / "credentials.json"
    key = ensure_credentials(credentials).gateway_key.get_secret_value()
    topic = make_topic()
    engine = TorchEngine(device="cpu", max_batch=8, batch_wait_ms=5)
    engine.load(folder, 1)
    engine.switch(1)
    settings = ServingSettings(
        port=free_port(),
        credentials_path=credentials,
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=topic,
        sdk_journal_dir=tmp_path / "gateway-journal",
        **serving,
    )
    emitter = Client(SdkSettings(bootstrap=endpoints.kafka_bootstrap, topic=topic, journal_dir=tmp_path / "gw-sdk"))
    product = Client(SdkSettings(bootstrap=endpoints.kafka_bootstrap, topic=topic, journal_dir=tmp_path / "product"))
    try:
        app = create_app(settings, ScriptedEngine(engine, script), emitter=emitter)
        with serve_in_thread(app, settings.port) as url:
            client = GatewayClient(f"{url}/v1", key, "liveloop-policy", timeout_s=60)
            yield Served(client, product, topic, f"{url}/v1", key)
            client.close()
            assert emitter.flush(timeout=30)
    finally:
        product.close()
        emitter.close()
        engine.close()


def simulate_env(served: Served, endpoints: Endpoints, tmp_path: Path) -> dict[str, str]:
    """The environment of ``liveloop simulate`` against the scripted gateway (no credential file, no malformed
    events: the script only has the scenario's turns)."""
    return {
        "LIVELOOP_SIMULATOR_GATEWAY_KEY": served.key,
        "LIVELOOP_SIMULATOR_CREDENTIALS_PATH": str(tmp_path / "none.json"),
        "LIVELOOP_SIMULATOR_BOOTSTRAP": endpoints.kafka_bootstrap,
        "LIVELOOP_SIMULATOR_EVENTS_TOPIC": served.topic,
        "LIVELOOP_SIMULATOR_SDK_JOURNAL_DIR": str(tmp_path / "simulator"),
        "LIVELOOP_SIMULATOR_MALFORMED_SHARE": "0",
    }
