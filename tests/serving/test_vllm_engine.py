"""The vLLM engine on a GPU: greedy tokens and logprobs, LoRA versions side by side, a full-weights swap.

Skipped where there is no CUDA GPU or vLLM is not installed (``pip install liveloop[gpu]``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from learner.tiny_model import TinyModelSpec, save_tiny_model
from serving.engine import Generation, LoadFailed, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
        reason="needs a CUDA GPU and vLLM",
    ),
]

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
PROMPTS = ["def add(a, b):", "The quick brown fox jumps over"]


@pytest.fixture(scope="module")
def engine(folders: dict[str, Path]) -> Iterator[Any]:
    from serving.vllm_engine import VllmEngine

    engine = VllmEngine(dtype="float32", gpu_memory_utilization=0.3, max_model_len=512, enforce_eager=True)
    engine.load(folders["v1"], 1)
    yield engine
    engine.close()


def _forward_logprobs(folder: Path, generation: Generation) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([generation.prompt_token_ids + generation.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    start = len(generation.prompt_token_ids) - 1
    picked = torch.log_softmax(logits[start : start + len(generation.token_ids)], -1)
    return picked[torch.arange(len(generation.token_ids)), torch.tensor(generation.token_ids)].tolist()


def test_greedy_tokens_and_logprobs_match_the_model(engine: Any, folders: dict[str, Path]) -> None:
    for generation in engine.generate(PROMPTS, GREEDY):
        assert generation.policy_version == 1
        assert generation.prompt_token_ids[-1] != 1  # no eos appended to the prompt
        assert generation.logprobs == pytest.approx(_forward_logprobs(folders["v1"], generation), abs=1e-3)


def test_a_lora_version_serves_beside_the_base(engine: Any, folders: dict[str, Path], tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(folders["v1"], dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(tmp_path / "adapter")
    engine.load(tmp_path / "adapter", 5)
    assert engine.loaded_versions == [1, 5]
    assert engine.default_version == 1
    base_out = engine.generate([PROMPTS[0]], GREEDY)[0]
    lora_out = engine.generate([PROMPTS[0]], GREEDY, policy_version=5)[0]
    assert lora_out.policy_version == 5
    assert lora_out.token_ids != base_out.token_ids


def test_full_weights_swap_in_place(engine: Any, folders: dict[str, Path], tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    broken = save_tiny_model(tmp_path / "broken", TinyModelSpec(seed=3))
    weights = load_file(broken / "model.safetensors")
    name = next(iter(weights))
    weights[name].view(-1)[0] = float("nan")
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(LoadFailed, match="NaN"):
        engine.load(broken, 3)
    before = engine.generate([PROMPTS[1]], GREEDY)[0]
    engine.load(folders["v2"], 2)
    assert engine.generate([PROMPTS[1]], GREEDY)[0].token_ids == before.token_ids  # staged, not serving yet
    engine.switch(2)
    after = engine.generate([PROMPTS[1]], GREEDY)[0]
    assert after.policy_version == 2
    assert after.logprobs == pytest.approx(_forward_logprobs(folders["v2"], after), abs=1e-3)
    assert engine.loaded_versions == [2]
