"""Helpers for gateway tests and benchmarks: the app under uvicorn on a real port (in a thread, or
``python -m serving.gateway`` as production runs it), events read back."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
import uvicorn
from fastapi import FastAPI
from kafka import KafkaConsumer, TopicPartition

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.client import Client
from serving.engine import Engine, Generation, SamplingParams
from serving.settings import ServingSettings
from tests.conftest import free_port
from tests.http_process import http_process

if TYPE_CHECKING:
    from serving.torch_engine import TorchEngine

VERSION = 7
"""The policy version the ``engine`` fixture serves by default."""
CANARY = 8
"""The second version that fixture loads beside it."""
BYTE_OFFSET = 3
"""The tiny model's tokenizer (ByT5's): token id = byte + 3 (three specials first)."""


@dataclass
class Gateway:
    """A gateway started by the ``start_gateway`` fixture: its address, key, events topic, SDK and settings."""

    url: str
    key: str
    topic: str
    sdk: Client
    settings: ServingSettings
    closing: ExitStack

    def client(self, key: str | None = None) -> openai.OpenAI:
        """An openai client on this gateway, closed (with its connections) when the test ends."""
        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key=key or self.key, max_retries=0)
        return self.closing.enter_context(client)


@dataclass(frozen=True)
class GatewayProcess:
    """A running ``python -m serving.gateway``: its process, address, key, served model name and log."""

    process: subprocess.Popen[bytes]
    url: str
    key: str
    model: str
    log_path: Path


@contextmanager
def gateway_process(
    endpoints: Endpoints,
    events_topic: str,
    workdir: Path,
    model_folder: Path,
    ready_within_s: float = 120,
    **settings: str,
) -> Iterator[GatewayProcess]:
    """``python -m serving.gateway`` on a free port, serving ``model_folder`` as version 1, ready when yielded.

    It uses the test stack's broker and registry, under a model name of its own (no champion there, so
    the swap controller keeps version 1). ``settings`` are more ``LIVELOOP_SERVING_*`` values
    (``MAX_BATCH="8"``). Stopped (SIGTERM, then SIGKILL) on leaving; fails if not ready within ``ready_within_s``.
    """
    key = ensure_credentials(workdir / "credentials.json").gateway_key.get_secret_value()
    port = free_port()
    model = f"test-gateway-{port}"
    values = {
        "PORT": str(port),
        "CREDENTIALS_PATH": str(workdir / "credentials.json"),
        "BOOTSTRAP": endpoints.kafka_bootstrap,
        "MLFLOW_URL": endpoints.mlflow_url,
        "MODEL_NAME": model,
        "EVENTS_TOPIC": events_topic,
        "SDK_JOURNAL_DIR": str(workdir / "journal"),
        "MODEL_FOLDER": str(model_folder),
        "MODEL_VERSION": "1",
        "DEVICE": "cpu",
        **settings,
    }
    env = os.environ | {f"LIVELOOP_SERVING_{name}": value for name, value in values.items()}
    url = f"http://127.0.0.1:{port}"
    log_path = workdir / "gateway.log"
    with http_process("serving.gateway", env, url, log_path, ready_within_s=ready_within_s) as process:
        yield GatewayProcess(process, url, key, model, log_path)


@contextmanager
def serve_in_thread(app: FastAPI, port: int) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread on 127.0.0.1:``port``; yield its base URL; stop it afterwards."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive(), "uvicorn stopped while starting"
        assert time.monotonic() < deadline, "uvicorn did not start within 30 s"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def read_events(bootstrap: str, topic: str, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """The first ``count`` records of the (single-partition) topic, decoded as JSON; fails if fewer arrive."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        records: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(records) < count and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                records.extend(json.loads(record.value) for record in batch)
        assert len(records) >= count, f"only {len(records)} of {count} events arrived on {topic}"
        return records
    finally:
        consumer.close()


class ScriptedEngine(Engine):
    """Serves ``outputs`` in turn as completions; ``served`` keeps what it served.

    For tests of what the tiny model cannot write (the ``<tool_call>`` syntax, an agent's decisions): the real
    engine encodes the prompt and picks the version, and the completion is the next scripted text served as its
    byte tokens (the tiny model's tokenizer is byte-level), with made-up logprobs.
    """

    def __init__(self, inner: TorchEngine, outputs: list[str]) -> None:
        self.inner, self.outputs, self.served = inner, list(outputs), list[Generation]()

    def generate(
        self, prompts: list[str], params: SamplingParams, policy_version: int | None = None
    ) -> list[Generation]:
        real = self.inner.generate(prompts, params.model_copy(update={"max_tokens": 1}), policy_version)
        out = []
        for generation in real:
            text = self.outputs.pop(0)
            ids = [b + BYTE_OFFSET for b in text.encode()]
            logprobs = [-0.001 * (1 + i % 7) for i in range(len(ids))]
            update = {"text": text, "token_ids": ids, "logprobs": logprobs, "finish_reason": "stop"}
            out.append(generation.model_copy(update=update))
        self.served += out
        return out

    def load(self, folder: Path, policy_version: int) -> None:
        self.inner.load(folder, policy_version)

    def switch(self, policy_version: int) -> None:
        self.inner.switch(policy_version)

    def unload(self, policy_version: int) -> None:
        self.inner.unload(policy_version)

    @property
    def default_version(self) -> int:
        return self.inner.default_version

    @property
    def loaded_versions(self) -> list[int]:
        return self.inner.loaded_versions
