"""Fixtures shared by the serving tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.client import Client
from ingest.settings import SdkSettings
from learner.tiny_model import TinyModelSpec, save_tiny_model
from serving.engine import Engine
from serving.gateway import Router, create_app
from serving.settings import ServingSettings
from serving.torch_engine import TorchEngine
from tests.conftest import free_port
from tests.serving.gateway_server import CANARY, VERSION, Gateway, serve_in_thread


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny models with different weights: policy versions 1 and 2."""
    root = tmp_path_factory.mktemp("models")
    return {
        "v1": save_tiny_model(root / "v1", TinyModelSpec(seed=1)),
        "v2": save_tiny_model(root / "v2", TinyModelSpec(seed=2)),
    }


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchEngine]:
    """A CPU engine serving version 7 by default, with version 8 loaded beside it."""
    root = tmp_path_factory.mktemp("models")
    engine = TorchEngine(device="cpu", max_batch=8, batch_wait_ms=5)
    engine.load(save_tiny_model(root / "v7", TinyModelSpec(seed=7)), VERSION)
    engine.load(save_tiny_model(root / "v8", TinyModelSpec(seed=8)), CANARY)
    yield engine
    engine.close()


@pytest.fixture
def start_gateway(
    engine: TorchEngine, endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Callable[..., Gateway]]:
    """Start the gateway (uvicorn, a free port) with a fresh events topic: ``start_gateway(router=...)``; more
    keyword arguments are ServingSettings fields (``budget_hard_tokens=100``)."""
    sdk_clients: list[Client] = []
    servers = ExitStack()

    def start(router: Router | None = None, served: Engine | None = None, **overrides: Any) -> Gateway:
        credentials = tmp_path / f"credentials-{len(sdk_clients)}.json"
        key = ensure_credentials(credentials).gateway_key.get_secret_value()
        topic = make_topic()
        settings = ServingSettings(
            port=free_port(),
            credentials_path=credentials,
            bootstrap=endpoints.kafka_bootstrap,
            events_topic=topic,
            sdk_journal_dir=tmp_path / f"journal-{len(sdk_clients)}",
            default_max_tokens=12,
            **overrides,
        )
        sdk = Client(SdkSettings(bootstrap=settings.bootstrap, topic=topic, journal_dir=settings.sdk_journal_dir))
        sdk_clients.append(sdk)
        app = create_app(settings, served or engine, emitter=sdk, router=router)
        url = servers.enter_context(serve_in_thread(app, settings.port))
        return Gateway(url, key, topic, sdk, settings, servers)

    with servers:
        yield start
    for sdk in sdk_clients:
        sdk.close()
