"""OpenAI response bodies and server-sent-event chunks built from served generations.

Every body (and every stream chunk) carries a ``liveloop`` object::

    {"generation_id": "<choice 0's id>", "generation_ids": ["<one per choice>"], "policy_version": 7,
     "session_id": "<the session the generations were filed under>"}

Feedback events name a choice's ``generation_id`` and must be sent under ``session_id`` (the request's
``X-Liveloop-Session``, or the one the gateway made up when the request had none): the distiller
joins feedback to generations within one session only. Token logprobs, when asked for (``logprobs`` on
completions, ``logprobs: true`` on chat), name tokens as ``token_id:<id>`` (the form vLLM uses with
``return_tokens_as_token_ids``): token ids are what the learner needs, and a byte-level token has no
printable text of its own. The logprob is the behaviour policy's (see :mod:`serving.torch_decode`).

With ``tools``, a chat choice's message holds the valid calls as ``tool_calls`` (``finish_reason``
``"tool_calls"``) and the rest of the text as ``content`` (:mod:`serving.tool_calls`). A request placed in a
trajectory adds ``trajectory_id`` to the ``liveloop`` object (its turn ids are the generation ids), and
``budget`` when a context budget is set (:mod:`serving.turns`).

Streams: the engine returns whole completions, so a stream sends each choice's text in one chunk,
then a chunk with its ``finish_reason``, then (``stream_options.include_usage``) a usage chunk, then
``data: [DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from serving.engine import Generation
from serving.turns import Answer


@dataclass(frozen=True)
class Choice:
    """One served choice: its generation and the id its event and feedback carry."""

    generation: Generation
    generation_id: UUID
    answer: Answer | None = None
    """A chat choice's content and tool calls, read from the generation's text; None for a completion."""

    def message(self) -> dict[str, Any]:
        """The chat message (or a stream's first delta) of this choice."""
        if self.answer is None:
            return {"role": "assistant", "content": self.generation.text}
        message: dict[str, Any] = {"role": "assistant", "content": self.answer.content}
        if self.answer.tool_calls:
            message["tool_calls"] = [call.openai() for call in self.answer.tool_calls]
        return message

    @property
    def finish_reason(self) -> str:
        """``tool_calls`` when the choice returns tool calls, else the generation's."""
        return self.generation.finish_reason if self.answer is None else self.answer.finish_reason


@dataclass(frozen=True)
class Reply:
    """What every body of one request shares."""

    response_id: str
    created: int
    model: str
    choices: list[Choice]
    prompt_tokens: int
    session_id: str
    trajectory_id: UUID | None = None
    budget: dict[str, Any] | None = field(default=None)

    def liveloop(self) -> dict[str, Any]:
        ids = [str(c.generation_id) for c in self.choices]
        meta: dict[str, Any] = {
            "generation_id": ids[0],
            "generation_ids": ids,
            "policy_version": self.policy_version,
            "session_id": self.session_id,
        }
        if self.trajectory_id is not None:
            meta["trajectory_id"] = str(self.trajectory_id)
        if self.budget is not None:
            meta["budget"] = self.budget
        return meta

    @property
    def policy_version(self) -> int:
        return self.choices[0].generation.policy_version

    def usage(self) -> dict[str, int]:
        completion = sum(len(c.generation.token_ids) for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }


def _token(token_id: int) -> str:
    return f"token_id:{token_id}"


def completion_logprobs(generation: Generation, top: int) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object of one choice."""
    tokens = [_token(t) for t in generation.token_ids]
    return {
        "tokens": tokens,
        "token_logprobs": generation.logprobs,
        "top_logprobs": [{t: lp} for t, lp in zip(tokens, generation.logprobs, strict=True)] if top else None,
        "text_offset": None,
    }


def chat_logprobs(generation: Generation, top: int) -> dict[str, Any]:
    """The chat ``logprobs`` object of one choice."""
    content = []
    for token_id, logprob in zip(generation.token_ids, generation.logprobs, strict=True):
        token = _token(token_id)
        alternatives = [{"token": token, "logprob": logprob, "bytes": None}] if top else []
        content.append({"token": token, "logprob": logprob, "bytes": None, "top_logprobs": alternatives})
    return {"content": content, "refusal": None}


def completion_body(reply: Reply, logprobs: int | None) -> dict[str, Any]:
    """The ``text_completion`` body."""
    choices = [
        {
            "index": i,
            "text": c.generation.text,
            "finish_reason": c.generation.finish_reason,
            "logprobs": None if logprobs is None else completion_logprobs(c.generation, logprobs),
        }
        for i, c in enumerate(reply.choices)
    ]
    return {
        "id": reply.response_id,
        "object": "text_completion",
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
        "usage": reply.usage(),
        "liveloop": reply.liveloop(),
    }


def chat_body(reply: Reply, logprobs: bool, top_logprobs: int) -> dict[str, Any]:
    """The ``chat.completion`` body."""
    choices = [
        {
            "index": i,
            "message": c.message(),
            "finish_reason": c.finish_reason,
            "logprobs": chat_logprobs(c.generation, top_logprobs) if logprobs else None,
        }
        for i, c in enumerate(reply.choices)
    ]
    return {
        "id": reply.response_id,
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.model,
        "choices": choices,
        "usage": reply.usage(),
        "liveloop": reply.liveloop(),
    }


def completion_chunks(reply: Reply, logprobs: int | None, include_usage: bool) -> Iterator[bytes]:
    """The SSE chunks of a streamed completion (see the module docstring)."""
    head = {"id": reply.response_id, "object": "text_completion", "created": reply.created, "model": reply.model}
    meta = reply.liveloop()
    for i, c in enumerate(reply.choices):
        lp = None if logprobs is None else completion_logprobs(c.generation, logprobs)
        text = {"index": i, "text": c.generation.text, "finish_reason": None, "logprobs": lp}
        yield sse(head | {"choices": [text], "liveloop": meta})
        end = {"index": i, "text": "", "finish_reason": c.generation.finish_reason, "logprobs": None}
        yield sse(head | {"choices": [end], "liveloop": meta})
    if include_usage:
        yield sse(head | {"choices": [], "usage": reply.usage(), "liveloop": meta})
    yield b"data: [DONE]\n\n"


def chat_chunks(reply: Reply, logprobs: bool, top_logprobs: int, include_usage: bool) -> Iterator[bytes]:
    """The SSE chunks of a streamed chat completion (see the module docstring)."""
    head = {"id": reply.response_id, "object": "chat.completion.chunk", "created": reply.created, "model": reply.model}
    meta = reply.liveloop()
    for i, c in enumerate(reply.choices):
        lp = chat_logprobs(c.generation, top_logprobs) if logprobs else None
        delta = c.message()
        if "tool_calls" in delta:  # a stream's deltas number their calls
            delta["tool_calls"] = [call | {"index": k} for k, call in enumerate(delta["tool_calls"])]
        text = {"index": i, "delta": delta, "finish_reason": None, "logprobs": lp}
        yield sse(head | {"choices": [text], "liveloop": meta})
        end = {"index": i, "delta": {}, "finish_reason": c.finish_reason, "logprobs": None}
        yield sse(head | {"choices": [end], "liveloop": meta})
    if include_usage:
        yield sse(head | {"choices": [], "usage": reply.usage(), "liveloop": meta})
    yield b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode("utf-8") + b"\n\n"
