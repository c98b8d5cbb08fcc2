"""GPU benchmark (run by hand where a CUDA GPU is present): one learner cycle of a ~0.5B Llama in bf16.

    DS_ACCELERATOR=cuda python tests/bench/gpu_learner_mfu.py --out bench-results

Trains the learner's own loss (:func:`learner.loss.policy_gradient_loss` over
:func:`learner.logprobs.completion_logprobs`) with DeepSpeed ZeRO-1, bf16, on synthetic samples with
random prompts, completions, behaviour logprobs and rewards; then consolidates and saves the weights as
safetensors like a checkpoint. Records tokens/s and model FLOPs utilisation (MFU):

- model FLOPs per trained token = 6 N + 12 L d s (the PaLM formula: dense weights plus attention
  scores, forward and backward); N counts the non-embedding weights; the output head counts only for
  the positions it runs over (the learner runs it over completion positions alone);
- MFU = achieved model FLOP/s over the GPU's peak dense bf16 rate: the datasheet's 989 TFLOP/s for an
  H100/H200 SXM, and also over a bf16 matrix product measured in the same run, as a second baseline.

Not part of ``make bench`` or the tests (no GPU there); it prints one line and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

DATASHEET_BF16_TFLOPS = 989.0


def measured_matmul_tflops(size: int = 8192, repeats: int = 10) -> float:
    """A bf16 square matrix product's rate on this GPU: the practical ceiling."""
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e12


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench-results"))
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--completion", type=int, default=1536)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="torch.compile the engine (DeepSpeed engine.compile)")
    parser.add_argument(
        "--variant", choices=["learner", "plain"], default="learner", help="plain: next-token loss, the ceiling"
    )
    args = parser.parse_args()

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29511")
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)
    import deepspeed
    from transformers import LlamaConfig, LlamaForCausalLM

    from learner.logprobs import completion_logprobs
    from learner.loss import LossConfig, normalise_advantages, policy_gradient_loss

    peak_measured = measured_matmul_tflops()
    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=4096,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=16,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    dense = params - model.model.embed_tokens.weight.numel()  # an embedding lookup does no multiply-adds
    deepspeed.init_distributed(dist_backend="nccl")
    ds_config = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 1},
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0, "torch_adam": True}},
        "gradient_clipping": 1.0,
        "steps_per_print": 1_000_000,
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    if args.compile:
        engine.compile()  # the warm-up steps below absorb the compilation
    loss_config = LossConfig(is_cap=2.0, clip_eps=0.2)
    generator = torch.Generator().manual_seed(1)

    def batch() -> tuple[list[list[int]], list[list[int]], torch.Tensor, torch.Tensor, torch.Tensor]:
        prompts = torch.randint(3, config.vocab_size, (args.batch, args.prompt), generator=generator).tolist()
        completions = torch.randint(3, config.vocab_size, (args.batch, args.completion), generator=generator)
        behaviour = -torch.rand(args.batch, args.completion, generator=generator) * 12
        rewards = torch.rand(args.batch, generator=generator)
        mask = torch.ones(args.batch, args.completion)
        return prompts, completions.tolist(), behaviour.cuda(), rewards.cuda(), mask.cuda()

    def step() -> float:
        prompts, completions, behaviour, rewards, mask = batch()
        if args.variant == "plain":
            ids = torch.tensor([p + c for p, c in zip(prompts, completions, strict=True)], device="cuda")
            plain = engine(input_ids=ids, labels=ids, use_cache=False).loss
            engine.backward(plain)
            engine.step()
            return float(plain.detach())
        logp, valid = completion_logprobs(engine, prompts, completions)
        terms = policy_gradient_loss(logp, behaviour, normalise_advantages(rewards), mask * valid, loss_config)
        engine.backward(terms.loss)
        engine.step()
        return float(terms.loss.detach())

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    tokens = args.batch * (args.prompt + args.completion)
    seconds = statistics.median(times)
    seq = args.prompt + args.completion
    # The learner runs the output head only over completion positions (learner.logprobs): count what runs.
    head = model.lm_head.weight.numel()
    head_tokens = tokens if args.variant == "plain" else args.batch * args.completion
    attention = 12 * config.num_hidden_layers * config.hidden_size * seq
    step_flops = tokens * (6 * (dense - head) + attention) + head_tokens * 6 * head
    achieved = step_flops / seconds / 1e12

    save_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        engine.module.save_pretrained(folder, safe_serialization=True)
        saved_bytes = sum(path.stat().st_size for path in Path(folder).rglob("*") if path.is_file())
    save_seconds = time.perf_counter() - save_start

    result = {
        "name": f"learner_gpu_cycle_0.5b_bf16_{args.variant}{'_compiled' if args.compile else ''}",
        "unit": "tokens/s",
        "value": tokens / seconds,
        "baseline_name": "peak_dense_bf16_datasheet_tflops",
        "baseline_value": DATASHEET_BF16_TFLOPS,
        "ratio": achieved / DATASHEET_BF16_TFLOPS,
        "goal": {"ratio_at_least": 0.4},
        "runs": args.steps,
        "extra": {
            "gpu": torch.cuda.get_device_name(),
            "parameters": params,
            "achieved_model_tflops": achieved,
            "mfu_vs_datasheet": achieved / DATASHEET_BF16_TFLOPS,
            "measured_matmul_tflops": peak_measured,
            "mfu_vs_measured_matmul": achieved / peak_measured,
            "step_seconds_median": seconds,
            "tokens_per_step": tokens,
            "last_loss": loss,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
            "checkpoint_save_seconds": save_seconds,
            "checkpoint_bytes": saved_bytes,
            "torch": torch.__version__,
            "deepspeed": deepspeed.__version__,
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    label = f"{args.variant}{'_compiled' if args.compile else ''}"
    (args.out / f"learner_gpu_cycle_{label}_b{args.batch}.json").write_text(json.dumps(result, indent=2))
    print(
        f"learner GPU cycle ({label}): {tokens / seconds:,.0f} tokens/s, {achieved:.0f} model TFLOP/s, "
        f"MFU {achieved / DATASHEET_BF16_TFLOPS:.1%} of datasheet ({achieved / peak_measured:.1%} of measured matmul), "
        f"{params / 1e6:.0f}M params, batch {args.batch}x{seq}, save {save_seconds:.1f}s"
    )


if __name__ == "__main__":
    main()
