"""Offline learnability experiment (not a test): how fast does the tiny base learn a profile's hidden preference?

It mirrors the demo's loop without Kafka or services: the champion serves (samples drawn as the torch engine
draws them, ``stop=["\\n"]``, temperature 1), the simulated users react, the rewards come from
``distill.reward.score`` on the very events the simulator sends, and the learner trains round by round the way
``learner.rounds.plan_round`` does (one optimizer step per round, advantage = reward - EMA baseline, normalised
per batch, ``learner.loss.policy_gradient_loss`` with truncated importance weights). Every ``--cycle`` samples
the trained weights become the champion (the gate is assumed to pass). Acceptance is the expected acceptance
of 512 fixed evaluation prompts: ``accept_other + (accept_preferred - accept_other) * share preferred``.

Run: ``DS_ACCELERATOR=cpu .venv/bin/python -m tests.liveloop.learnability_experiment --lr 5e-4``
(``--no-guard`` drops the invalid-tool-call penalty, to see the loophole taken; ``--flip-every N`` flips the
fickle profile every N samples).
"""

from __future__ import annotations

import argparse
import copy
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import torch

from distill.reward import score
from distill.samples import Sample
from distill.spec import load_spec
from ingest.events import GenerationEvent
from ingest.payloads import GenerationPayload
from learner.baseline import EmaBaseline
from learner.logprobs import completion_logprobs
from learner.loss import LossConfig, normalise_advantages, policy_gradient_loss
from learner.pretrain import pretrain
from learner.tiny_model import TinyModelSpec, build_tiny_model, byte_tokenizer
from liveloop.demo.simulator.feedback import Envelope, immediate_events, later_events
from liveloop.demo.simulator.language import make_prompt, parse, pretraining_corpus
from liveloop.demo.simulator.profiles import Profile, profile_by_name
from liveloop.demo.simulator.users import react
from serving.engine import SamplingParams
from serving.policy_scores import mean_kl
from serving.torch_decode import Decoded, decode_batch


def encode(tokenizer: Any, prompt: str) -> list[int]:
    """As the torch engine encodes a prompt: special tokens, minus ByT5's trailing eos."""
    return list(tokenizer(prompt)["input_ids"])[:-1]


def sample(model: Any, tokenizer: Any, prompts: list[str], seed: int, temperature: float) -> list[Decoded]:
    """Completions as the gateway serves them (one line, at most 16 tokens), 64 prompts per batch."""
    out: list[Decoded] = []
    for start in range(0, len(prompts), 64):
        chunk = prompts[start : start + 64]
        params = [
            SamplingParams(temperature=temperature, max_tokens=16, stop=("\n",), seed=seed * 100_000 + start + i)
            for i in range(len(chunk))
        ]
        encoded = [encode(tokenizer, p) for p in chunk]
        out += decode_batch(model, tokenizer, encoded, params, torch.device("cpu"), frozenset({1}))
    return out


def evaluate(model: Any, tokenizer: Any, profile: Profile, prompts: list[str], phase: float, temp: float) -> str:
    parsed = [parse(o.text) for o in sample(model, tokenizer, prompts, 7, temp)]
    share = sum(profile.prefers(p, phase, 1.0) for p in parsed) / len(parsed)
    acceptance = profile.accept_other + (profile.accept_preferred - profile.accept_other) * share
    invalid = sum(p.invalid_tool_calls for p in parsed) / len(parsed)
    semicolons = sum(p.semicolon for p in parsed) / len(parsed)
    return (
        f"acceptance {acceptance:.3f} (preferred {share:.3f}, ';' {semicolons:.3f}, invalid tool calls {invalid:.3f})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0, help="Seeds the base, the users and the prompts.")
    ap.add_argument("--pretrain-steps", type=int, default=400)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--round", type=int, default=64, help="Samples per optimizer step (learner round_samples).")
    ap.add_argument("--cycle", type=int, default=256, help="Samples per checkpoint (promoted at once).")
    ap.add_argument("--total", type=int, default=1024)
    ap.add_argument("--profile", default="semicolons")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--no-guard", action="store_true", help="Leave the invalid-tool-call penalty out.")
    ap.add_argument("--flip-every", type=int, default=0, help="fickle: flip the preference every N samples.")
    a = ap.parse_args()
    torch.set_num_threads(1)

    spec, tokenizer, profile = load_spec(), byte_tokenizer(), profile_by_name(a.profile)
    behaviour = build_tiny_model(TinyModelSpec(seed=a.seed))
    corpus = pretraining_corpus(a.profile, size=4000, seed=a.seed)
    pretrain(behaviour, tokenizer, corpus, steps=a.pretrain_steps, seed=a.seed, threads=1)
    policy = copy.deepcopy(behaviour).train()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=a.lr, weight_decay=0.0)
    baseline, config = EmaBaseline(0.9), LossConfig(is_cap=2.0)
    rng = random.Random(a.seed)
    eval_rng = random.Random(999)
    eval_prompts = [make_prompt(eval_rng) for _ in range(512)]
    started, now = time.monotonic(), datetime(2026, 1, 1, tzinfo=UTC)
    print(f"base: {evaluate(behaviour, tokenizer, profile, eval_prompts, 0.0, a.temperature)}", flush=True)
    seen, cycle, rewards = 0, [], []
    while seen < a.total:
        phase = float(seen // a.flip_every) if a.flip_every else 0.0
        prompts = [make_prompt(rng) for _ in range(a.round)]
        batch: list[Sample] = []
        for prompt, out in zip(prompts, sample(behaviour, tokenizer, prompts, 1000 + seen, a.temperature), strict=True):
            envelope, generation_id = Envelope(f"s{seen}", f"u{len(batch) % 50}"), uuid.uuid4()
            payload = GenerationPayload(
                generation_id=generation_id,
                model="tiny",
                policy_version=0,
                prompt=prompt,
                completion=out.text,
                prompt_token_ids=encode(tokenizer, prompt),
                completion_token_ids=out.token_ids,
                completion_logprobs=out.logprobs,
                surface="ide.tab",
                task_kind="completion",
            )
            generation = GenerationEvent(
                session_id=envelope.session_id, user_id=envelope.user_id, ts=now, payload=payload
            )
            reaction = react(profile, out.text, rng, elapsed_s=phase, fickle_period_s=1.0)
            events = immediate_events(envelope, generation_id, reaction, now + timedelta(seconds=1))
            events += later_events(envelope, generation_id, reaction, now + timedelta(seconds=5), 4.0)
            s = score(generation, events, spec, "session_end")
            if a.no_guard and s.invalid_tool_calls:
                s = s.model_copy(update={"reward": max(-2.0, min(2.0, s.reward - s.components["invalid_tool_call"]))})
            batch.append(s)
        seen += len(batch)
        raw_rewards = [s.reward for s in batch]
        rewards += raw_rewards
        raw = baseline.advantages(raw_rewards, ["x"] * len(batch))
        baseline.update(raw_rewards, ["x"] * len(batch))
        advantages = normalise_advantages(torch.tensor(raw, dtype=torch.float64)).float()
        prompt_ids = [list(s.prompt_token_ids or []) for s in batch]
        completion_ids = [list(s.completion_token_ids or []) for s in batch]
        logp, valid = completion_logprobs(policy, prompt_ids, completion_ids)
        behaviour_logp = torch.zeros_like(logp)
        for i, s in enumerate(batch):
            behaviour_logp[i, : len(s.behaviour_logprobs or [])] = torch.tensor(s.behaviour_logprobs or [])
        terms = policy_gradient_loss(logp, behaviour_logp, advantages, valid, config)
        optimizer.zero_grad()
        terms.loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        cycle += batch
        if seen % a.cycle == 0:
            policy.eval()
            kl = mean_kl(
                policy, behaviour, [list(s.prompt_token_ids or []) + list(s.completion_token_ids or []) for s in cycle]
            )
            behaviour = copy.deepcopy(policy)
            policy.train()
            phase = float(seen // a.flip_every) if a.flip_every else 0.0
            mean = sum(rewards[-a.cycle :]) / a.cycle
            measured = evaluate(behaviour, tokenizer, profile, eval_prompts, phase, a.temperature)
            elapsed = time.monotonic() - started
            print(f"after {seen} samples ({elapsed:.0f} s, mean reward {mean:+.3f}, gate mean_kl {kl:.3f}): {measured}")
            cycle = []


if __name__ == "__main__":
    main()
