"""Offline learnability experiment (not a test): can the tiny base learn *when* to parallelise a swarm task?

It mirrors the live loop for the ``swarm`` scenario (:mod:`liveloop.demo.simulator.swarm`) without Kafka or
services, like :mod:`tests.liveloop.learnability_experiment` does for the code demo: the base is pre-trained on
:func:`~liveloop.demo.simulator.swarm_corpus.pretraining_corpus`; the champion serves drawn tasks (sampled as the
torch engine samples, ``stop=["\\n"]``, temperature 1, ``--max-tokens``); each answer is read with
:func:`~liveloop.demo.simulator.swarm.read_decision` and worked out with
:func:`~liveloop.demo.simulator.swarm.settle`; the reward is the live loop's (:class:`RewardConfig`)::

    outcome_score + fake_parallelism_weight * (share of spawned sub-agents that did not finish)

and the learner trains round by round (one optimizer step per ``--round`` samples, advantage = reward - EMA
baseline, normalised per batch, :func:`learner.loss.policy_gradient_loss` with truncated importance weights).
Every ``--cycle`` samples the trained weights become the champion (the gate is assumed to pass, but the
KL it would check is printed). Every cycle is measured on a fixed set of ``--eval`` tasks: success, mean
critical steps and parallel share for one-part and many-part tasks, garbled share, both hack rates, and the
mean per-token ``KL(new || previous champion)`` on the evaluation prompts and the new champion's answers
(:func:`serving.policy_scores.mean_kl`, the live gate's measure; it refuses above 1.0 nats).

Run on one core: pre-train the base once (1,500 steps, about 10 minutes; the same recipe as ``liveloop demo
--scenario swarm`` at seed 0) and save it, then run the loop on it as often as needed (2,048 samples, about 3.5
minutes); results and what they mean are in ``docs/swarm-learnability.md``::

    PYTHONPATH=. DS_ACCELERATOR=cpu .venv/bin/python -m tests.liveloop.swarm_learnability \
        --pretrain-only --pretrain-steps 1500 --save /tmp/swarm-base.pt
    PYTHONPATH=. DS_ACCELERATOR=cpu .venv/bin/python -m tests.liveloop.swarm_learnability \
        --pretrain-steps 0 --load /tmp/swarm-base.pt --lr 1e-4

``--pretrain-only`` stops after measuring the base (to choose ``--pretrain-steps``); ``--load`` with
``--pretrain-steps N`` pre-trains N more steps (with a fresh warm-up and cosine schedule) from saved weights.
``--base-dir`` starts from a demo's base instead (``<state-dir>/base-model``). The swarm demo's learner, as the
docs' fourth-version table ran it: ``--lr 2e-4 --round 64 --cycle 128 --size-buckets --fake-parallelism-weight -1
--eval 300 --epochs 2 --clip 0.2 --min-advantage 0``.
"""

from __future__ import annotations

import argparse
import copy
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from learner.baseline import EmaBaseline
from learner.logprobs import completion_logprobs
from learner.loss import LossConfig, normalise_advantages, policy_gradient_loss
from learner.pretrain import pretrain
from learner.tiny_model import TinyModelSpec, build_tiny_model, byte_tokenizer
from liveloop.demo.simulator.swarm import (
    DEFAULT_SETTINGS,
    SwarmOutcome,
    SwarmSettings,
    SwarmTask,
    draw_task,
    outcome_score,
    read_decision,
    settle,
    task_rng,
)
from liveloop.demo.simulator.swarm_corpus import pretraining_corpus
from serving.engine import SamplingParams
from serving.policy_scores import mean_kl
from serving.torch_decode import Decoded, decode_batch

EVAL_SEED = 999
"""Seeds the fixed evaluation tasks (apart from every training seed)."""


def encode(tokenizer: Any, prompt: str) -> list[int]:
    """As the torch engine encodes a prompt: special tokens, minus ByT5's trailing eos."""
    return list(tokenizer(prompt)["input_ids"])[:-1]


def sample(
    model: Any, tokenizer: Any, prompts: Sequence[str], seed: int, temperature: float, max_tokens: int
) -> list[Decoded]:
    """Completions as the gateway serves them (one line, at most ``max_tokens`` bytes), 64 prompts per batch."""
    out: list[Decoded] = []
    for start in range(0, len(prompts), 64):
        chunk = prompts[start : start + 64]
        params = [
            SamplingParams(
                temperature=temperature, max_tokens=max_tokens, stop=("\n",), seed=seed * 100_000 + start + i
            )
            for i in range(len(chunk))
        ]
        encoded = [encode(tokenizer, p) for p in chunk]
        out += decode_batch(model, tokenizer, encoded, params, torch.device("cpu"), frozenset({1}))
    return out


@dataclass(frozen=True)
class RewardConfig:
    """The live loop's reward of a swarm trajectory, worked out from :func:`settle` (see the module docstring)."""

    fake_parallelism_weight: float
    settings: SwarmSettings

    def __call__(self, outcome: SwarmOutcome) -> float:
        # distill.trajectory: performance (the product's score) plus the fake-parallelism guard, the share of
        # spawned sub-agents that did not finish. Serial collapse needs serial_steps served orchestrator turns,
        # and the simulator serves one, so that guard never fires here (the score charges the long path instead).
        spawned = len(outcome.runs)
        unfinished = sum(1 for run in outcome.runs if not run.finished)
        fake = unfinished / spawned if spawned else 0.0
        return outcome_score(outcome, self.settings) + self.fake_parallelism_weight * fake


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def measure(outcomes: Sequence[SwarmOutcome]) -> dict[str, float]:
    """The per-cycle figures of a set of settled answers (one-part and many-part tasks apart)."""
    one = [o for o in outcomes if o.task.size == 1]
    many = [o for o in outcomes if o.task.size >= 2]
    return {
        "success": _mean([float(o.success) for o in outcomes]),
        "success_1": _mean([float(o.success) for o in one]),
        "success_many": _mean([float(o.success) for o in many]),
        "steps_1": _mean([float(o.critical_steps) for o in one]),
        "steps_many": _mean([float(o.critical_steps) for o in many]),
        "parallel_1": _mean([float(o.mode == "parallel") for o in one]),
        "parallel_many": _mean([float(o.mode == "parallel") for o in many]),
        "garbled": _mean([float(o.mode == "garbled") for o in outcomes]),
        "serial_collapse": _mean([float(o.serial_collapse) for o in outcomes]),
        "fake_parallelism": _mean([float(o.fake_parallelism) for o in outcomes]),
        "right": _mean([float(o.right_decision) for o in outcomes]),
        "success_1_serial": _mean([float(o.success) for o in one if o.mode == "serial"]),
        "success_1_parallel": _mean([float(o.success) for o in one if o.mode == "parallel"]),
    }


def evaluate(
    model: Any, tokenizer: Any, tasks: Sequence[SwarmTask], a: argparse.Namespace
) -> tuple[dict[str, float], list[list[int]]]:
    """The figures on the evaluation tasks, and the sequences (prompt + answer) the KL is measured on."""
    prompts = [task.prompt() for task in tasks]
    answers = sample(model, tokenizer, prompts, 7, a.temperature, a.max_tokens)
    outcomes = [settle(task, read_decision(out.text)) for task, out in zip(tasks, answers, strict=True)]
    sequences = [encode(tokenizer, p) + out.token_ids for p, out in zip(prompts, answers, strict=True)]
    return measure(outcomes), sequences


def report(figures: dict[str, float]) -> str:
    f = figures
    return (
        f"success {f['success']:.3f} (1-part {f['success_1']:.3f}: serial {f['success_1_serial']:.3f} "
        f"parallel {f['success_1_parallel']:.3f}; many {f['success_many']:.3f}) "
        f"right {f['right']:.3f} | steps 1-part {f['steps_1']:.2f} many {f['steps_many']:.2f} | "
        f"parallel 1-part {f['parallel_1']:.3f} many {f['parallel_many']:.3f} | garbled {f['garbled']:.3f} | "
        f"serial collapse {f['serial_collapse']:.3f} fake parallelism {f['fake_parallelism']:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="Seeds the base, the corpus and the training tasks.")
    ap.add_argument("--pretrain-steps", type=int, default=1500)
    ap.add_argument("--pretrain-only", action="store_true", help="Measure the base, then stop.")
    ap.add_argument("--load", type=Path, help="Start from these saved weights (then pre-train --pretrain-steps more).")
    ap.add_argument("--save", type=Path, help="Save the pre-trained base here (to reuse it with --load).")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--round", type=int, default=64, help="Samples per optimizer step (learner round_samples).")
    ap.add_argument("--cycle", type=int, default=256, help="Samples per checkpoint (promoted at once).")
    ap.add_argument("--total", type=int, default=2048)
    ap.add_argument("--eval", type=int, default=200, help="Fixed evaluation tasks.")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-tokens", type=int, default=448, help="Longest answer served (5 calls + idle: 425 bytes).")
    ap.add_argument(
        "--fake-parallelism-weight", type=float, default=-0.5, help="The reward spec's fake_parallelism weight."
    )
    ap.add_argument(
        "--size-buckets",
        action="store_true",
        help="One EMA baseline for one-part tasks and one for many-part tasks (as a task_kind per size would).",
    )
    ap.add_argument("--kl-coef", type=float, default=0.0, help="KL penalty to the champion (learner kl_coef).")
    ap.add_argument("--epochs", type=int, default=1, help="Passes over each round (learner epochs; needs --clip).")
    ap.add_argument("--clip", type=float, default=None, help="PPO ratio clip (learner clip_eps); none by default.")
    ap.add_argument(
        "--min-advantage", type=float, default=None, help="Floor of the normalised advantages (learner min_advantage)."
    )
    ap.add_argument("--base-dir", type=Path, help="Start from a demo's base-model folder (no pre-training).")
    a = ap.parse_args()
    torch.set_num_threads(1)

    tokenizer = byte_tokenizer()
    reward = RewardConfig(a.fake_parallelism_weight, DEFAULT_SETTINGS)
    started = time.monotonic()
    if a.base_dir is not None:
        behaviour: Any = AutoModelForCausalLM.from_pretrained(a.base_dir).eval()  # type: ignore[no-untyped-call]
    else:
        behaviour = build_tiny_model(TinyModelSpec(seed=a.seed))
        if a.load is not None:
            behaviour.load_state_dict(torch.load(a.load))
    losses = [float("nan")]
    if a.pretrain_steps and a.base_dir is None:
        corpus = pretraining_corpus(size=4000, seed=a.seed)
        # 512 bytes: the longest corpus text (a five-part answer with an idle sub-agent) is 484 bytes and its eos.
        losses = pretrain(behaviour, tokenizer, corpus, steps=a.pretrain_steps, seed=a.seed, max_length=512, threads=1)
    if a.save is not None:
        torch.save(behaviour.state_dict(), a.save)
    eval_tasks = [draw_task(task_rng(EVAL_SEED, i)) for i in range(a.eval)]
    figures, _ = evaluate(behaviour, tokenizer, eval_tasks, a)
    print(
        f"base ({a.pretrain_steps} pre-training steps, final loss {_mean(losses[-20:]):.3f}, "
        f"{time.monotonic() - started:.0f} s): {report(figures)}",
        flush=True,
    )
    if a.pretrain_only:
        return
    policy = copy.deepcopy(behaviour).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=a.lr, weight_decay=0.0)
    baseline, config = EmaBaseline(0.9), LossConfig(is_cap=2.0, clip_eps=a.clip, kl_coef=a.kl_coef)
    started = time.monotonic()
    seen, rewards = 0, []
    while seen < a.total:
        tasks = [draw_task(task_rng(a.seed, seen + i)) for i in range(a.round)]
        prompts = [task.prompt() for task in tasks]
        answers = sample(behaviour, tokenizer, prompts, 1000 + seen, a.temperature, a.max_tokens)
        batch_rewards = [reward(settle(t, read_decision(out.text))) for t, out in zip(tasks, answers, strict=True)]
        seen += len(tasks)
        rewards += batch_rewards
        buckets = [f"swarm-{min(t.size, 2)}" if a.size_buckets else "swarm" for t in tasks]
        raw = baseline.advantages(batch_rewards, buckets)
        baseline.update(batch_rewards, buckets)
        advantages = normalise_advantages(torch.tensor(raw, dtype=torch.float64)).float()
        if a.min_advantage is not None:
            advantages = advantages.clamp(min=a.min_advantage)
        for _ in range(a.epochs):
            logp, valid = completion_logprobs(
                policy, [encode(tokenizer, p) for p in prompts], [o.token_ids for o in answers]
            )
            behaviour_logp = torch.zeros_like(logp)
            for i, out in enumerate(answers):
                behaviour_logp[i, : len(out.logprobs)] = torch.tensor(out.logprobs)
            # The reference of the KL penalty is the champion that sampled the batch, as in the learner's cycle.
            reference = behaviour_logp if a.kl_coef else None
            terms = policy_gradient_loss(logp, behaviour_logp, advantages, valid, config, reference)
            optimizer.zero_grad()
            terms.loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
            optimizer.step()
        if seen % a.cycle == 0:
            policy.eval()
            figures, sequences = evaluate(policy, tokenizer, eval_tasks, a)
            kl = mean_kl(policy, behaviour, sequences)
            behaviour = copy.deepcopy(policy)
            policy.train()
            elapsed = time.monotonic() - started
            print(
                f"after {seen} samples ({elapsed:.0f} s, mean reward {_mean(rewards[-a.cycle :]):+.3f}, "
                f"gate mean_kl {kl:.3f}): {report(figures)}",
                flush=True,
            )


if __name__ == "__main__":
    main()
