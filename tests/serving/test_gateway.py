"""The gateway over a real socket with the official openai client, and its generation events on a real topic."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from infra.stack import Endpoints
from ingest.events import parse_event
from serving.engine import SamplingParams
from serving.openai_schema import ChatMessage, render_chat
from serving.torch_engine import TorchEngine
from tests.serving.gateway_server import CANARY, VERSION, Gateway, read_events

MODEL = "liveloop-policy"
GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


def test_completions_work_with_the_openai_client(start_gateway: Callable[..., Gateway], engine: TorchEngine) -> None:
    gateway = start_gateway()
    expected = engine.generate(["def add(a, b):"], GREEDY)[0]
    raw = gateway.client().completions.with_raw_response.create(
        model=MODEL, prompt="def add(a, b):", max_tokens=12, temperature=0, logprobs=1
    )
    completion = raw.parse()
    assert raw.headers["x-liveloop-policy-version"] == str(VERSION)
    assert completion.model_extra is not None
    liveloop = completion.model_extra["liveloop"]
    assert liveloop["policy_version"] == VERSION
    assert liveloop["generation_ids"] == [liveloop["generation_id"]]
    choice = completion.choices[0]
    assert choice.text == expected.text
    assert choice.finish_reason == expected.finish_reason
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == [f"token_id:{t}" for t in expected.token_ids]
    assert choice.logprobs.token_logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(expected.prompt_token_ids)
    assert completion.usage.completion_tokens == len(expected.token_ids)


def test_streamed_completions_join_to_the_same_text(start_gateway: Callable[..., Gateway], engine: TorchEngine) -> None:
    gateway = start_gateway()
    expected = engine.generate(["The quick brown fox"], GREEDY)[0]
    stream = gateway.client().completions.create(
        model=MODEL,
        prompt="The quick brown fox",
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == expected.finish_reason
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert {c.model_extra["liveloop"]["policy_version"] for c in chunks if c.model_extra} == {VERSION}


def test_chat_completions_work_streamed_and_not(start_gateway: Callable[..., Gateway], engine: TorchEngine) -> None:
    gateway = start_gateway()
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    prompt = render_chat([ChatMessage.model_validate(m) for m in messages])
    assert prompt == "<|system|>\nBe brief.\n<|user|>\nHi!\n<|assistant|>\n"
    expected = engine.generate([prompt], GREEDY)[0]
    client = gateway.client()
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, logprobs=True
    )
    reply = raw.parse()
    assert raw.headers["x-liveloop-policy-version"] == str(VERSION)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content == expected.text
    assert reply.choices[0].logprobs is not None
    assert reply.choices[0].logprobs.content is not None
    assert [c.logprob for c in reply.choices[0].logprobs.content] == pytest.approx(expected.logprobs, abs=1e-4)
    assert reply.model_extra is not None
    assert reply.model_extra["liveloop"]["policy_version"] == VERSION
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == expected.finish_reason


def test_a_missing_or_wrong_key_gets_401(start_gateway: Callable[..., Gateway]) -> None:
    gateway = start_gateway()
    with pytest.raises(openai.AuthenticationError) as wrong:
        gateway.client(key="llgk_wrong").completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert wrong.value.status_code == 401
    assert wrong.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        gateway.client(key="llgk_wrong").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}]
        )
    missing = httpx.post(f"{gateway.url}/v1/completions", json={"model": MODEL, "prompt": "hi"})
    assert missing.status_code == 401
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{gateway.url}/v1/models").status_code == 401
    models = gateway.client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_bad_requests_get_openai_errors(start_gateway: Callable[..., Gateway]) -> None:
    client = start_gateway().client()
    with pytest.raises(openai.NotFoundError, match="not served here"):
        client.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, temperature=3)
    with pytest.raises(openai.BadRequestError, match="echo is not supported"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, echo=True)
    with pytest.raises(openai.BadRequestError, match="exceeds the model's context"):
        client.completions.create(model=MODEL, prompt="y" * 1020, max_tokens=10)
    with pytest.raises(openai.BadRequestError, match="X-Liveloop-Tenant"):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_headers={"X-Liveloop-Tenant": "Bad!"})
    with pytest.raises(openai.BadRequestError, match="X-Liveloop-Task-Kind 'Batch Lookup' must be a lower-case name"):
        client.completions.create(
            model=MODEL, prompt="hi", max_tokens=2, extra_headers={"X-Liveloop-Task-Kind": "Batch Lookup"}
        )


def test_every_completion_is_emitted_as_a_generation_event(
    start_gateway: Callable[..., Gateway], engine: TorchEngine, endpoints: Endpoints
) -> None:
    gateway = start_gateway()
    client = gateway.client()
    headers = {
        "X-Liveloop-Session": "s-42",
        "X-Liveloop-User": "u-7",
        "X-Liveloop-Tenant": "acme",
        "X-Liveloop-Surface": "ide.tab",
        "X-Liveloop-Task-Kind": "lookup.batch",
    }
    prompts = ["def add(a, b):", "import numpy as"]
    several = client.completions.create(
        model=MODEL, prompt=prompts, n=2, max_tokens=10, temperature=0.8, seed=3, extra_headers=headers
    )
    # Choice k is prompt k // 2 with seed 3 + k % 2: the n samples of a prompt differ, and repeat.
    sampled = [
        engine.generate([p], SamplingParams(temperature=0.8, max_tokens=10, seed=3 + k))[0]
        for p in prompts
        for k in range(2)
    ]
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8, temperature=0, user="openai-user"
    )
    chat_prompt = render_chat([ChatMessage(role="user", content="Hi")])
    greedy_chat = engine.generate([chat_prompt], SamplingParams(temperature=0, max_tokens=8))[0]
    assert gateway.sdk.flush(timeout=30)
    events = [parse_event(e) for e in read_events(endpoints.kafka_bootstrap, gateway.topic, 5)]
    assert len(events) == 5
    by_id = {str(e.payload.generation_id): e for e in events}  # type: ignore[union-attr]
    assert several.model_extra is not None
    ids = several.model_extra["liveloop"]["generation_ids"]
    assert len(ids) == 4
    for k, (choice, expected) in enumerate(zip(several.choices, sampled, strict=True)):
        event = by_id[ids[k]]
        payload: Any = event.payload
        assert event.type == "generation"
        assert (event.session_id, event.user_id, event.tenant) == ("s-42", "u-7", "acme")
        assert payload.surface == "ide.tab"
        assert payload.task_kind == "lookup.batch"  # the product's own kind (the chat below shows the default)
        assert payload.model == MODEL
        assert payload.policy_version == VERSION
        assert payload.prompt == prompts[k // 2]
        assert payload.completion == choice.text == expected.text
        assert payload.prompt_token_ids == expected.prompt_token_ids
        assert payload.completion_token_ids == expected.token_ids
        assert payload.completion_logprobs == pytest.approx(expected.logprobs, abs=1e-4)
        assert payload.latency_ms > 0
    assert chat.model_extra is not None
    event = by_id[chat.model_extra["liveloop"]["generation_id"]]
    payload = event.payload
    assert event.user_id == "openai-user"  # the OpenAI 'user' field when there is no X-Liveloop-User
    assert event.session_id == f"gateway-{chat.model_extra['liveloop']['generation_id']}"
    assert (event.tenant, payload.surface, payload.task_kind) == ("default", "api", "chat")  # type: ignore[union-attr]
    assert payload.prompt == chat_prompt  # type: ignore[union-attr]
    assert payload.completion_token_ids == greedy_chat.token_ids  # type: ignore[union-attr]
    assert payload.completion_logprobs == pytest.approx(greedy_chat.logprobs, abs=1e-4)  # type: ignore[union-attr]


def test_liveloop_headers_are_read_as_utf8(start_gateway: Callable[..., Gateway], endpoints: Endpoints) -> None:
    gateway = start_gateway()
    body = {"model": MODEL, "prompt": "def f():", "max_tokens": 4, "temperature": 0}
    auth = {"Authorization": f"Bearer {gateway.key}"}
    utf8 = {"X-Liveloop-User": "zoë-ユーザー".encode(), "X-Liveloop-Session": "séance-1".encode()}
    answered = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=auth | utf8)
    assert answered.status_code == 200, answered.text
    # The session comes back as the bytes it came in as (header values travel as latin-1 text).
    assert dict(answered.headers.raw)[b"x-liveloop-session"] == "séance-1".encode()
    assert answered.json()["liveloop"]["session_id"] == "séance-1"
    latin1 = {"X-Liveloop-User": "zo\xeb".encode("latin-1")}  # not UTF-8: refused, naming the header
    refused = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=auth | latin1)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "X-Liveloop-User"
    assert "X-Liveloop-User is not valid UTF-8" in refused.json()["error"]["message"]
    assert gateway.sdk.flush(timeout=30)
    (event,) = [parse_event(e) for e in read_events(endpoints.kafka_bootstrap, gateway.topic, 1)]
    assert (event.user_id, event.session_id) == ("zoë-ユーザー", "séance-1")


def test_a_prompt_with_a_nul_is_served_and_its_event_stored_with_a_replacement_character(
    start_gateway: Callable[..., Gateway], engine: TorchEngine, endpoints: Endpoints
) -> None:
    gateway = start_gateway()
    prompt = "def f():\x00"
    served = gateway.client().completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0)
    expected = engine.generate([prompt], SamplingParams(temperature=0, max_tokens=6))[0]
    assert served.choices[0].text == expected.text
    assert gateway.sdk.flush(timeout=30)
    (event,) = [parse_event(e) for e in read_events(endpoints.kafka_bootstrap, gateway.topic, 1)]
    payload: Any = event.payload
    assert payload.prompt == "def f():\ufffd"  # the audit store cannot keep a NUL
    assert payload.prompt_token_ids == expected.prompt_token_ids  # what the model read, exactly


def test_the_router_chooses_the_version_per_session(start_gateway: Callable[..., Gateway], engine: TorchEngine) -> None:
    gateway = start_gateway(router=lambda session: CANARY if session == "canary-session" else None)
    client = gateway.client()
    expected = engine.generate(["Hello"], GREEDY, policy_version=CANARY)[0]
    canary = client.completions.with_raw_response.create(
        model=MODEL,
        prompt="Hello",
        max_tokens=12,
        temperature=0,
        extra_headers={"X-Liveloop-Session": "canary-session"},
    )
    assert canary.headers["x-liveloop-policy-version"] == str(CANARY)
    assert canary.parse().choices[0].text == expected.text
    other = client.completions.with_raw_response.create(
        model=MODEL, prompt="Hello", max_tokens=12, temperature=0, extra_headers={"X-Liveloop-Session": "other"}
    )
    assert other.headers["x-liveloop-policy-version"] == str(VERSION)
    metrics = httpx.get(f"{gateway.url}/metrics").text
    assert 'liveloop_gateway_generations_total{policy_version="8"} 1.0' in metrics
    assert 'liveloop_gateway_generations_total{policy_version="7"} 1.0' in metrics


def test_probes_say_when_a_version_is_loaded(start_gateway: Callable[..., Gateway]) -> None:
    empty = TorchEngine(device="cpu")
    try:
        gateway = start_gateway(served=empty)
        assert httpx.get(f"{gateway.url}/healthz").status_code == 200
        assert httpx.get(f"{gateway.url}/readyz").status_code == 503
        with pytest.raises(openai.InternalServerError) as not_ready:
            gateway.client().completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert not_ready.value.status_code == 503
        loaded = start_gateway()
        ready = httpx.get(f"{loaded.url}/readyz")
        assert ready.status_code == 200
        assert ready.json() == {"ready": True, "default_version": VERSION, "loaded_versions": [VERSION, CANARY]}
    finally:
        empty.close()


def test_every_answer_names_the_session_its_generations_were_filed_under(
    start_gateway: Callable[..., Gateway], endpoints: Endpoints
) -> None:
    """Feedback joins its generation only under the generation's session, so a caller that named none
    must learn the one the gateway made up: in a header and in the body (and every stream chunk)."""
    gateway = start_gateway()
    client = gateway.client()
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="def f():", max_tokens=4, temperature=0)
    made_up = raw.headers["X-Liveloop-Session"]
    body = raw.parse()
    assert body.model_extra is not None
    assert (
        made_up
        == body.model_extra["liveloop"]["session_id"]
        == f"gateway-{body.model_extra['liveloop']['generation_id']}"
    )
    named = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        extra_headers={"X-Liveloop-Session": "backend-7"},
    )
    chat = named.parse()
    assert chat.model_extra is not None
    assert named.headers["X-Liveloop-Session"] == chat.model_extra["liveloop"]["session_id"] == "backend-7"
    stream = client.completions.create(model=MODEL, prompt="def g():", max_tokens=4, stream=True)
    chunks = [chunk.model_extra["liveloop"]["session_id"] for chunk in stream if chunk.model_extra]
    assert chunks
    assert set(chunks) == {stream.response.headers["X-Liveloop-Session"]}
    assert gateway.sdk.flush(timeout=30)
    events = [parse_event(e) for e in read_events(endpoints.kafka_bootstrap, gateway.topic, 3)]
    assert {e.session_id for e in events} == {made_up, "backend-7", chunks[0]}
