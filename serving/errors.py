"""The serving package's exceptions: one root, with subclasses that tell the caller what to do.

- :class:`ServingError` is the root of everything ``serving`` raises; the engine errors of
  :mod:`serving.engine` (``InferenceEngineError``: ``LoadFailed``, ``UnknownVersion``, ...) derive from it.
- :class:`InvalidRequest`: the request cannot be served as asked (empty prompt, a prompt plus
  ``max_tokens`` longer than the model's context, an unsupported option). Do not retry; fix the
  request. The gateway answers 400 with the message.
- :class:`NotReady`: no policy version is loaded yet. Transient: retry once the engine is ready
  (the gateway answers 503 and ``/readyz`` says so).

Errors from torch, transformers, peft and vLLM are converted where they are called
(``raise ... from exc``), so callers never need to know those libraries' types.
"""

from __future__ import annotations

from infra.errors import LiveloopError


class ServingError(LiveloopError):
    """Root of every error raised by ``serving``."""


class InvalidRequest(ServingError):
    """The request cannot be served as asked; the message names the bad value and the fix. Do not retry.

    ``param`` names the offending request field (``"messages.0.role"``) where there is one.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[type[InvalidRequest], tuple[str, str | None]]:
        # Pickled with its param (the engine's process sends it to the gateway's).
        return (type(self), (str(self), self.param))


class NotReady(ServingError):
    """No policy version is loaded yet. Transient: retry when ``/readyz`` answers 200."""
