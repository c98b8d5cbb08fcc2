"""Fuzzing the OpenAI-compatible gateway (issue #8): at least ``reliability.fuzz_requests`` hostile requests, no 5xx.

The gateway runs under uvicorn on a real socket over a real tiny torch engine, and emits its generation
events through the ingest SDK to a fresh topic on the real broker. Its limits are small (16 tokens, 4
choices, 1 MiB bodies) so that generation and bodies around the limits stay cheap. Requests come from
schemathesis (the gateway's OpenAPI document, positive and negative, with the gateway key, and some with
no key or a wrong one) and from hypothesis (arbitrary JSON, invalid UTF-8, truncated JSON, wrong content
types, chunked bodies, mutated completion and chat requests, hostile ``X-Liveloop-*`` headers, prompts
around the context and bodies around the size limit). Every answer must be below 500 and every 4xx must
carry OpenAI's error message; afterwards the gateway must still be healthy and serve, and every choice it
served (outside privacy mode) must be on the events topic.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from hypothesis import strategies as st
from schemathesis import GenerationMode

from infra.credentials import ensure_credentials
from infra.stack import Endpoints
from ingest.client import Client
from ingest.settings import SdkSettings
from learner.tiny_model import TinyModelSpec, save_tiny_model
from serving.gateway import create_app
from serving.settings import ServingSettings
from serving.torch_engine import TorchEngine
from tests.conftest import free_port
from tests.reliability.fuzzing import (
    Hostile,
    SchemaFuzz,
    Tally,
    drive,
    dumps,
    hostile_json,
    post,
    split,
    wire_forms,
)
from tests.reliability.profile import ReliabilityProfile
from tests.serving.gateway_server import serve_in_thread
from tests.topic_reader import read_topic

MODEL = "liveloop-policy"
SHARES = {"positive": 0.3, "negative": 0.3, "unauthenticated": 0.05, "probes": 0.01, "hypothesis": 0.34}
PRIVATE = ("1", "true", "yes")


@dataclass
class Served:
    """What the answers say was served: the generation ids that must reach the events topic."""

    generation_ids: set[str] = field(default_factory=set)
    private: int = 0

    def check(self, status: int, content: bytes, headers: Mapping[str, str]) -> str | None:
        """The answer is sound (OpenAI's error message on every 4xx); note the choices it served."""
        if status == 200 and content.startswith((b"# HELP", b"data: ")):
            first = content.split(b"\n\n", 1)[0].removeprefix(b"data: ") if content.startswith(b"data: ") else None
            return None if first is None else self._served(json.loads(first), headers)
        try:
            body = json.loads(content)
        except ValueError:
            return f"answer {status} is not JSON"
        if status == 200:
            return self._served(body, headers) if "choices" in body else None
        message = body.get("error", {}).get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message.strip():
            return f"{status} without an error message"
        return None if 400 <= status < 500 else f"unexpected status {status}"

    def _served(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        ids = body.get("liveloop", {}).get("generation_ids")
        if not isinstance(ids, list) or not ids:
            return "a completion without liveloop.generation_ids"
        if (headers.get("X-Liveloop-Privacy-Mode") or "").strip().lower() in PRIVATE:
            self.private += len(ids)  # the SDK drops privacy-mode events unsent
        else:
            self.generation_ids.update(ids)
        return None


@dataclass
class Target:
    url: str
    key: str
    settings: ServingSettings
    sdk: Client


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchEngine]:
    engine = TorchEngine(device="cpu", max_batch=8, batch_wait_ms=1)
    engine.load(save_tiny_model(tmp_path_factory.mktemp("fuzz-model") / "v1", TinyModelSpec(seed=1)), 1)
    engine.switch(1)
    yield engine
    engine.close()


@pytest.fixture
def target(
    engine: TorchEngine, endpoints: Endpoints, make_topic: Callable[..., str], tmp_path: Path
) -> Iterator[Target]:
    """The gateway under uvicorn with small generation limits, its events going to a fresh topic."""
    credentials = tmp_path / "credentials.json"
    key = ensure_credentials(credentials).gateway_key.get_secret_value()
    settings = ServingSettings(
        port=free_port(),
        credentials_path=credentials,
        bootstrap=endpoints.kafka_bootstrap,
        events_topic=make_topic(prefix="fuzz-gen"),
        sdk_journal_dir=tmp_path / "journal",
        default_max_tokens=8,
        max_tokens_limit=16,
        max_prompts=4,
        max_request_bytes=1 << 20,
    )
    sdk = Client(SdkSettings(bootstrap=settings.bootstrap, topic=settings.events_topic, journal_dir=tmp_path / "j"))
    try:
        with serve_in_thread(create_app(settings, engine, emitter=sdk), settings.port) as url:
            yield Target(url, key, settings, sdk)
    finally:
        sdk.close()


def test_fuzzed_requests_never_get_a_server_error_and_every_served_choice_is_emitted(
    target: Target, reliability: ReliabilityProfile
) -> None:
    served = Served()
    tally = Tally(served.check)
    counts = split(reliability.fuzz_requests, SHARES)
    generate = [("/v1/completions", "POST"), ("/v1/chat/completions", "POST")]
    headers = {"Authorization": f"Bearer {target.key}"}
    with requests.Session() as session:
        fuzz = SchemaFuzz(target.url, session, tally, target.key)
        fuzz.run(generate, GenerationMode.POSITIVE, counts["positive"], "schemathesis positive")
        fuzz.run(generate, GenerationMode.NEGATIVE, counts["negative"], "schemathesis negative")
        fuzz.run_unauthenticated([*generate, ("/v1/models", "GET")], counts["unauthenticated"])
        probes = [("/healthz", "GET"), ("/readyz", "GET"), ("/metrics", "GET"), ("/v1/models", "GET")]
        fuzz.run(probes, GenerationMode.POSITIVE, counts["probes"], "schemathesis positive")

        def send(example: tuple[str, Hostile, dict[str, str]]) -> None:
            path, request, extra = example
            generator = f"hypothesis {request.kind.split('+')[0]}"
            what = f"{path} headers={extra!r} {request.describe()}"
            try:
                response = post(session, f"{target.url}{path}", request, {**headers, **extra})
            except requests.RequestException as exc:
                tally.failed(generator, what, exc)
                return
            tally.record(generator, response.status_code, response.content, response.request.headers, what)

        drive(hostile_gateway_requests(target.settings), counts["hypothesis"], send)

        # Still serving: healthy, ready, and a plain completion is served.
        assert session.get(f"{target.url}/healthz", timeout=30).json() == {"status": "ok"}
        assert session.get(f"{target.url}/readyz", timeout=30).json()["ready"] is True
        final = session.post(
            f"{target.url}/v1/completions", json={"model": MODEL, "prompt": "def add(a, b):"}, headers=headers
        )
        assert final.status_code == 200, final.text
        assert served.check(200, final.content, {}) is None

    target.sdk.flush()
    emitted = [json.loads(r.value) for r in read_topic(target.settings.bootstrap, target.settings.events_topic)]
    emitted_ids = {event["payload"]["generation_id"] for event in emitted}
    tally.write(
        reliability,
        "fuzz-gateway",
        {"choices_served": len(served.generation_ids), "choices_private": served.private, "events": len(emitted)},
    )
    assert tally.total >= reliability.fuzz_requests
    assert tally.server_errors == 0, tally.problems
    assert tally.problem_count == 0, tally.problems
    assert emitted_ids == served.generation_ids
    assert len(emitted) == len(emitted_ids)


# ----------------------------------------------------------------------------------------- the bodies


def _completion() -> dict[str, Any]:
    return {"model": MODEL, "prompt": "def add(a, b):", "max_tokens": 4}


def _chat() -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}


_EDGES: dict[str, list[Any]] = {
    "model": ["", "gpt-4", MODEL + "\x00", MODEL.upper(), 7],
    "max_tokens": [0, -1, 1, 16, 17, 10**30, 1.5, 4.0, "8", True, None],
    "max_completion_tokens": [0, 16, 17, 10**30],
    "n": [0, 1, 4, 5, 17, 10**9, -1, 2.0],
    "temperature": [-0.0, 0, 2, 2.0000001, -1e-300, 1e308, "1"],
    "top_p": [0, 5e-324, 1, 1.0000001, -0.5],
    "seed": [0, -1, 2**63 - 1, 2**63, 2**64, -(2**63), -(2**63) - 1, 10**30, -(10**30), 1.5],
    "stop": ["", ["a"] * 5, ["\x00"], "\n", [""], [7], {"a": 1}],
    "stream": [True, "true", 1],
    "stream_options": [{"include_usage": True}, {}, {"include_usage": "yes"}, {"x": 1}],
    "logprobs": [True, 0, 5, 6, -1, None],
    "top_logprobs": [0, 5, 6],
    "user": ["", "u", "a" * 129, "a\nb", "\u2028", "\x7f"],
    "echo": [True, False],
    "suffix": ["", "x"],
    "best_of": [1, 2, 0],
    "logit_bias": [{}, {"1": 0.0}, {"1": 100}],
    "frequency_penalty": [0, 0.0, 1],
    "prompt": ["", [], [""], ["a"] * 5, ["a"] * 4, "\x00", "x" * 1005, "x" * 1016, [["a"]], [1, 2]],
    "messages": [
        [],
        [{"role": "user"}],
        [{"role": "user", "content": None}],
        [{"role": "robot", "content": "x"}],
        [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image_url", "image_url": {}}]}],
        [{"role": "user", "content": [{"type": "text", "text": "x" * 1100}]}],
        [{"role": "user", "content": "x", "name": "\x00", "tool_calls": []}],
    ],
}
_HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=140
).map(
    str.strip  # HTTP drops the whitespace around a header value (and requests refuses to send it)
)
_HEADER_NAMES = [
    "X-Liveloop-Session",
    "X-Liveloop-User",
    "X-Liveloop-Tenant",
    "X-Liveloop-Surface",
    "X-Liveloop-Task-Kind",
]


@st.composite
def mutated_requests(draw: st.DrawFn, chat: bool) -> bytes:
    """A valid (chat) completion request with one field dropped, retyped, set to an edge value or given twice."""
    body = _chat() if chat else _completion()
    how = draw(st.sampled_from(["drop", "retype", "edge", "edge", "edge", "duplicate", "unknown"]))
    name = draw(st.sampled_from(sorted(body) if how in ("drop", "retype") else sorted(_EDGES)))
    if how == "drop":
        del body[name]
    elif how == "retype":
        body[name] = draw(hostile_json(5))
    elif how == "edge":
        body[name] = draw(st.sampled_from(_EDGES[name]))
    elif how == "unknown":
        body[draw(st.sampled_from(["tools", "response_format", "functions", "x" * 300, ""]))] = draw(hostile_json(3))
    for extra in draw(st.lists(st.sampled_from(sorted(_EDGES)), max_size=2)):
        body.setdefault(extra, draw(st.sampled_from(_EDGES[extra])))
    raw = dumps(body, ascii_only=draw(st.booleans()))
    if how == "duplicate":
        raw = raw.replace(b"{", b"{" + dumps(name) + b": " + dumps(draw(hostile_json(2))) + b", ", 1)
    return raw


def _around(size: int, chat: bool, body_size: bool = False) -> bytes:
    """A request whose prompt is ``size`` characters, or (``body_size``) whose body is ``size`` bytes."""
    body = _chat() if chat else _completion()

    def with_prompt(text: str) -> bytes:
        if chat:
            body["messages"][1]["content"] = text
        else:
            body["prompt"] = text
        return dumps(body, ascii_only=False)

    if body_size:
        return with_prompt("x" * max(0, size - len(with_prompt(""))))
    return with_prompt("é" * (size // 2) if size % 2 else "x" * size)


_RAW = [b"", b" ", b"{}", b"[]", b"null", b"[" * 100_000, b'{"model": ' * 40 + b"1" + b"}" * 40, b"9" * 5000]


def hostile_gateway_requests(settings: ServingSettings) -> st.SearchStrategy[tuple[str, Hostile, dict[str, str]]]:
    """``(path, request, extra headers)`` for the completion routes: hostile bodies and hostile liveloop headers."""
    context = 1024 - settings.default_max_tokens
    limit = settings.max_request_bytes
    body_sizes = st.integers(limit - 64, limit + 64) | st.just(4 * limit)
    paths = st.sampled_from(["/v1/completions", "/v1/chat/completions"])
    bodies = st.one_of(
        wire_forms("json", hostile_json().map(dumps)),
        wire_forms("raw", st.sampled_from(_RAW)),
        wire_forms("mutated", st.booleans().flatmap(lambda chat: mutated_requests(chat))),
        st.builds(Hostile, st.just("mutated"), st.booleans().flatmap(lambda chat: mutated_requests(chat))),
        wire_forms("limits", st.builds(_around, st.integers(context - 40, context + 8), st.booleans())),
        wire_forms("limits", st.builds(_around, body_sizes, st.booleans(), st.just(True))),
    )
    liveloop_headers = st.dictionaries(
        st.sampled_from(_HEADER_NAMES), _HEADER_TEXT, max_size=2
    ) | st.fixed_dictionaries({"X-Liveloop-Privacy-Mode": st.sampled_from(["true", "TRUE ", "1", "no", "", "\u00ff"])})
    plain = st.tuples(paths, bodies, st.just({}))
    headed = st.tuples(
        st.just("/v1/completions"),
        st.just(Hostile("headers", dumps(_completion()))),
        liveloop_headers,
    )
    return st.one_of(plain, plain, plain, headed)
