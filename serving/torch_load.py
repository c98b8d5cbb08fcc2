"""Loading one policy version for the torch engine: full weights or a LoRA adapter, checked and warmed up.

A folder holding ``adapter_config.json`` is a LoRA adapter (peft): it is applied to a fresh copy of
the base weights (the full-weights folder under the engine's default version) and merged, so the
versions already serving are never touched and the merged model decodes as fast as the base. Every
parameter must be finite (NaN/Inf raises LoadFailed), and one short greedy generation must succeed
(the warm-up), before a version is accepted.

A new checkpoint of the model already serving usually differs from it in its weights alone (same
config, same tokenizer files). Such a folder is loaded as a copy of the serving model with the new
weights, keeping the serving tokenizer: building a model from its config and a tokenizer from its
files is Python work, which holds the GIL the decoder needs between its torch calls, so a full load
beside a serving version stalls its requests for the whole load (tiny model on 2 cores: about 40 ms
of load, ~10 ms as a copy). Anything else, or any doubt, takes the full load. A copy is not warmed
up: its architecture is serving already, and its weights are checked finite like any other.

The copy's Python work (copying the model, loading and checking the weights: about 5 ms for the tiny
model) is handed to ``run``, which the torch engine points at its batcher thread: done there, between
two decode steps, it delays the running requests by its own length once. Done on another thread, it
competes with the batcher for the GIL, which changes hands only every 5 ms (the switch interval) while
both want it: the load then took 10-20 ms and stalled the running requests for about that long. Only a
small model's copy goes to ``run`` (:data:`SMALL_COPY_BYTES`): a large model's copy is mostly tensor
copies, which release the GIL, and on the batcher it would stop decoding for as long as they take.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from learner.manifest import MANIFEST_FILE
from serving.engine import LoadFailed, SamplingParams
from serving.torch_decode import decode_batch, eos_ids_of

ADAPTER_CONFIG = "adapter_config.json"
WEIGHTS_FILE = "model.safetensors"

T = TypeVar("T")

SMALL_COPY_BYTES = 64 << 20
"""Parameters up to this size make a copy whose cost is Python work, not copying memory."""


def run_here(work: Callable[[], T]) -> T:
    """Where a copy's Python work runs by default: on the calling thread."""
    return work()


@dataclass(frozen=True, eq=False)
class Loaded:
    """One loaded policy version. ``base_folder`` holds the full weights (the folder itself, or a LoRA's base)."""

    version: int
    model: Any
    tokenizer: Any
    folder: Path
    base_folder: Path
    eos_ids: frozenset[int]
    max_positions: int | None

    def encode(self, prompt: str) -> list[int]:
        """The prompt's token ids: special tokens as the tokenizer adds them, minus a trailing eos."""
        ids = list(self.tokenizer(prompt, add_special_tokens=True)["input_ids"])
        if ids and ids[-1] == self.tokenizer.eos_token_id:
            ids.pop()
        return ids


def import_loaders() -> None:
    """Import now what a load imports lazily (transformers' auto classes, peft, safetensors), for a process
    that freezes what its start-up made (:mod:`serving.engine_process`)."""
    import peft  # noqa: F401
    import safetensors.torch  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401


def pick_device(device: str) -> torch.device:
    """``auto`` is cuda where a GPU is present, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto`` is float32 on cpu (exact logprobs, fast enough) and bfloat16 on cuda."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else torch.bfloat16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_version(
    folder: Path,
    version: int,
    base_for_adapter: Callable[[], Path],
    device: torch.device,
    dtype: torch.dtype,
    like: Loaded | None = None,
    run: Callable[[Callable[[], Any]], Any] = run_here,
) -> Loaded:
    """Load ``folder`` as ``version``; LoadFailed (naming the folder and the problem) if it cannot serve.

    ``like``: a loaded version whose model and tokenizer are reused when ``folder`` differs from its
    folder in the weights alone; ``run`` runs the Python work of such a copy (see the module docstring).
    """
    if not folder.is_dir():
        raise LoadFailed(f"{folder} is not a folder; give the checkpoint's Hugging Face folder")
    reused = False  # whether the model is a copy of ``like``'s
    try:
        if (folder / ADAPTER_CONFIG).exists():
            base_folder = base_for_adapter()
            model = _apply_adapter(_from_pretrained(base_folder, device, dtype), folder)
            tokenizer = _load_tokenizer(folder if _has_tokenizer(folder) else base_folder)
        else:
            base_folder = folder
            copied = _with_new_weights(like, folder, device, run) if like is not None else None
            reused = copied is not None
            if copied is not None:
                model, tokenizer = copied
            else:
                model = _from_pretrained(folder, device, dtype)
                tokenizer = _load_tokenizer(folder)
    except LoadFailed:
        raise
    except Exception as exc:  # transformers/peft raise OSError, ValueError, KeyError, RuntimeError, ...
        raise LoadFailed(f"cannot load policy version {version} from {folder}: {exc}") from exc
    if not reused:  # a copy was checked as it was made
        _check_finite(model, folder)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    loaded = Loaded(version, model, tokenizer, folder, base_folder, eos_ids_of(model, tokenizer), max_positions)
    if not reused:
        _warm_up(loaded, device)
    return loaded


def _from_pretrained(folder: Path, device: torch.device, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForCausalLM

    model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    return model.to(device).eval()


def _with_new_weights(
    template: Loaded, folder: Path, device: torch.device, run: Callable[[Callable[[], Any]], Any]
) -> tuple[Any, Any] | None:
    """``template``'s model (a copy, checked finite) and tokenizer, with ``folder``'s weights; None unless
    ``folder`` holds the same files as the template's full-weights folder, byte for byte, but for the
    weights and the manifest (which names the policy version)."""
    if template.folder != template.base_folder or not _same_but_weights(template.folder, folder):
        return None
    from safetensors.torch import load_file

    def copy_with_weights() -> Any:
        model = copy.deepcopy(template.model)  # the serving model is only read: decoding never writes it
        model.load_state_dict(weights, strict=True)  # every name and shape, or the full load says what is wrong
        _check_finite(model, folder)
        return model.eval()

    try:
        weights = load_file(folder / WEIGHTS_FILE, device=str(device))
        small = sum(p.numel() * p.element_size() for p in template.model.parameters()) <= SMALL_COPY_BYTES
        model = (run if small else run_here)(copy_with_weights)
    except LoadFailed:
        raise
    except Exception:  # any doubt takes the full load, which reports the problem itself
        return None
    return model, template.tokenizer


def _same_but_weights(reference: Path, folder: Path) -> bool:
    try:
        names = {path.name for path in folder.iterdir()}
        if names != {path.name for path in reference.iterdir()} or WEIGHTS_FILE not in names:
            return False
        return all(
            (folder / name).is_file() and (folder / name).read_bytes() == (reference / name).read_bytes()
            for name in sorted(names - {WEIGHTS_FILE, MANIFEST_FILE})
        )
    except OSError:  # a folder gone (the template's, after its swap), or unreadable: no shortcut
        return False


def _apply_adapter(model: Any, folder: Path) -> Any:
    from peft import PeftModel

    return PeftModel.from_pretrained(model, folder).merge_and_unload().eval()


def _warm_up(loaded: Loaded, device: torch.device) -> None:
    try:
        prompt = loaded.encode("Hello") or [loaded.tokenizer.pad_token_id or 0]
        greedy = SamplingParams(temperature=0.0, max_tokens=2)
        decode_batch(loaded.model, loaded.tokenizer, [prompt], [greedy], device, loaded.eos_ids)
    except Exception as exc:
        raise LoadFailed(f"policy version {loaded.version} from {loaded.folder} fails to generate: {exc}") from exc


def _has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").exists()


def _load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def _check_finite(model: Any, folder: Path) -> None:
    for name, parameter in model.named_parameters():
        if not bool(torch.isfinite(parameter).all()):
            raise LoadFailed(f"{folder}: parameter {name} holds NaN or Inf values; the checkpoint is corrupt")
