"""Fixtures of the ingest tests: an HTTP ingest app on fresh topics, with two tenants' keys."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.api import create_app
from ingest.settings import IngestSettings
from tests.ingest.api_harness import OTHER_TENANT, Api


@pytest.fixture
def credentials_file(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A credential file (mode 0600) with the default tenant's key and a second tenant's."""
    path = tmp_path / "credentials.json"
    creds = ensure_credentials(path)
    other = SecretStr("llik_" + secrets.token_urlsafe(32))
    creds = creds.model_copy(update={"ingest_keys": {**creds.ingest_keys, OTHER_TENANT: other}})
    path.write_text(creds.to_json(), encoding="utf-8")  # the file keeps its 0600 mode
    return path, {tenant: key.get_secret_value() for tenant, key in creds.ingest_keys.items()}


@pytest.fixture
def start_api(
    endpoints: Endpoints, make_topic: Callable[..., str], credentials_file: tuple[Path, dict[str, str]]
) -> Iterator[Callable[..., Api]]:
    """``start_api(**settings)``: an app on fresh topics (3-partition events topic), running until the test ends."""
    path, keys = credentials_file
    stack = contextlib.ExitStack()

    def start(**overrides: Any) -> Api:
        values: dict[str, Any] = {
            "bootstrap": endpoints.kafka_bootstrap,
            "events_topic": make_topic(partitions=3),
            "dlq_topic": make_topic(partitions=1),
            "credentials_path": path,
        }
        settings_ = IngestSettings(**(values | overrides))
        client = stack.enter_context(TestClient(create_app(settings_)))
        return Api(client, settings_, keys)

    with stack:
        yield start


@pytest.fixture
def api(start_api: Callable[..., Api]) -> Api:
    return start_api()
