"""The vLLM engine (GPUs): one in-process ``vllm.LLM`` whose weights and LoRA adapters change at run time.

vLLM is imported only when this engine is built (``LIVELOOP_SERVING_ENGINE=vllm``); nothing else in
liveloop needs it. Two kinds of versions:

- A LoRA adapter folder (``adapter_config.json``) is loaded beside the others as a ``LoRARequest``
  under a NEW name and id per load: reusing a name can serve stale prefix-cache blocks. Any number
  (up to ``vllm_max_loras`` on the GPU at once) serve side by side, so a canary can run on one.
- Full weights: the first folder starts the engine. A later folder is checked (files, NaN/Inf) and
  staged by ``load``; ``switch`` to it reloads the running engine's weights in place between two
  batches (every request queued before the switch finishes on the old weights first), drops the
  prefix cache (its blocks were computed with the old weights) and drops the LoRA versions, which
  belonged to the old base. Only one full-weights version can serve at a time.

Requests go through one batcher thread (``vllm.LLM`` is not thread-safe): it takes what is queued and
runs it as one ``LLM.generate`` call with per-prompt sampling parameters and LoRA requests; vLLM's own
scheduler batches them continuously. Prompts are encoded like the torch engine does (special tokens
minus a trailing eos) and passed as token ids.

Logprobs follow the torch engine's rule (see :mod:`serving.torch_decode`): the engine is started
with ``logprobs_mode="processed_logprobs"``, the logprobs after temperature and top-p, i.e. of the
sampling distribution; greedy requests are processed with temperature 1, so they get the
untempered logprob of the argmax. ``SamplingParams(logprobs=0)`` returns just the sampled token's.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from serving.engine import Generation, LoadFailed, SamplingParams, UnknownVersion, VersionedEngine
from serving.errors import InvalidRequest, NotReady
from serving.settings import ServingSettings

log = logging.getLogger(__name__)

ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class _Version:
    version: int
    folder: Path
    lora: Any  # a vllm LoRARequest, or None for the resident full weights
    epoch: int  # which full weights it runs on; a reload makes the older epochs unservable


@dataclass(eq=False)
class _Request:
    version: _Version
    prompt_ids: list[int]
    params: SamplingParams
    future: Future[Generation]


@dataclass(eq=False)
class _Call:
    """Work that must run on the batcher thread, between two batches (vllm.LLM is not thread-safe)."""

    run: Callable[[], Any]
    done: Future[Any]


def reload_weights_from(worker: Any, folder: str) -> int:
    """Run inside each vLLM worker (``LLM.collective_rpc``): load the folder's safetensors into the model."""
    from safetensors.torch import load_file

    model = worker.model_runner.model
    count = 0
    for file in sorted(Path(folder).glob("*.safetensors")):
        tensors = load_file(str(file))
        model.load_weights(tensors.items())
        count += len(tensors)
    return count


def check_weights(folder: Path) -> None:
    """LoadFailed unless the folder holds safetensors whose every tensor is finite."""
    import torch
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        raise LoadFailed(f"{folder} holds no *.safetensors; give the checkpoint's Hugging Face folder")
    for file in files:
        for name, tensor in load_file(str(file)).items():
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                raise LoadFailed(f"{folder}: parameter {name} holds NaN or Inf values; the checkpoint is corrupt")


class VllmEngine(VersionedEngine[_Version]):
    """Serves policy versions with vLLM (see the module docstring)."""

    def __init__(self, **llm_options: Any) -> None:
        self._options = {"enable_lora": True, "logprobs_mode": "processed_logprobs", **llm_options}
        self._llm: Any = None
        self._tokenizer: Any = None
        super().__init__()
        self._staged: dict[int, Path] = {}
        self._epoch = 0
        self._next_lora_id = 1
        self._queue: queue.SimpleQueue[_Request | _Call | None] = queue.SimpleQueue()
        self._batcher = threading.Thread(target=self._run, name="liveloop-vllm-batcher", daemon=True)
        self._batcher.start()

    @classmethod
    def from_settings(cls, settings: ServingSettings) -> VllmEngine:
        """The engine with the settings' GPU memory share, context length, LoRA limits and dtype."""
        options: dict[str, Any] = {
            "gpu_memory_utilization": settings.vllm_gpu_memory_utilization,
            "max_lora_rank": settings.vllm_max_lora_rank,
            "max_loras": settings.vllm_max_loras,
            "dtype": "auto" if settings.dtype == "auto" else settings.dtype,
        }
        if settings.vllm_max_model_len is not None:
            options["max_model_len"] = settings.vllm_max_model_len
        return cls(**options)

    # -- versions ---------------------------------------------------------------------------------

    def load(self, folder: Path, policy_version: int) -> None:
        folder = Path(folder)
        if (folder / ADAPTER_CONFIG).exists():
            self._load_adapter(folder, policy_version)
        elif self._llm is None:
            check_weights(folder)
            self._start(folder, policy_version)
        else:
            check_weights(folder)
            with self._lock:
                self._staged[policy_version] = folder
        log.info("vLLM: policy version %d from %s is ready", policy_version, folder)

    def switch(self, policy_version: int) -> None:
        with self._lock:
            if policy_version in self._versions:
                self._default = policy_version
                return
            folder = self._staged.get(policy_version)
            if folder is None:
                raise UnknownVersion(self._unknown(policy_version))
            # Queued under the lock: every request resolved before this point is ahead of it in the queue.
            reload = self._call_later(lambda: self._reload(folder))
        reload.result()
        with self._lock:
            self._epoch += 1
            del self._staged[policy_version]
            self._versions = {policy_version: _Version(policy_version, folder, None, self._epoch)}
            self._default = policy_version

    def unload(self, policy_version: int) -> None:
        with self._lock:
            if self._staged.pop(policy_version, None) is not None:
                return
            found = self._versions.get(policy_version)
            if found is None:
                raise UnknownVersion(self._unknown(policy_version))
            if policy_version == self._default or found.lora is None:
                raise InvalidRequest(f"policy version {policy_version} serves the default or is the base weights")
            del self._versions[policy_version]
        remove = getattr(self._llm.llm_engine, "remove_lora", None)
        if remove is not None:
            self._call_later(lambda: remove(found.lora.lora_int_id)).result()

    def _start(self, folder: Path, version: int) -> None:
        try:
            from vllm import LLM

            self._llm = LLM(model=str(folder), **self._options)
            self._tokenizer = self._llm.get_tokenizer()
        except Exception as exc:  # vLLM raises many kinds while building the engine
            raise LoadFailed(f"vLLM cannot start on {folder}: {exc}") from exc
        with self._lock:
            self._epoch += 1
            self._versions[version] = _Version(version, folder, None, self._epoch)
            self._default = version

    def _load_adapter(self, folder: Path, version: int) -> None:
        from vllm.lora.request import LoRARequest

        with self._lock:
            if self._llm is None:
                raise LoadFailed("a LoRA adapter needs its base model loaded first; load the full-weights folder first")
            lora_id, self._next_lora_id = self._next_lora_id, self._next_lora_id + 1
            lora = LoRARequest(f"liveloop-v{version}-{lora_id}", lora_id, str(folder))
            entry = _Version(version, folder, lora, self._epoch)
        warm_up = SamplingParams(temperature=0.0, max_tokens=2)
        try:  # warming up loads the adapter onto the GPU and proves it fits the base
            self._call_later(lambda: self._generate_now([entry], [[self._warm_up_token()]], warm_up)).result()
        except Exception as exc:
            raise LoadFailed(f"vLLM cannot load the LoRA adapter {folder} as version {version}: {exc}") from exc
        with self._lock:
            self._versions[version] = entry
            if self._default is None:
                self._default = version

    def _warm_up_token(self) -> int:
        ids = self._encode("Hello")
        return ids[0] if ids else 0

    # -- generation -------------------------------------------------------------------------------

    def generate(
        self, prompts: list[str], params: SamplingParams, policy_version: int | None = None
    ) -> list[Generation]:
        if self._llm is None:
            raise NotReady("no policy version is loaded yet; load a checkpoint first")
        encoded = [self._encode(prompt) for prompt in prompts]
        limit = self._llm.llm_engine.model_config.max_model_len
        for prompt, ids in zip(prompts, encoded, strict=True):
            if not ids:
                raise InvalidRequest(f"prompt {prompt[:40]!r} encodes to no tokens; send a non-empty prompt")
            if len(ids) + params.max_tokens > limit:
                raise InvalidRequest(
                    f"prompt of {len(ids)} tokens plus max_tokens {params.max_tokens} exceeds the model's context of "
                    f"{limit} tokens; shorten the prompt or lower max_tokens"
                )
        with self._lock:
            version = self._default if policy_version is None else policy_version
            entry = self._versions.get(version) if version is not None else None
            if entry is None:
                raise UnknownVersion(self._unknown(version if version is not None else -1))
            requests = [_Request(entry, ids, params, Future()) for ids in encoded]
            for request in requests:
                self._queue.put(request)
        return [request.future.result() for request in requests]

    def _encode(self, prompt: str) -> list[int]:
        ids = list(self._tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if ids and ids[-1] == self._tokenizer.eos_token_id:
            ids.pop()
        return ids

    def close(self) -> None:
        """Stop the batcher and release the GPU."""
        self._queue.put(None)
        self._batcher.join(timeout=60)
        self._llm = None
        with self._lock:
            self._versions.clear()
            self._default = None

    def _call_later(self, run: Callable[[], Any]) -> Future[Any]:
        call = _Call(run, Future())
        self._queue.put(call)
        return call.done

    def _run(self) -> None:
        while True:
            item: Any = self._queue.get()
            batch: list[_Request] = []
            while isinstance(item, _Request):  # everything queued now goes into one LLM.generate call
                batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    item = _EMPTY
            if batch:
                self._answer(batch)
            if isinstance(item, _Call):
                try:
                    item.done.set_result(item.run())
                except Exception as exc:
                    item.done.set_exception(exc)
            elif item is None:
                return

    def _answer(self, batch: list[_Request]) -> None:
        with self._lock:
            epoch = self._epoch
        runnable = []
        for request in batch:
            if request.version.epoch != epoch:
                request.future.set_exception(UnknownVersion(f"policy version {request.version.version} was replaced"))
            else:
                runnable.append(request)
        if not runnable:
            return
        try:
            results = self._generate_now(
                [r.version for r in runnable], [r.prompt_ids for r in runnable], [r.params for r in runnable]
            )
        except Exception as exc:  # answer every waiting caller; the batcher itself must live on
            log.exception("vLLM failed on a batch of %d", len(runnable))
            for request in runnable:
                request.future.set_exception(exc)
            return
        for request, result in zip(runnable, results, strict=True):
            request.future.set_result(result)

    def _generate_now(
        self, versions: list[_Version], prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
    ) -> list[Generation]:
        from vllm import SamplingParams as VllmSamplingParams

        every = params if isinstance(params, list) else [params] * len(prompts)
        sampling = [
            VllmSamplingParams(
                temperature=p.temperature,
                top_p=p.top_p,
                max_tokens=p.max_tokens,
                stop=list(p.stop),
                seed=p.seed,
                logprobs=0,
            )
            for p in every
        ]
        inputs = [{"prompt_token_ids": ids} for ids in prompts]
        loras = [v.lora for v in versions]
        outputs = self._llm.generate(inputs, sampling, lora_request=loras, use_tqdm=False)
        return [_generation(out, v.version) for out, v in zip(outputs, versions, strict=True)]

    def _reload(self, folder: Path) -> None:
        """On the batcher thread: replace the running weights. A failure leaves them mixed: restart the gateway."""
        try:
            self._llm.collective_rpc(reload_weights_from, args=(str(folder),))
            self._llm.reset_prefix_cache()  # cached blocks hold keys/values of the old weights
        except Exception as exc:
            raise LoadFailed(
                f"vLLM could not reload weights from {folder}: {exc}; the weights may be mixed, restart the gateway"
            ) from exc


_EMPTY: Any = object()


def _generation(output: Any, version: int) -> Generation:
    """A vLLM RequestOutput as a Generation: the sampled tokens and each one's logprob."""
    completion = output.outputs[0]
    token_ids = list(completion.token_ids)
    logprobs = [
        min(0.0, float(step[token].logprob)) for step, token in zip(completion.logprobs, token_ids, strict=True)
    ]
    return Generation(
        text=completion.text,
        prompt_token_ids=list(output.prompt_token_ids),
        token_ids=token_ids,
        logprobs=logprobs,
        finish_reason="length" if completion.finish_reason == "length" else "stop",
        policy_version=version,
    )
