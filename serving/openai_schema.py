"""The OpenAI request bodies the gateway accepts, the chat template, and OpenAI-style error bodies.

Requests are closed models: an option the gateway cannot honour is refused with 400 naming it,
never silently ignored (penalties, ``logit_bias``, ``echo``, ``suffix`` and ``best_of`` are
accepted only at their neutral values). Options the gateway does not know at all are refused too.

Chat template (the tiny tokenizer has none): each message is rendered as ``<|role|>\\n`` + content +
``\\n``, and the prompt ends with ``<|assistant|>\\n``, the turn the model writes. For example::

    <|system|>
    Be brief.
    <|user|>
    Hi!
    <|assistant|>

Content given as a list of parts keeps its ``text`` parts, joined with nothing between them.

Function tools (``tools``): rendered as a ``<|tools|>`` turn before the first message, and an assistant
message's ``tool_calls`` after its content, in the syntax of :mod:`serving.tool_calls` (which also reads
the model's calls back). A ``tool`` message (a tool's result) is rendered like any other message, as
``<|tool|>\n`` + its content. ``tool_choice`` may be ``"auto"`` (the default with tools) or ``"none"``
(the tools are still shown; calls in the output stay text).

The optional ``liveloop`` object places the request's turn in an agent trajectory, as the
``X-Liveloop-Trajectory`` headers do (:mod:`serving.turns`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serving.errors import InvalidRequest
from serving.tool_calls import render_call, render_tools


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnPlaceBody(_Closed):
    """The body's ``liveloop`` object: a turn's place in its agent trajectory (the ``X-Liveloop-*`` trajectory
    headers' alternative; send one or the other). Checked by :mod:`serving.turns`, which names the bad field."""

    trajectory_id: str = Field(description="The trajectory (a UUID); X-Liveloop-Trajectory.")
    parent_turn_id: str | None = Field(default=None, description="The turn this one follows (a UUID).")
    agent: str | None = Field(default=None, description="orchestrator, subagent or single (the default).")
    agent_id: str | None = Field(default=None, description="Which agent instance, e.g. 'sub-1'; default 'main'.")
    frozen: bool | None = Field(default=None, description="A sub-agent that is not trained.")
    stage: int | None = Field(default=None, description="The orchestrator's round (0, 1, ...).")
    boundary: str | None = Field(default=None, description="none, summary, prune or truncation.")


class StreamOptions(_Closed):
    """``stream_options``: ``include_usage`` adds a last chunk with the token counts."""

    include_usage: bool = False


class _Common(_Closed):
    """Options shared by completions and chat completions."""

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    # A 64-bit seed, as OpenAI documents it: torch's generator refuses anything wider, and that failure
    # would surface inside the engine's batch (a 500 for every request decoded with it).
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)
    user: str | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    liveloop: TurnPlaceBody | None = None

    @field_validator("frequency_penalty", "presence_penalty")
    @classmethod
    def _no_penalty(cls, value: float | None) -> float | None:
        if value not in (None, 0, 0.0):
            raise ValueError("penalties are not supported; leave it unset or 0")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError("logit_bias is not supported; leave it unset or empty")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return value

    def stop_strings(self) -> tuple[str, ...]:
        """``stop`` as a tuple."""
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


class CompletionRequest(_Common):
    """``POST /v1/completions``. ``logprobs`` (0-5) asks for the sampled tokens' logprobs."""

    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must be a string or a non-empty list of strings")
        return value

    @model_validator(mode="after")
    def _supported(self) -> CompletionRequest:
        if self.echo:
            raise ValueError("echo is not supported; leave it false")
        if self.suffix:
            raise ValueError("suffix is not supported; leave it unset")
        if self.best_of not in (None, 1, self.n):
            raise ValueError("best_of is not supported; leave it unset")
        return self

    def prompts(self) -> list[str]:
        """The prompts, one or many."""
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class TextPart(_Closed):
    """A text part of a message's content."""

    type: Literal["text"]
    text: str


class FunctionCall(_Closed):
    """A past call's function: its name and its arguments as a JSON string (OpenAI's shape)."""

    name: str = Field(min_length=1)
    arguments: str


class MessageToolCall(_Closed):
    """One call of an assistant message's ``tool_calls``."""

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Closed):
    """One chat message; ``content`` is a string or a list of text parts. An assistant message may carry the
    ``tool_calls`` it made; a ``tool`` message answers one of them (``tool_call_id``)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _tool_fields(self) -> ChatMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError(f"only an assistant message can carry tool_calls, not a {self.role} message")
        if self.tool_call_id is not None and self.role != "tool":
            raise ValueError(f"only a tool message can carry tool_call_id, not a {self.role} message")
        return self

    def text(self) -> str:
        """The content as text, then the message's past tool calls in the model's syntax."""
        if self.content is None:
            text = ""
        elif isinstance(self.content, str):
            text = self.content
        else:
            text = "".join(part.text for part in self.content)
        calls = [render_call(c.function.name, c.function.arguments) for c in self.tool_calls or []]
        return "\n".join([text, *calls]) if text and calls else text + "\n".join(calls)


class FunctionDefinition(_Closed):
    """A function tool: its name, what it does, and its parameters' JSON Schema."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def required(self) -> list[str]:
        """The argument names its parameters' schema requires."""
        required = (self.parameters or {}).get("required", [])
        return [str(name) for name in required] if isinstance(required, list) else []


class Tool(_Closed):
    """One entry of ``tools``: only function tools exist."""

    type: Literal["function"]
    function: FunctionDefinition


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``. ``logprobs: true`` asks for the sampled tokens' logprobs."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=5)
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto"] | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _tools(self) -> ChatCompletionRequest:
        names = [tool.function.name for tool in self.tools or []]
        if len(names) != len(set(names)):
            raise ValueError("tools name a function twice; give each tool a name of its own")
        if self.parallel_tool_calls is False:
            raise ValueError("parallel_tool_calls false is not supported; leave it unset or true")
        return self

    def tool_table(self) -> dict[str, list[str]] | None:
        """The tools whose calls are read back (name -> required arguments); None when none are."""
        if not self.tools or self.tool_choice == "none":
            return None
        return {tool.function.name: tool.function.required() for tool in self.tools}

    def token_limit(self) -> int | None:
        """``max_completion_tokens`` (the newer name) or ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


def render_chat(messages: list[ChatMessage], tools: list[Tool] | None = None) -> str:
    """The prompt for ``messages`` (and ``tools``) under the module's chat template."""
    head = render_tools([t.function.model_dump(exclude_none=True) for t in tools]) if tools else ""
    lines = [f"<|{m.role}|>\n{m.text()}\n" for m in messages]
    return head + "".join(lines) + "<|assistant|>\n"


def parse_body(model: type[CompletionRequest] | type[ChatCompletionRequest], body: bytes) -> Any:
    """Validate a request body; InvalidRequest naming the first bad field otherwise."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise InvalidRequest(f"{where}: {first['msg']}{more}", param=where) from exc


def error_body(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-style error body, which the openai client turns into its exception with this message."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
