"""Regressions from fuzzing the gateway (issue #8, tests/reliability/test_fuzz_gateway.py); one test per finding.

1. A ``seed`` outside 64 bits (``10**30``, ``-2**63 - 1``) reached torch's generator, which refused it inside
   the engine's batch: 500 "generation failed: Overflow when unpacking long long". Now 400 naming ``seed``.
2. The gateway read any request body whole: a 50 MB prompt was buffered and tokenized (17 s of CPU on these
   machines) only to be refused for the context. Now ``max_request_bytes`` (8 MiB) answers 413 unread.
3. The OpenAPI document described the completion routes without bodies, headers, key or error answers.
4. A tiny positive temperature (``1e-45``, valid for the API) overflowed the tempered logits to inf: every
   probability was NaN and the torch engine drew an arbitrary token, reported with logprob 0 (certain).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.client import Client
from ingest.settings import SdkSettings
from learner.tiny_model import TinyModelSpec, save_tiny_model
from serving.engine import SamplingParams
from serving.gateway import create_app
from serving.settings import ServingSettings
from serving.torch_engine import TorchEngine

MODEL = "liveloop-policy"
LIMIT = 4096


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchEngine]:
    engine = TorchEngine(device="cpu", max_batch=8, batch_wait_ms=1)
    engine.load(save_tiny_model(tmp_path_factory.mktemp("model") / "v1", TinyModelSpec(seed=1)), 1)
    engine.switch(1)
    yield engine
    engine.close()


class Gateway:
    def __init__(self, client: TestClient, key: str, settings: ServingSettings) -> None:
        self.client, self.key, self.settings = client, key, settings

    def post(self, path: str, content: Any, key: str | None = None, **headers: str) -> Any:
        headers = {"Authorization": f"Bearer {key or self.key}", "Content-Type": "application/json", **headers}
        return self.client.post(path, content=content, headers=headers)


@pytest.fixture
def gateway(
    engine: TorchEngine, endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Gateway]:
    credentials = tmp_path / "credentials.json"
    key = ensure_credentials(credentials).gateway_key.get_secret_value()
    topic = make_topic()
    settings = ServingSettings(
        credentials_path=credentials,
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=topic,
        default_max_tokens=4,
        max_tokens_limit=16,
        max_request_bytes=LIMIT,
    )
    sdk = Client(SdkSettings(bootstrap=endpoints.kafka_bootstrap, topic=topic, journal_dir=tmp_path / "journal"))
    try:
        with TestClient(create_app(settings, engine, emitter=sdk)) as client:
            yield Gateway(client, key, settings)
    finally:
        sdk.close()


def _completion(seed: int, n: int = 1) -> str:
    return f'{{"model": "{MODEL}", "prompt": "def add(a, b):", "max_tokens": 2, "seed": {seed}, "n": {n}}}'


@pytest.mark.parametrize("seed", [2**64, 2**63, -(2**63) - 1, 10**30, -(10**30)])
def test_a_seed_outside_64_bits_is_refused_with_400(gateway: Gateway, seed: int) -> None:
    for path, body in [
        ("/v1/completions", _completion(seed)),
        (
            "/v1/chat/completions",
            f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "seed": {seed}}}',
        ),
    ]:
        response = gateway.post(path, body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == "seed"
        assert error["message"].startswith("seed: Input should be")


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63), 0])
def test_the_extreme_64_bit_seeds_are_served_and_repeat(gateway: Gateway, seed: int) -> None:
    # n=4 uses seed, seed+1, ..., seed+3: still within what torch's generator takes.
    first = gateway.post("/v1/completions", _completion(seed, n=4))
    assert first.status_code == 200, first.text
    again = gateway.post("/v1/completions", _completion(seed, n=4))
    assert [c["text"] for c in first.json()["choices"]] == [c["text"] for c in again.json()["choices"]]
    assert len(first.json()["choices"]) == 4


def test_a_body_over_max_request_bytes_gets_413_unread(gateway: Gateway) -> None:
    over = _completion(1).replace("def add", "x" * LIMIT).encode()
    assert len(over) > LIMIT
    declared = gateway.post("/v1/completions", over)
    assert declared.status_code == 413
    assert declared.json()["error"]["code"] == "request_too_large"
    assert "LIVELOOP_SERVING_MAX_REQUEST_BYTES" in declared.json()["error"]["message"]
    # Without Content-Length (chunked), the body is cut off once it passes the limit.
    chunked = gateway.post("/v1/chat/completions", iter([over[:3000], over[3000:]]))
    assert chunked.status_code == 413
    assert chunked.json()["error"]["code"] == "request_too_large"
    # At the limit it is read and judged as usual (here: too long for the tiny model's context).
    at_limit = _completion(1).replace("def add", "x" * (LIMIT - len(_completion(1)) + len("def add"))).encode()
    assert len(at_limit) == LIMIT
    answer = gateway.post("/v1/completions", at_limit)
    assert answer.status_code == 400
    assert "exceeds the model's context" in answer.json()["error"]["message"]
    # The key is checked first: a stranger's large body is not read at all.
    assert gateway.post("/v1/completions", over, key="llgk_wrong").status_code == 401


def test_the_openapi_document_describes_bodies_headers_key_and_errors(gateway: Gateway) -> None:
    document = gateway.client.get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    for path, model in [("/v1/completions", "CompletionRequest"), ("/v1/chat/completions", "ChatCompletionRequest")]:
        operation = document["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"}
        assert operation["security"] == [{"gatewayKey": []}]
        assert [p["name"] for p in operation["parameters"]] == [
            "X-Liveloop-Session",
            "X-Liveloop-User",
            "X-Liveloop-Tenant",
            "X-Liveloop-Surface",
            "X-Liveloop-Task-Kind",
            "X-Liveloop-Privacy-Mode",
            "X-Liveloop-Trajectory",
            "X-Liveloop-Parent-Turn",
            "X-Liveloop-Agent",
            "X-Liveloop-Agent-Id",
            "X-Liveloop-Frozen",
            "X-Liveloop-Stage",
            "X-Liveloop-Boundary",
        ]
        assert schemas["TurnPlaceBody"]["properties"]["trajectory_id"]["type"] == "string"
        assert sorted(operation["responses"]) == ["200", "400", "401", "404", "413", "500", "503"]
        properties = schemas[model]["properties"]
        assert properties["model"]["enum"] == [MODEL]
        assert {"minimum": 1, "maximum": 16, "type": "integer"} in properties["max_tokens"]["anyOf"]
        assert {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1} in properties["seed"]["anyOf"]
    assert schemas["ErrorBody"]["required"] == ["error"]
    assert "X-Liveloop-Budget" in document["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["headers"]
    assert schemas["Tool"]["properties"]["function"] == {"$ref": "#/components/schemas/FunctionDefinition"}
    assert document["paths"]["/v1/models"]["get"]["security"] == [{"gatewayKey": []}]


@pytest.mark.parametrize("temperature", [5e-324, 1e-45, 1e-38])
def test_a_tiny_temperature_samples_the_greedy_tokens(engine: TorchEngine, temperature: float) -> None:
    greedy = engine.generate(["def add(a, b):"], SamplingParams(temperature=0.0, max_tokens=8))[0]
    for top_p in (1.0, 0.5):
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=8, seed=3)
        tiny = engine.generate(["def add(a, b):"], params)[0]
        assert tiny.token_ids == greedy.token_ids
        # Under the (degenerate) sampling distribution each drawn token was certain.
        assert tiny.logprobs == [0.0] * len(tiny.token_ids)
