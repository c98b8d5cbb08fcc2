"""GPU check (run by hand where CUDA is present): the learner's own engine on CUDA, bf16, NCCL.

    python tests/bench/gpu_learner_engine_check.py --out DIR

Builds :class:`learner.engine.LearnerEngine` on the tiny model (ZeRO-2, bf16, NCCL), trains a few
steps of the learner's loss, saves the DeepSpeed state, consolidates the fp32 master weights into a
Hugging Face folder and reloads it with ``from_pretrained``; then reports how far the reloaded
model's logits are from the engine's (bf16 compute against fp32 weights) and whether reloading the
saved state reproduces the next step exactly. (The surrogate loss is no progress measure: its
importance weights move with the policy.) Prints one line and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from learner.engine import LearnerEngine, StepBatch, init_distributed, on_gpu
    from learner.settings import LearnerSettings

    assert on_gpu(), "no CUDA here (or DS_ACCELERATOR=cpu)"
    settings = LearnerSettings(base_model="tiny", lr=1e-3, zero_stage=2, seed=0)
    rank, world = init_distributed(1)
    engine = LearnerEngine(settings, rank, world)
    rng = random.Random(0)
    batch = StepBatch(
        prompt_ids=[[rng.randrange(3, 259) for _ in range(24)] for _ in range(8)],
        completion_ids=[[rng.randrange(3, 259) for _ in range(16)] for _ in range(8)],
        behaviour_logprobs=[[-5.5] * 16 for _ in range(8)],
        loss_mask=[[1] * 16 for _ in range(8)],
        advantages=[1.0 if i % 2 else -1.0 for i in range(8)],
    )
    started = time.perf_counter()
    losses = [engine.train_step(batch, step).loss for step in range(1, 6)]
    seconds = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as scratch:
        state, folder = Path(scratch) / "state", Path(scratch) / "hf"
        engine.save_state(state)
        engine.save_pretrained(folder, state_folder=state)
        reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).cuda().eval()
        probe = torch.tensor([batch.prompt_ids[0] + batch.completion_ids[0]], device="cuda")
        with torch.no_grad():
            reloaded_logits = reloaded(probe).logits.float()
            engine_logits = engine.module(probe).logits.float()
        # The engine computes in bf16, the reload in fp32 from the fp32 masters: equal up to bf16 rounding.
        logits_gap = float((reloaded_logits - engine_logits).abs().max())
        dtypes = sorted({str(p.dtype) for p in reloaded.parameters()})
        next_loss = engine.train_step(batch, 6).loss
        engine.load_state(state)
        replayed_loss = engine.train_step(batch, 6).loss
    result = {
        "name": "learner_gpu_engine_check",
        "gpu": torch.cuda.get_device_name(),
        "bf16": engine.engine.bfloat16_enabled(),
        "zero_stage": settings.zero_stage,
        "losses": losses,
        "reloaded_dtypes": dtypes,
        "max_logit_gap_bf16_engine_vs_fp32_reload": logits_gap,
        "step_after_save": next_loss,
        "step_after_reload": replayed_loss,
        "reload_reproduces_step": abs(next_loss - replayed_loss) < 1e-6,
        "five_steps_seconds": seconds,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "learner_gpu_engine_check.json").write_text(json.dumps(result, indent=2))
    print(
        f"learner engine on {result['gpu']}: bf16={result['bf16']}, loss {losses[0]:.4f} -> {losses[-1]:.4f}, "
        f"reload logit gap {logits_gap:.3g}, reload reproduces the step: {result['reload_reproduces_step']}"
    )


if __name__ == "__main__":
    main()
