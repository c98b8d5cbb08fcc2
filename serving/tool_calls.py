"""Function tools in chat completions: how the tools are shown to the model and how its calls are read back.

The syntax (Hermes' and Qwen's): the model calls a tool by writing, anywhere in its answer, ::

    <tool_call>{"name": "search", "arguments": {"query": "kafka"}}</tool_call>

one block per call. The request's ``tools`` are rendered at the top of the prompt, before the first message,
as a ``<|tools|>`` turn: one line of instruction, then each tool's ``function`` object as one line of
compact JSON (keys sorted), for example::

    <|tools|>
    Call a tool by writing <tool_call>{"name": <tool name>, "arguments": <arguments object>}</tool_call>.
    {"description":"Search the corpus.","name":"search","parameters":{...}}

An assistant message with ``tool_calls`` is rendered as its content followed by one such block per call
(the arguments as the JSON the call carried), so the model sees its own past calls in the syntax it writes.

A block is a *valid* call when it is a JSON object with a string ``name`` that names one of the request's
tools and an ``arguments`` object (or a string holding one) that has every key the tool's ``parameters``
list as ``required``. Valid calls are returned as OpenAI ``tool_calls`` and cut from the text; a block that
does not parse, names an unknown tool, lacks a required argument, or is left open (``<tool_call>`` with no
end: the output was cut) stays in the content as text, and is recorded in the emitted generation's
``tool_calls`` with ``valid: false`` (the distiller's invalid-tool-call guard counts it). The same
parsing reads any engine's text (torch or vLLM): it needs only the completion's text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from ingest.payloads import MAX_TOOL_CALLS, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
INSTRUCTION = f'Call a tool by writing {OPEN}{{"name": <tool name>, "arguments": <arguments object>}}{CLOSE}.'
UNPARSED_NAME = "<unparsed>"
"""The name an invalid call is recorded under when its block names no tool (not JSON, no string name)."""
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|$)", re.DOTALL)
_NAME_MAX = 256  # ingest's Name limit (MAX_NAME_CHARS): a longer or multi-line name is recorded as unparsed
_PRINTABLE = re.compile(r"^[^\x00-\x1F\x7F]+$")


def render_tools(functions: list[dict[str, Any]]) -> str:
    """The ``<|tools|>`` turn for the request's tools' ``function`` objects (see the module docstring)."""
    lines = [INSTRUCTION] + [json.dumps(f, sort_keys=True, separators=(",", ":")) for f in functions]
    return "<|tools|>\n" + "\n".join(lines) + "\n"


def render_call(name: str, arguments: str) -> str:
    """One past call as the model writes it; ``arguments`` (a JSON string) is embedded as the JSON it holds."""
    try:
        parsed: Any = json.loads(arguments)
    except ValueError:
        parsed = arguments  # shown as sent: the model's context must say what was called, even if malformed
    return OPEN + json.dumps({"name": name, "arguments": parsed}, separators=(",", ":")) + CLOSE


@dataclass(frozen=True)
class Call:
    """One ``<tool_call>`` block of the output: its tool name, its arguments as a JSON string, and whether it
    is valid (``reason`` says why not)."""

    name: str
    arguments: str
    valid: bool
    reason: str = ""
    call_id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def record(self) -> ToolCall:
        """The call as the generation event records it."""
        return ToolCall(name=self.name, arguments=self.arguments, valid=self.valid)

    def openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` entry."""
        return {"id": self.call_id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class Parsed:
    """A completion's text read for tool calls: the content left, the valid calls (cut from it), every call."""

    content: str | None
    returned: list[Call]
    calls: list[Call]


def parse_tool_calls(text: str, tools: dict[str, list[str]]) -> Parsed:
    """Read the ``<tool_call>`` blocks of ``text`` against ``tools`` (name -> required argument names)."""
    calls: list[Call] = []
    kept: list[str] = []  # the text outside valid calls
    at = 0
    for match in _BLOCK.finditer(text):
        if len(calls) == MAX_TOOL_CALLS:  # the event holds at most this many; the rest stays text
            break
        closed = match.group(0).endswith(CLOSE)
        call = _read(match.group(1), tools) if closed else _invalid(match.group(1), "the block is never closed")
        calls.append(call)
        kept.append(text[at : match.start()] if call.valid else text[at : match.end()])
        at = match.end()
    kept.append(text[at:])
    returned = [c for c in calls if c.valid]
    content = "".join(kept)
    if returned:
        content = content.strip()
    return Parsed(content or None if returned else content, returned, calls)


def _read(block: str, tools: dict[str, list[str]]) -> Call:
    try:
        value: Any = json.loads(block)
    except ValueError as exc:
        return _invalid(block, f"not JSON: {exc}")
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return _invalid(block, 'not an object with a string "name"')
    name: str = value["name"]
    arguments: Any = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return _invalid(block, "arguments is a string that is not JSON", name)
    if not isinstance(arguments, dict):
        return _invalid(block, "arguments is not an object", name)
    encoded = json.dumps(arguments, separators=(",", ":"))
    if name not in tools:
        return _invalid(encoded, f"no tool is named {name[:80]!r}", name)
    missing = [key for key in tools[name] if key not in arguments]
    if missing:
        return _invalid(encoded, f"missing required arguments {missing}", name)
    return Call(name, encoded, True)


def _invalid(arguments: str, reason: str, name: str | None = None) -> Call:
    recordable = name if name and len(name) <= _NAME_MAX and _PRINTABLE.match(name) else UNPARSED_NAME
    return Call(recordable, arguments, False, reason)
