"""The DeepSpeed engine in this process (one rank, gloo, ZeRO-2, fp32 on the CPU) with the tiny Llama.

- A written checkpoint reloads with ``from_pretrained`` and gives exactly the in-memory model's logits
  (full weights, and a LoRA adapter on its base).
- The private state (DeepSpeed checkpoint) round-trips: after loading it, the same step gives the same
  bits, weights and metrics (what makes a replay after a crash equal to the first attempt).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from distill.samples import HELD_OUT_RULE_VERSION, HeldOutRule
from learner.checkpoint import CycleRecord, build_manifest, checkpoint_id_for, write_checkpoint_folder
from learner.engine import LearnerEngine, StepBatch, init_distributed, step_seed
from learner.manifest import verify_checkpoint
from learner.settings import LearnerSettings
from learner.state import DataDir
from learner.tiny_model import build_tiny_model

BATCH = StepBatch(
    prompt_ids=[[5, 6, 7], [8, 9], [40, 41, 42, 43]],
    completion_ids=[[10, 11], [12, 13, 14], [15]],
    behaviour_logprobs=[[-6.0, -5.5], [-6.0, -5.0, -6.2], [-5.8]],
    loss_mask=[[1, 1], [1, 0, 1], [1]],
    advantages=[1.2, -0.9, -0.3],
)
PROBE = torch.tensor([[3, 50, 60, 70, 80, 90, 100, 1]])


@pytest.fixture(scope="module")
def distributed() -> None:
    init_distributed(1)


def _engine(tmp_path: Path, **overrides: object) -> LearnerEngine:
    settings = LearnerSettings.model_validate({"data_dir": tmp_path, "lr": 1e-3, "zero_stage": 2, **overrides})
    return LearnerEngine(settings, rank=0, world_size=1)


def _logits(model: object) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=PROBE).logits  # type: ignore[operator]


def _write(engine: LearnerEngine, data: DataDir, version: int) -> Path:
    checkpoint_id = checkpoint_id_for(engine.settings.model_name, version)

    def manifest_for(files: dict[str, str]) -> object:
        return build_manifest(
            settings=engine.settings,
            base_label="tiny",
            checkpoint_id=checkpoint_id,
            parent_id=None,
            policy_version=version,
            step=2,
            cycle=CycleRecord(),
            positions={},
            files=files,
            held_out=HeldOutRule(percent=15),
        )

    data.make()
    return write_checkpoint_folder(data, checkpoint_id, engine.save_pretrained, engine.settings, manifest_for)


def test_a_written_checkpoint_reloads_with_from_pretrained_to_the_same_logits(
    distributed: None, tmp_path: Path
) -> None:
    engine = _engine(tmp_path)
    before = _logits(engine.module)
    for step in range(2):
        engine.train_step(BATCH, step)
    in_memory = _logits(engine.module.eval())
    assert not torch.equal(before, in_memory)  # training moved the weights
    folder = _write(engine, DataDir(tmp_path), 1)
    manifest = verify_checkpoint(folder)
    assert manifest.format == "full"
    assert manifest.held_out == HeldOutRule(percent=15, rule_version=HELD_OUT_RULE_VERSION)  # what intake skipped
    assert manifest.training_config["held_out"] == {"percent": 15, "rule_version": HELD_OUT_RULE_VERSION}
    assert {"model.safetensors", "config.json", "tokenizer_config.json"} <= set(manifest.files)
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert torch.equal(_logits(reloaded), in_memory)


def test_a_lora_checkpoint_is_an_adapter_that_reloads_on_its_base_to_the_same_logits(
    distributed: None, tmp_path: Path
) -> None:
    from peft import PeftModel

    engine = _engine(tmp_path, lora=True, lora_r=4, lora_alpha=8)
    for step in range(2):
        engine.train_step(BATCH, step)
    in_memory = _logits(engine.module.eval())
    folder = _write(engine, DataDir(tmp_path), 1)
    manifest = verify_checkpoint(folder)
    assert manifest.format == "lora"
    assert "adapter_model.safetensors" in manifest.files
    assert "model.safetensors" not in manifest.files
    reloaded = PeftModel.from_pretrained(build_tiny_model(), folder).eval()
    assert torch.equal(_logits(reloaded), in_memory)
    # Only the adapter trained: the base weights under it are the tiny model's.
    base = build_tiny_model().state_dict()
    merged = {
        k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in reloaded.state_dict().items()
    }
    assert torch.equal(merged["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])


def test_the_saved_state_replays_a_step_to_the_same_bits(distributed: None, tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    engine.train_step(BATCH, 0)
    engine.save_state(tmp_path / "state")
    first = engine.train_step(BATCH, 1)
    after_first = {k: v.clone() for k, v in engine.module.state_dict().items()}
    engine.train_step(BATCH, 2)  # wander off, then come back
    engine.load_state(tmp_path / "state")
    again = engine.train_step(BATCH, 1)
    assert again == first
    assert all(torch.equal(after_first[k], v) for k, v in engine.module.state_dict().items())


def test_step_metrics_are_token_means_over_the_policy_tokens(distributed: None, tmp_path: Path) -> None:
    metrics = _engine(tmp_path).train_step(BATCH, 0)
    assert metrics.policy_tokens == 5  # 2 + 2 (one tool token masked out) + 1
    assert metrics.kl == 0.0
    assert metrics.loss == pytest.approx(metrics.pg_loss)
    assert 0 < metrics.mean_weight <= 2.0


def test_token_credit_adds_to_each_tokens_advantage(distributed: None, tmp_path: Path) -> None:
    shifted = dataclasses.replace(BATCH, advantages=[a + 0.5 for a in BATCH.advantages])
    credited = dataclasses.replace(BATCH, token_credit=[[0.5, 0.5], [0.5, 0.5, 0.5], [0.5]])
    partly = dataclasses.replace(BATCH, token_credit=[[0.5, 0.5], [], [0.5]])  # a sample without spans: []
    losses = [_engine(tmp_path / str(n)).train_step(batch, 0).loss for n, batch in enumerate((shifted, credited))]
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    assert _engine(tmp_path / "2").train_step(partly, 0).loss != pytest.approx(losses[0], abs=1e-6)
    assert credited.shard(1, 2).token_credit == [[0.5, 0.5, 0.5]]


def test_step_seeds_differ_per_step_and_repeat_per_seed() -> None:
    assert step_seed(0, 1) == step_seed(0, 1)
    assert len({step_seed(0, step) for step in range(100)} | {step_seed(1, 0)}) == 101
