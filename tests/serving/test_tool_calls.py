"""The tool-call syntax (rendering, parsing), a turn's place from headers, and the context budget: pure units."""

from __future__ import annotations

import json
import uuid

import pytest

from serving.errors import InvalidRequest
from serving.openai_schema import ChatCompletionRequest, ChatMessage, TurnPlaceBody, render_chat
from serving.settings import ServingSettings
from serving.tool_calls import INSTRUCTION, UNPARSED_NAME, parse_tool_calls
from serving.turns import BudgetCheck, read_answer, read_turn

TOOLS = {"search": ["query"], "read": [], "prune_chunks": ["ids"]}


def test_valid_calls_are_cut_from_the_text_and_the_rest_is_content() -> None:
    text = (
        'Looking.\n<tool_call>{"name": "search", "arguments": {"query": "kafka"}}</tool_call>\n'
        '<tool_call>{"name": "read", "arguments": "{\\"id\\": 3}"}</tool_call>'
    )
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.content == "Looking."
    assert [(c.name, json.loads(c.arguments), c.valid) for c in parsed.returned] == [
        ("search", {"query": "kafka"}, True),
        ("read", {"id": 3}, True),
    ]
    assert parsed.calls == parsed.returned
    assert len({c.call_id for c in parsed.returned}) == 2
    only_call = parse_tool_calls('<tool_call>{"name": "read", "arguments": {}}</tool_call>', TOOLS)
    assert only_call.content is None


@pytest.mark.parametrize(
    ("block", "name", "reason"),
    [
        ('<tool_call>{"name": "search", "arguments": {"query": </tool_call>', UNPARSED_NAME, "not JSON"),
        ('<tool_call>["search"]</tool_call>', UNPARSED_NAME, 'string "name"'),
        ('<tool_call>{"name": "delete_all", "arguments": {}}</tool_call>', "delete_all", "no tool is named"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "search", "missing required arguments"),
        ('<tool_call>{"name": "search", "arguments": [1]}</tool_call>', "search", "not an object"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}}', UNPARSED_NAME, "never closed"),
    ],
)
def test_a_call_that_does_not_parse_or_names_an_unknown_tool_stays_text(block: str, name: str, reason: str) -> None:
    text = f"Let me look. {block}"
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.returned == []
    assert parsed.content == text  # returned as text, exactly as the model wrote it
    [call] = parsed.calls
    assert (call.name, call.valid) == (name, False)
    assert reason in call.reason
    assert call.record().valid is False


def test_text_without_calls_is_unchanged() -> None:
    parsed = parse_tool_calls("  just an answer\n", TOOLS)
    assert (parsed.content, parsed.calls) == ("  just an answer\n", [])


def test_tools_and_past_calls_are_rendered_in_the_syntax_the_model_writes() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "search",
                        "description": "Search.",
                        "parameters": {"type": "object", "required": ["query"]},
                    },
                }
            ],
            "messages": [
                {"role": "user", "content": "Find kafka."},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"query":"k"}'}}
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "3 hits"},
            ],
        }
    )
    assert request.tool_table() == {"search": ["query"]}
    assert render_chat(request.messages, request.tools) == (
        "<|tools|>\n"
        f"{INSTRUCTION}\n"
        '{"description":"Search.","name":"search","parameters":{"required":["query"],"type":"object"}}\n'
        "<|user|>\nFind kafka.\n"
        '<|assistant|>\n<tool_call>{"name":"search","arguments":{"query":"k"}}</tool_call>\n'
        "<|tool|>\n3 hits\n"
        "<|assistant|>\n"
    )
    # What the model is shown of a past call parses back as the same call.
    rendered = request.messages[1].text()
    assert [(c.name, c.arguments) for c in parse_tool_calls(rendered, TOOLS).returned] == [("search", '{"query":"k"}')]


def test_tool_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="only an assistant message can carry tool_calls"):
        ChatMessage.model_validate(
            {"role": "user", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]}
        )
    with pytest.raises(ValueError, match="name a function twice"):
        ChatCompletionRequest.model_validate(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"type": "function", "function": {"name": "f"}}] * 2,
            }
        )
    none = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "none",
        }
    )
    assert none.tool_table() is None


def test_a_turn_is_placed_by_headers_or_the_body() -> None:
    trajectory, parent = uuid.uuid4(), uuid.uuid4()
    headers = {
        "x-liveloop-trajectory": str(trajectory),
        "x-liveloop-parent-turn": str(parent),
        "x-liveloop-agent": "subagent",
        "x-liveloop-agent-id": "sub-1",
        "x-liveloop-frozen": "true",
        "x-liveloop-stage": "2",
        "x-liveloop-boundary": "summary",
    }
    turn = read_turn(headers, None)
    assert turn is not None
    turn_id = uuid.uuid4()
    place = turn.place(turn_id, 40, 100)
    assert (place.trajectory_id, place.turn_id, place.parent_turn_id) == (trajectory, turn_id, parent)
    assert (place.agent, place.agent_id, place.frozen, place.stage, place.boundary) == (
        "subagent",
        "sub-1",
        True,
        2,
        "summary",
    )
    assert (place.context_tokens, place.budget_tokens) == (40, 100)
    body = read_turn({}, TurnPlaceBody(trajectory_id=str(trajectory), agent="orchestrator"))
    assert body is not None
    assert body.place(turn_id, 1, None).agent == "orchestrator"
    single = read_turn({"x-liveloop-trajectory": str(trajectory)}, None)
    assert single is not None
    assert (single.place(turn_id, 1, None).agent, single.place(turn_id, 1, None).agent_id) == ("single", "main")
    assert read_turn({}, None) is None


@pytest.mark.parametrize(
    ("headers", "named"),
    [
        ({"x-liveloop-trajectory": "not-a-uuid"}, "X-Liveloop-Trajectory"),
        ({"x-liveloop-agent": "orchestrator"}, "X-Liveloop-Trajectory"),
        ({"x-liveloop-parent-turn": "7"}, "X-Liveloop-Parent-Turn"),
        ({"x-liveloop-agent": "boss"}, "X-Liveloop-Agent"),
        ({"x-liveloop-agent-id": "Sub One"}, "X-Liveloop-Agent-Id"),
        ({"x-liveloop-frozen": "maybe"}, "X-Liveloop-Frozen"),
        ({"x-liveloop-frozen": "true", "x-liveloop-agent": "orchestrator"}, "X-Liveloop-Frozen"),
        ({"x-liveloop-stage": "-1"}, "X-Liveloop-Stage"),
        ({"x-liveloop-stage": "99999"}, "X-Liveloop-Stage"),
        ({"x-liveloop-boundary": "reset"}, "X-Liveloop-Boundary"),
    ],
)
def test_a_bad_header_is_refused_naming_it(headers: dict[str, str], named: str) -> None:
    if named != "X-Liveloop-Trajectory" or "x-liveloop-agent" not in headers:
        headers = {"x-liveloop-trajectory": str(uuid.uuid4())} | headers
    with pytest.raises(InvalidRequest, match=named) as refused:
        read_turn(headers, None)
    assert refused.value.param == named


def test_headers_and_body_together_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="send one"):
        read_turn({"x-liveloop-trajectory": str(uuid.uuid4())}, TurnPlaceBody(trajectory_id=str(uuid.uuid4())))
    with pytest.raises(InvalidRequest, match=r"liveloop\.agent"):
        read_turn({}, TurnPlaceBody(trajectory_id=str(uuid.uuid4()), agent="boss"))


def test_the_budget_states_and_the_hard_refusal() -> None:
    settings = ServingSettings(budget_soft_tokens=10, budget_hard_tokens=20)
    assert BudgetCheck.of(ServingSettings(), 10**6) is None  # off by default
    assert [BudgetCheck.of(settings, n).state for n in (10, 11, 20, 21)] == ["ok", "soft", "soft", "hard"]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="soft one comes first"):
        ServingSettings(budget_soft_tokens=30, budget_hard_tokens=20)
    text = (
        'Hm. <tool_call>{"name": "search", "arguments": {"query": "q"}}</tool_call>'
        '<tool_call>{"name": "prune_chunks", "arguments": {"ids": [1]}}</tool_call>'
    )
    soft = read_answer(text, "stop", TOOLS, BudgetCheck.of(settings, 15))
    assert [c.name for c in soft.tool_calls] == ["search", "prune_chunks"]
    assert soft.finish_reason == "tool_calls"
    hard_check = BudgetCheck.of(settings, 25)
    assert hard_check is not None
    hard = read_answer(text, "stop", TOOLS, hard_check)
    assert [c.name for c in hard.tool_calls] == ["prune_chunks"]
    assert [c.name for c in hard.refused] == ["search"]
    assert hard.content is not None
    assert hard.content.startswith("Hm.\n[liveloop] refused tool calls (search)")
    assert "over the hard budget of 20 tokens; only prune_chunks" in hard.content
    assert [(c.name, c.valid) for c in hard.recorded] == [("search", False), ("prune_chunks", True)]
    assert hard_check.body([(0, hard.refused[0])])["refused"] == [
        {"choice": 0, "name": "search", "arguments": '{"query":"q"}'}
    ]
    only_search = read_answer(text.split('<tool_call>{"name": "prune')[0], "length", TOOLS, hard_check)
    assert (only_search.tool_calls, only_search.finish_reason) == ([], "length")
