"""Benchmarks of the learner: training throughput against a plain PyTorch loop, and checkpoint write time.

``learner_throughput``: :meth:`learner.engine.LearnerEngine.train_step` (DeepSpeed, one process, gloo,
the ZeRO stage of the settings' default, fp32 on the CPU) against a plain PyTorch loop over the same
model (same initial weights), the same packed batches, the same loss (:func:`completion_logprobs` +
:func:`policy_gradient_loss`) and ``torch.optim.AdamW`` with the same hyper-parameters. The two sides
alternate step by step (who goes first alternates too); medians of the runs' totals. Goal: at least
0.9 of the plain loop. The model is a small Llama (hidden 256, 4 layers, ~2.8M parameters) so that
per-step framework overhead shows, rather than being buried under matrix products; batches are packed
to the settings' default token budget (4096 tokens per optimizer step).

``learner_agent_throughput``: the same comparison in tokens/s on agent samples: orchestrator trajectories of
3 to 8 turns (each turn a sample with tool spans masked out of its completion, trajectory-level rewards and
shaping terms), packed whole per batch with one advantage per trajectory (:func:`plan_round`). Goal: at
least 0.9 of the plain loop (issue #38).

``learner_checkpoint_write_<size>``: the time to write a checkpoint as the service does (DeepSpeed state
to a temporary folder, fsync, rename; safetensors + tokenizer + manifest with every file hashed, fsync,
rename; then publish: audit rows, MLflow run with the folder as artifacts, model version, alias,
announcement), for the default tiny model and a ~85M-parameter Llama (hidden 768, 12 layers, 12 heads,
intermediate 2048, vocab 384). Baseline: ``save_pretrained`` of the same weights alone. Informational:
no goal ratio. Never asserts on time.
"""

from __future__ import annotations

import random
import shutil
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from distill.samples import HeldOutRule
from infra.migrations import migrate
from infra.stack import Endpoints
from learner.baseline import EmaBaseline
from learner.checkpoint import (
    CycleRecord,
    build_manifest,
    checkpoint_id_for,
    write_base_checkpoint,
    write_checkpoint_folder,
)
from learner.engine import LearnerEngine, StepBatch, init_distributed
from learner.logprobs import completion_logprobs
from learner.loss import LossConfig, policy_gradient_loss
from learner.publish import publish_checkpoint, register_base
from learner.rounds import plan_round
from learner.settings import LearnerSettings
from learner.shaping import ShapingSchedule
from learner.state import DataDir, TrainingState, commit_folder, write_state_file
from learner.tiny_model import TinyModelSpec, build_tiny_model, save_tiny_model
from tests.bench.results import write_result
from tests.learner.learner_harness import training_samples
from tests.learner.sample_factory import make_agent_sample

THROUGHPUT_SPEC = TinyModelSpec(hidden_size=256, layers=4, heads=4, kv_heads=4, intermediate_size=512)
LARGE_SPEC = TinyModelSpec(hidden_size=768, layers=12, heads=12, kv_heads=12, intermediate_size=2048)
STEPS_PER_RUN = 4
RUNS = 5
TOKEN_BUDGET = LearnerSettings.model_fields["token_budget"].default  # the production default, 4096
CHECKPOINT_RUNS = 3
SHAPING = ShapingSchedule(lambda_parallel=0.2, lambda_finish=0.2, anneal_steps=2000)


def _batches(count: int) -> list[StepBatch]:
    """Packed batches of realistic-looking samples (prompts 40-80 tokens, completions 20-60)."""
    samples = []
    for sample in training_samples(0, 48 * count, seed=3):
        prompt = (sample.prompt_token_ids or []) * 12
        completion = (sample.completion_token_ids or []) * 10
        samples.append(
            sample.model_copy(
                update={
                    "prompt_token_ids": prompt[:80],
                    "completion_token_ids": completion[:60],
                    "behaviour_logprobs": [-5.9] * len(completion[:60]),
                    "loss_mask": [1] * len(completion[:60]),
                }
            )
        )
    return plan_round(samples, EmaBaseline(), token_budget=TOKEN_BUDGET, shaping=SHAPING, first_step=0)[:count]


def _agent_batches(count: int) -> list[StepBatch]:
    """Packed batches of orchestrator trajectories (3-8 turns; prompts 40-80 tokens, completions 20-60 with
    a masked tool span), whole trajectories per batch."""
    rng = random.Random(11)
    samples = []
    number = 0
    for trajectory in range(12 * count):
        turns = rng.randrange(3, 9)
        reward, r_parallel, r_finish = rng.uniform(-1, 1), rng.random(), rng.random()
        for turn in range(turns):
            prompt = [rng.randrange(3, 259) for _ in range(rng.randrange(40, 81))]
            completion = [rng.randrange(3, 259) for _ in range(rng.randrange(20, 61))]
            mask = [1] * len(completion)
            tool = rng.randrange(0, len(completion) // 2)
            mask[tool : tool + 8] = [0] * len(mask[tool : tool + 8])  # a tool call's output, not the policy's
            samples.append(
                make_agent_sample(
                    number,
                    trajectory,
                    turn,
                    turns,
                    reward=round(reward, 3),
                    r_parallel=round(r_parallel, 3),
                    r_finish=round(r_finish, 3),
                    prompt_token_ids=prompt,
                    completion_token_ids=completion,
                    behaviour_logprobs=[round(-5.9 + rng.uniform(-0.5, 0.5), 4) for _ in completion],
                    loss_mask=mask,
                )
            )
            number += 1
    return plan_round(samples, EmaBaseline(), token_budget=TOKEN_BUDGET, shaping=SHAPING, first_step=0)[:count]


def _plain_step(model: Any, optimizer: torch.optim.Optimizer, batch: StepBatch, config: LossConfig) -> None:
    logp, valid = completion_logprobs(model, batch.prompt_ids, batch.completion_ids)
    mask = torch.zeros_like(logp)
    behaviour = torch.zeros_like(logp)
    for row, (m, b) in enumerate(zip(batch.loss_mask, batch.behaviour_logprobs, strict=True)):
        mask[row, : len(m)] = torch.tensor(m, dtype=torch.float32)
        behaviour[row, : len(b)] = torch.tensor(b, dtype=torch.float32)
    advantages = torch.tensor(batch.advantages, dtype=torch.float32)
    terms = policy_gradient_loss(logp, behaviour, advantages, mask * valid, config)
    optimizer.zero_grad(set_to_none=True)
    terms.loss.backward()
    optimizer.step()


def _throughput(tmp_path: Path, batches: list[StepBatch]) -> tuple[LearnerSettings, float, float, int]:
    """Median seconds per run of ``batches`` through the learner's engine and through the plain loop, from the
    same initial weights, interleaved step by step; with the settings and the plain model's parameter count."""
    init_distributed(1)
    base = save_tiny_model(tmp_path / "base", THROUGHPUT_SPEC)
    settings = LearnerSettings(data_dir=tmp_path / "learner", base_model=str(base), lr=1e-5)
    engine = LearnerEngine(settings, rank=0, world_size=1)
    plain = build_tiny_model(THROUGHPUT_SPEC).train()
    optimizer = torch.optim.AdamW(plain.parameters(), lr=settings.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    config = engine.loss_config
    step = 0

    def learner_step(batch: StepBatch) -> None:
        nonlocal step
        engine.train_step(batch, step)
        step += 1

    def plain_step(batch: StepBatch) -> None:
        _plain_step(plain, optimizer, batch, config)

    for batch in batches[:2]:  # warm-up: allocator, first-step optimizer state
        learner_step(batch), plain_step(batch)
    learner_s: list[float] = []
    plain_s: list[float] = []
    for run in range(RUNS):
        # Interleaved step by step (who goes first alternates): a shared, bursty machine moves both alike.
        spent = {learner_step: 0.0, plain_step: 0.0}
        for index, batch in enumerate(batches):
            order = (learner_step, plain_step) if (run + index) % 2 == 0 else (plain_step, learner_step)
            for fn in order:
                started = time.perf_counter()
                fn(batch)
                spent[fn] += time.perf_counter() - started
        learner_s.append(spent[learner_step])
        plain_s.append(spent[plain_step])
    parameters = sum(p.numel() for p in plain.parameters())
    return settings, statistics.median(learner_s), statistics.median(plain_s), parameters


def test_learner_throughput_against_a_plain_pytorch_loop(tmp_path: Path) -> None:
    batches = _batches(STEPS_PER_RUN)
    samples = sum(len(b) for b in batches)
    tokens = sum(b.tokens() for b in batches)
    settings, learner_median, plain_median, parameters = _throughput(tmp_path, batches)
    write_result(
        name="learner_throughput",
        unit="samples/s",
        value=samples / learner_median,
        baseline_name="plain PyTorch loop (same model, batches, loss, AdamW)",
        baseline_value=samples / plain_median,
        goal_ratio=0.9,
        runs=RUNS,
        extra={
            "tokens_per_s": tokens / learner_median,
            "baseline_tokens_per_s": tokens / plain_median,
            "samples_per_run": samples,
            "tokens_per_run": tokens,
            "steps_per_run": len(batches),
            "zero_stage": settings.zero_stage,
            "parameters": parameters,
            "threads": torch.get_num_threads(),
        },
    )


def test_learner_throughput_on_agent_samples(tmp_path: Path) -> None:
    batches = _agent_batches(STEPS_PER_RUN)
    tokens = sum(b.tokens() for b in batches)
    settings, learner_median, plain_median, parameters = _throughput(tmp_path, batches)
    write_result(
        name="learner_agent_throughput",
        unit="tokens/s",
        value=tokens / learner_median,
        baseline_name="plain PyTorch loop (same model, agent batches, loss, AdamW)",
        baseline_value=tokens / plain_median,
        goal_ratio=0.9,
        runs=RUNS,
        extra={
            "samples_per_run": sum(len(b) for b in batches),
            "tokens_per_run": tokens,
            "policy_tokens_per_run": sum(sum(m) for b in batches for m in b.loss_mask),
            "steps_per_run": len(batches),
            "zero_stage": settings.zero_stage,
            "parameters": parameters,
            "threads": torch.get_num_threads(),
        },
    )


def _checkpoint_once(
    engine: LearnerEngine, data: DataDir, version: int, publish: dict[str, Any]
) -> tuple[float, float]:
    """Write, then publish, checkpoint ``version`` as the service does; the seconds each took."""
    settings = engine.settings
    checkpoint_id = checkpoint_id_for(settings.model_name, version)
    started = time.perf_counter()
    temporary = data.temp_state(checkpoint_id)
    engine.save_state(temporary)
    state = TrainingState(
        checkpoint_id=checkpoint_id,
        policy_version=version,
        step=version,
        round=version,
        positions={},
        baseline={},
        seen_sample_ids=[],
        checkpoint_sample_ids=[],
        checkpointed_at=datetime.now(UTC),
    )
    write_state_file(temporary, state)
    commit_folder(temporary, data.state_of(checkpoint_id))

    def manifest_for(files: dict[str, str]) -> Any:
        return build_manifest(
            settings=settings,
            base_label=settings.base_model,
            checkpoint_id=checkpoint_id,
            parent_id=checkpoint_id_for(settings.model_name, version - 1),
            policy_version=version,
            step=version,
            cycle=CycleRecord(),
            positions={},
            files=files,
            held_out=HeldOutRule(percent=10),
        )

    folder = write_checkpoint_folder(data, checkpoint_id, engine.save_pretrained, settings, manifest_for)
    written = time.perf_counter()
    publish_checkpoint(folder, sample_ids=[], **publish)
    return written - started, time.perf_counter() - written


def _checkpoint_bench(
    name: str, spec: TinyModelSpec | None, tmp_path: Path, endpoints: Endpoints, dsn: str, topic: str
) -> None:
    migrate(dsn)
    model_name = f"bench-{name}-{topic.rsplit('.', 1)[1]}"
    base_dir = tmp_path / "base-model"
    base = "tiny" if spec is None else str(save_tiny_model(base_dir, spec))
    settings = LearnerSettings(data_dir=tmp_path / "learner", base_model=base, model_name=model_name, lr=1e-5)
    data = DataDir(settings.data_dir)
    register_base(
        write_base_checkpoint(settings.data_dir, model_name, None if spec is None else base_dir),
        mlflow_uri=endpoints.mlflow_url,
        dsn=dsn,
    )
    engine = LearnerEngine(settings, rank=0, world_size=1)
    engine.train_step(_batches(1)[0], 0)  # optimizer state exists, as in any real checkpoint
    publish = {
        "dsn": dsn,
        "mlflow_uri": endpoints.mlflow_url,
        "bootstrap": endpoints.kafka_bootstrap,
        "checkpoints_topic": topic,
        "samples_topic": "unused",
    }
    measured: list[float] = []
    writes: list[float] = []
    publishes: list[float] = []
    baseline: list[float] = []
    for run in range(CHECKPOINT_RUNS):
        plain_folder = tmp_path / f"plain-{run}"
        started = time.perf_counter()
        engine.module.save_pretrained(plain_folder)
        baseline.append(time.perf_counter() - started)
        shutil.rmtree(plain_folder)
        write_s, publish_s = _checkpoint_once(engine, data, run + 1, publish)
        writes.append(write_s)
        publishes.append(publish_s)
        measured.append(write_s + publish_s)
    size = sum(p.stat().st_size for p in (data.checkpoint(checkpoint_id_for(model_name, 1))).rglob("*"))
    write_result(
        name=f"learner_checkpoint_write_{name}",
        unit="s",
        value=statistics.median(measured),
        baseline_name="save_pretrained of the same weights alone",
        baseline_value=statistics.median(baseline),
        goal_ratio=None,
        runs=CHECKPOINT_RUNS,
        extra={
            "parameters": sum(p.numel() for p in engine.module.parameters()),
            "checkpoint_bytes": size,
            "write_s": statistics.median(writes),
            "publish_s": statistics.median(publishes),
            "includes": "state save, fsync, rename; safetensors, tokenizer, manifest, fsync, rename; publish",
        },
    )


def test_checkpoint_write_time_tiny(
    tmp_path: Path, endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str]
) -> None:
    init_distributed(1)
    _checkpoint_bench("tiny", None, tmp_path, endpoints, fresh_database, make_topic())


def test_checkpoint_write_time_85m(
    tmp_path: Path, endpoints: Endpoints, fresh_database: str, make_topic: Callable[..., str]
) -> None:
    init_distributed(1)
    _checkpoint_bench("85m", LARGE_SPEC, tmp_path, endpoints, fresh_database, make_topic())
