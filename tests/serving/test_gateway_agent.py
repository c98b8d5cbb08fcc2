"""Agent turns through the real gateway: tool calls, trajectory headers and the context budget, with the openai
client and the generation events read back from a real topic.

The tiny model cannot write the ``<tool_call>`` syntax, so the tool tests serve through
:class:`~tests.serving.gateway_server.ScriptedEngine`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from infra.stack import Endpoints
from ingest.events import GenerationEvent, parse_event
from serving.engine import SamplingParams
from serving.openai_schema import ChatCompletionRequest, render_chat
from serving.torch_engine import TorchEngine
from tests.serving.gateway_server import Gateway, ScriptedEngine, read_events

MODEL = "liveloop-policy"
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "prune_chunks",
            "description": "Drop chunks from the context.",
            "parameters": {"type": "object", "properties": {"ids": {"type": "array"}}, "required": ["ids"]},
        },
    },
]
SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "kafka offsets"}}</tool_call>'
PRUNE = '<tool_call>{"name": "prune_chunks", "arguments": {"ids": [2, 3]}}</tool_call>'


def _events(gateway: Gateway, endpoints: Endpoints, count: int) -> dict[str, GenerationEvent]:
    assert gateway.sdk.flush(timeout=30)
    events = [parse_event(e) for e in read_events(endpoints.kafka_bootstrap, gateway.topic, count)]
    return {str(e.payload.generation_id): e for e in events if isinstance(e, GenerationEvent)}


def _id(reply: Any) -> str:
    return str(reply.model_extra["liveloop"]["generation_id"])


def test_tool_calls_round_trip_with_the_openai_client(
    start_gateway: Callable[..., Gateway], engine: TorchEngine, endpoints: Endpoints
) -> None:
    scripted = ScriptedEngine(
        engine,
        [
            f"I will look it up.\n{SEARCH}",
            '<tool_call>{"name": "delete_everything", "arguments": {}}</tool_call>',
            f"{SEARCH}{PRUNE}",
        ],
    )
    gateway = start_gateway(served=scripted)
    client = gateway.client()
    messages: list[Any] = [{"role": "user", "content": "How are Kafka offsets committed?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=64)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will look it up."
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "search"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"query": "kafka offsets"}  # type: ignore[union-attr]
    # The agent runs the tool and sends its call and result back: both are accepted and rendered.
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "x"},
    ]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=64)
    unknown = second.choices[0]
    assert unknown.finish_reason == "stop"
    assert unknown.message.tool_calls is None
    assert unknown.message.content == scripted.served[1].text  # an unknown tool's call is returned as text
    stream = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=64, stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [tc for c in chunks for tc in c.choices[0].delta.tool_calls or []]
    assert [(d.index, d.function.name) for d in deltas] == [(0, "search"), (1, "prune_chunks")]  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    by_id = _events(gateway, endpoints, 3)
    payload: Any = by_id[_id(first)].payload
    tools = ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages, "tools": TOOLS}).tools
    first_prompt = render_chat(
        ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages[:1]}).messages, tools
    )
    assert payload.prompt == first_prompt
    assert payload.completion == scripted.served[0].text  # the text as the model wrote it, call included
    assert payload.completion_token_ids == scripted.served[0].token_ids
    assert [(c.name, json.loads(c.arguments), c.valid) for c in payload.tool_calls] == [
        ("search", {"query": "kafka offsets"}, True)
    ]
    assert payload.turn is None  # no trajectory headers: no place
    second_payload: Any = by_id[_id(second)].payload
    past_call = '<tool_call>{"name":"search","arguments":{"query":"kafka offsets"}}</tool_call>'
    assert f"<|assistant|>\nI will look it up.\n{past_call}\n<|tool|>\nx\n<|assistant|>\n" in second_payload.prompt
    assert [(c.name, c.valid) for c in second_payload.tool_calls] == [("delete_everything", False)]


def test_trajectory_headers_land_in_the_event_with_the_tokens_as_served(
    start_gateway: Callable[..., Gateway], endpoints: Endpoints
) -> None:
    gateway = start_gateway()
    trajectory, parent = uuid.uuid4(), uuid.uuid4()
    headers = {
        "X-Liveloop-Session": "agent-session-1",
        "X-Liveloop-Trajectory": str(trajectory),
        "X-Liveloop-Parent-Turn": str(parent),
        "X-Liveloop-Agent": "subagent",
        "X-Liveloop-Agent-Id": "sub-2",
        "X-Liveloop-Frozen": "true",
        "X-Liveloop-Stage": "1",
        "X-Liveloop-Boundary": "summary",
    }
    raw = gateway.client().chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Summarise: the broker commits offsets."}],
        max_tokens=10,
        temperature=0.9,
        seed=5,
        logprobs=True,
        extra_headers=headers,
    )
    reply = raw.parse()
    assert "X-Liveloop-Budget" not in raw.headers  # no budget set
    liveloop = reply.model_extra["liveloop"]  # type: ignore[index]
    assert liveloop["trajectory_id"] == str(trajectory)
    assert "budget" not in liveloop
    served = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert served
    event = _events(gateway, endpoints, 1)[liveloop["generation_id"]]
    payload: Any = event.payload
    assert event.session_id == "agent-session-1"
    turn = payload.turn
    assert turn is not None
    assert (turn.trajectory_id, turn.turn_id, turn.parent_turn_id) == (trajectory, uuid.UUID(_id(reply)), parent)
    assert (turn.agent, turn.agent_id, turn.frozen, turn.stage, turn.boundary) == (
        "subagent",
        "sub-2",
        True,
        1,
        "summary",
    )
    assert turn.context_tokens == len(payload.prompt_token_ids) == reply.usage.prompt_tokens  # type: ignore[union-attr]
    assert turn.budget_tokens is None
    # The token ids and logprobs the event carries are exactly those the client was served.
    assert [f"token_id:{t}" for t in payload.completion_token_ids] == [t.token for t in served]
    assert payload.completion_logprobs == [t.logprob for t in served]


def test_the_budget_says_soft_and_refuses_tools_past_hard(
    start_gateway: Callable[..., Gateway], engine: TorchEngine, endpoints: Endpoints
) -> None:
    def messages(padding: int) -> list[Any]:
        return [{"role": "user", "content": "Find it." + " more context" * padding}]

    def prompt_tokens(padding: int) -> int:
        request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages(padding), "tools": TOOLS})
        prompt = render_chat(request.messages, request.tools)
        return len(engine.generate([prompt], SamplingParams(temperature=0, max_tokens=1))[0].prompt_token_ids)

    soft, hard = prompt_tokens(0), prompt_tokens(10)  # padding 0: ok, 5: soft, 20: hard
    scripted = ScriptedEngine(engine, [SEARCH, SEARCH, f"Over budget. {SEARCH}{PRUNE}", SEARCH])
    gateway = start_gateway(served=scripted, budget_soft_tokens=soft, budget_hard_tokens=hard)
    client = gateway.client()
    place = {"X-Liveloop-Trajectory": str(uuid.uuid4()), "X-Liveloop-Agent": "single"}
    replies = []
    for padding, state in [(0, "ok"), (5, "soft"), (20, "hard")]:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages(padding), tools=TOOLS, max_tokens=64, extra_headers=place
        )
        reply = raw.parse()
        replies.append(reply)
        assert raw.headers["X-Liveloop-Budget"] == state
        budget = reply.model_extra["liveloop"]["budget"]  # type: ignore[index]
        assert budget | {"refused": None} == {
            "state": state,
            "context_tokens": prompt_tokens(padding),
            "soft": soft,
            "hard": hard,
            "refused": None,
        }
    ok, nudged, refused = (r.choices[0] for r in replies)
    for allowed in (ok, nudged):
        assert allowed.finish_reason == "tool_calls"
        assert [c.function.name for c in allowed.message.tool_calls or []] == ["search"]  # type: ignore[union-attr]
    # Past hard: search is refused (not returned; an error the agent reads); prune_chunks still goes through.
    assert [c.function.name for c in refused.message.tool_calls or []] == ["prune_chunks"]  # type: ignore[union-attr]
    assert refused.finish_reason == "tool_calls"
    assert refused.message.content is not None
    assert refused.message.content.startswith("Over budget.\n[liveloop] refused tool calls (search)")
    assert f"over the hard budget of {hard} tokens" in refused.message.content
    assert replies[2].model_extra["liveloop"]["budget"]["refused"] == [  # type: ignore[index]
        {"choice": 0, "name": "search", "arguments": '{"query":"kafka offsets"}'}
    ]
    # Without a trajectory, no budget applies.
    plain = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages(20), tools=TOOLS, max_tokens=64
    )
    assert "X-Liveloop-Budget" not in plain.headers
    assert "budget" not in plain.parse().model_extra["liveloop"]  # type: ignore[index]
    assert plain.parse().choices[0].message.tool_calls is not None

    by_id = _events(gateway, endpoints, 4)
    over: Any = by_id[_id(replies[2])].payload
    assert [(c.name, c.valid) for c in over.tool_calls] == [("search", False), ("prune_chunks", True)]
    assert over.turn.context_tokens > over.turn.budget_tokens == hard
    within: Any = by_id[_id(replies[0])].payload
    assert (within.turn.context_tokens, within.turn.budget_tokens) == (soft, hard)


BAD_HEADERS = [
    ({"X-Liveloop-Trajectory": "nope"}, "X-Liveloop-Trajectory"),
    ({"X-Liveloop-Parent-Turn": "turn-3"}, "X-Liveloop-Parent-Turn"),
    ({"X-Liveloop-Agent": "manager"}, "X-Liveloop-Agent"),
    ({"X-Liveloop-Agent-Id": "Sub 1"}, "X-Liveloop-Agent-Id"),
    ({"X-Liveloop-Frozen": "true"}, "X-Liveloop-Frozen"),  # a single agent cannot be frozen
    ({"X-Liveloop-Stage": "first"}, "X-Liveloop-Stage"),
    ({"X-Liveloop-Boundary": "reset"}, "X-Liveloop-Boundary"),
]


def test_bad_trajectory_headers_get_400_naming_the_header(start_gateway: Callable[..., Gateway]) -> None:
    gateway = start_gateway()
    client = gateway.client()
    hi = [{"role": "user", "content": "hi"}]
    cases = [({"X-Liveloop-Agent": "subagent"}, "X-Liveloop-Trajectory")] + [
        ({"X-Liveloop-Trajectory": str(uuid.uuid4())} | headers, named) for headers, named in BAD_HEADERS
    ]
    for headers, named in cases:
        with pytest.raises(openai.BadRequestError, match=named) as refused:
            client.chat.completions.create(model=MODEL, messages=hi, max_tokens=2, extra_headers=headers)  # type: ignore[arg-type]
        assert refused.value.status_code == 400
    body = {"model": MODEL, "messages": hi, "liveloop": {"trajectory_id": "x"}}
    answer = httpx.post(
        f"{gateway.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {gateway.key}"}
    )
    assert answer.status_code == 400
    assert "liveloop.trajectory_id" in answer.json()["error"]["message"]
