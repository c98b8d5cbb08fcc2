"""The engine interface every inference engine implements (the torch engine, the vLLM engine).

An engine holds one or more loaded policy versions side by side. ``load`` puts a checkpoint beside
the current one (the current keeps serving meanwhile), ``switch`` makes a loaded version the default
atomically, ``unload`` frees one. ``generate`` runs a batch on a version chosen at call time: a
request that started on a version finishes on it, even when the default moves during the call.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future
from pathlib import Path
from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from serving.errors import NotReady, ServingError

V = TypeVar("V")


class InferenceEngineError(ServingError):
    """Root of the engine errors (a :class:`~serving.errors.ServingError`)."""


class LoadFailed(InferenceEngineError):
    """A checkpoint could not be loaded (bad folder, bad checksum, NaN/Inf weights); the current version serves on."""


class UnknownVersion(InferenceEngineError):
    """The version asked for is not loaded in this engine."""


class SamplingParams(BaseModel):
    """How to sample, as the OpenAI API names it. ``seed`` makes sampling repeatable per request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(default=1.0, ge=0.0, le=2.0, description="0 means greedy.")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int = Field(default=64, ge=1, le=4096)
    stop: tuple[str, ...] = Field(default=(), max_length=4)
    seed: int | None = None


class Generation(BaseModel):
    """One completion: the text, the sampled token ids and each one's logprob under the serving policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    policy_version: int = Field(ge=0)


class Engine(ABC):
    """Generates with loaded policy versions; loads, switches and unloads them."""

    @abstractmethod
    def load(self, folder: Path, policy_version: int) -> None:
        """Load the Hugging Face folder (full weights or a LoRA adapter) as ``policy_version``, beside
        the versions already loaded, and warm it up. Raises LoadFailed and leaves the others serving."""

    @abstractmethod
    def switch(self, policy_version: int) -> None:
        """Make a loaded version the default for new requests (atomic). UnknownVersion if not loaded."""

    @abstractmethod
    def unload(self, policy_version: int) -> None:
        """Free a loaded version that is not the default; requests still running on it finish first."""

    @property
    @abstractmethod
    def default_version(self) -> int:
        """The version new requests get unless they name one."""

    @property
    @abstractmethod
    def loaded_versions(self) -> list[int]:
        """Every version loaded now, ascending."""

    @abstractmethod
    def generate(
        self, prompts: list[str], params: SamplingParams, policy_version: int | None = None
    ) -> list[Generation]:
        """Complete each prompt with ``policy_version`` (the default when None); blocking, thread-safe."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op for engines that hold nothing to release
        """Stop background threads and free every loaded version; the engine is unusable afterwards."""


class VersionedEngine(Engine, Generic[V]):
    """An engine that keeps its loaded versions (each a ``V``) and its default in a table under one lock."""

    def __init__(self) -> None:
        self._versions: dict[int, V] = {}
        self._default: int | None = None
        self._lock = threading.Lock()

    @property
    def default_version(self) -> int:
        with self._lock:
            if self._default is None:
                raise NotReady("no policy version is loaded yet; load a checkpoint first")
            return self._default

    @property
    def loaded_versions(self) -> list[int]:
        with self._lock:
            return sorted(self._versions)

    def _unknown(self, version: int) -> str:
        """What to say of a version that is not loaded (call it under the lock)."""
        return f"policy version {version} is not loaded (loaded: {sorted(self._versions)}); load it first"


class QueuingEngine(Engine):
    """An engine that queues requests itself and answers them from its own thread: :meth:`submit`
    returns at once, so a caller (the gateway's event loop) need not hold a thread per request."""

    @abstractmethod
    def submit(
        self, prompts: list[str], params: SamplingParams, policy_version: int | None = None
    ) -> Future[list[Generation]]:
        """Queue the prompts; the future holds what ``generate`` would return. Raises at once what is wrong
        before decoding starts (not ready, unknown version, a prompt that does not fit)."""

    def generate(
        self, prompts: list[str], params: SamplingParams, policy_version: int | None = None
    ) -> list[Generation]:
        return self.submit(prompts, params, policy_version).result()
