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
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from serving.errors import InvalidRequest


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


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


class ChatMessage(_Closed):
    """One chat message; ``content`` is a string or a list of text parts."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``. ``logprobs: true`` asks for the sampled tokens' logprobs."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=5)

    def token_limit(self) -> int | None:
        """``max_completion_tokens`` (the newer name) or ``max_tokens``."""
        return self.max_completion_tokens or self.max_tokens


def render_chat(messages: list[ChatMessage]) -> str:
    """The prompt for ``messages`` under the module's chat template."""
    lines = [f"<|{m.role}|>\n{m.text()}\n" for m in messages]
    return "".join(lines) + "<|assistant|>\n"


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
