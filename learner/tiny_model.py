"""Tiny Llama-style models built from a config, with a byte-level tokenizer that needs no files.

No weights can be downloaded on our machines, so tests, benchmarks and the demo build their base model
here: random weights from a seed, a Llama architecture (head_dim 64, which vLLM's CPU attention needs)
and transformers' ``ByT5Tokenizer`` (bytes + 3 specials, vocab 384 with its extra ids). The same seed
and sizes always give the same weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

VOCAB_SIZE = 384
"""ByT5's vocabulary: 3 specials, 256 bytes, 125 extra ids."""


class TinyModelSpec(BaseModel):
    """The sizes of a tiny Llama. The defaults give about 0.4M parameters, fast enough for tests on 2 cores."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    hidden_size: int = Field(default=64, ge=64, multiple_of=64)
    layers: int = Field(default=2, ge=1)
    heads: int = Field(default=1, ge=1)
    kv_heads: int = Field(default=1, ge=1)
    intermediate_size: int = Field(default=128, ge=1)
    max_positions: int = Field(default=1024, ge=16)
    seed: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads


def byte_tokenizer() -> PreTrainedTokenizerBase:
    """The byte-level tokenizer: every UTF-8 byte is one token, eos id 1, pad id 0."""
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


def tiny_config(spec: TinyModelSpec) -> LlamaConfig:
    """The Llama config for ``spec``."""
    from transformers import LlamaConfig

    if spec.hidden_size % spec.heads or spec.heads % spec.kv_heads:
        raise ValueError(
            f"hidden_size {spec.hidden_size} must split into {spec.heads} heads of {spec.kv_heads} kv groups"
        )
    return LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=False,
    )


def build_tiny_model(spec: TinyModelSpec | None = None) -> LlamaForCausalLM:
    """A tiny Llama with weights drawn from ``spec.seed`` (the global RNG is left as it was)."""
    import torch
    from transformers import LlamaForCausalLM

    spec = spec or TinyModelSpec()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = LlamaForCausalLM(tiny_config(spec))
    return model.eval()


def save_tiny_model(folder: Path, spec: TinyModelSpec | None = None) -> Path:
    """Build a tiny model and save it with its tokenizer as a Hugging Face folder (safetensors)."""
    folder.mkdir(parents=True, exist_ok=True)
    build_tiny_model(spec).save_pretrained(folder, safe_serialization=True)
    byte_tokenizer().save_pretrained(folder)
    return folder
