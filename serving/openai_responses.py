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

Streams: the engine returns whole completions, so a stream sends each choice's text in one chunk,
then a chunk with its ``finish_reason``, then (``stream_options.include_usage``) a usage chunk, then
``data: [DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from serving.engine import Generation


@dataclass(frozen=True)
class Choice:
    """One served choice: its generation and the id its event and feedback carry."""

    generation: Generation
    generation_id: UUID


@dataclass(frozen=True)
class Reply:
    """What every body of one request shares."""

    response_id: str
    created: int
    model: str
    choices: list[Choice]
    prompt_tokens: int
    session_id: str

    def liveloop(self) -> dict[str, Any]:
        ids = [str(c.generation_id) for c in self.choices]
        return {
            "generation_id": ids[0],
            "generation_ids": ids,
            "policy_version": self.policy_version,
            "session_id": self.session_id,
        }

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
            "message": {"role": "assistant", "content": c.generation.text},
            "finish_reason": c.generation.finish_reason,
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
        delta = {"role": "assistant", "content": c.generation.text}
        text = {"index": i, "delta": delta, "finish_reason": None, "logprobs": lp}
        yield sse(head | {"choices": [text], "liveloop": meta})
        end = {"index": i, "delta": {}, "finish_reason": c.generation.finish_reason, "logprobs": None}
        yield sse(head | {"choices": [end], "liveloop": meta})
    if include_usage:
        yield sse(head | {"choices": [], "usage": reply.usage(), "liveloop": meta})
    yield b"data: [DONE]\n\n"


def sse(data: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return b"data: " + json.dumps(data, separators=(",", ":")).encode("utf-8") + b"\n\n"
