"""Reading a request body under a size limit, so that a hostile client cannot make the gateway buffer
(and then tokenize) an unbounded body only for it to be refused for the model's context."""

from __future__ import annotations

from starlette.requests import Request


async def read_limited(request: Request, limit: int) -> bytes | None:
    """The body, or ``None`` as soon as it is known to be over ``limit`` bytes (the rest is never read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    # Counted while streaming: a chunked body (no Content-Length) cannot make us buffer more than the limit.
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
