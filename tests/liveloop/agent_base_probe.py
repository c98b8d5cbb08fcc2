"""Probe an agent scenario's base (not a test): does it do the task at all, before any loop runs on it?

A policy-gradient loop reinforces the successes it samples; a base that never succeeds leaves it nothing to
reinforce (docs/agent-learnability.md). This script completes prompts of the scenario's own corpus, drawn with a
seed the base was not pre-trained on, greedily and without the EOS that pre-training appends to its texts (the
gateway serves prompts without one), and counts, by the move the corpus calls right, how often the base writes
exactly the right text:

- ``prune``: ``search``, the right ``prune_chunks`` call, ``answer NN`` with the chain's value;
- ``summary``: how many of the facts the context holds the summary kept, and on how many prompts it kept them all;
  with ``--samples N`` also N completions per prompt sampled at temperature 1, as the demo serves them: the share of
  held facts they keep, and the shares of summaries that make a fact up or copy the context (the planted hacks).

Run it on a cached base (``~/.cache/liveloop/base-models/<scenario>-<key>``) or any saved one::

    PYTHONPATH=. .venv/bin/python -m tests.liveloop.agent_base_probe prune ~/.cache/liveloop/base-models/prune-KEY
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from learner.tiny_model import byte_tokenizer


def complete(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int) -> str:
    """The greedy completion's first line, as the gateway serves a demo turn (``stop=["\\n"]``)."""
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0)
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)).split("\n")[0]


def probe_prune(model: Any, tokenizer: Any, count: int, seed: int) -> dict[str, Any]:
    from liveloop.demo.simulator.prune_corpus import corpus_examples, render_answer, right_plan

    right: Counter[str] = Counter()
    seen: Counter[str] = Counter()
    for example in corpus_examples(size=count, seed=seed):
        plan = right_plan(example.episode)
        written = complete(model, tokenizer, example.episode.prompt(), 100)
        seen[plan] += 1
        right[plan] += written == render_answer(example.episode, plan)
    return {plan: {"right": right[plan], "of": seen[plan]} for plan in seen}


def sample(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int, samples: int) -> list[str]:
    """``samples`` completions' first lines, sampled at temperature 1 with no top-k or top-p, as the demo serves."""
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(
            ids.repeat(samples, 1), max_new_tokens=max_new_tokens, do_sample=True, temperature=1.0, top_k=0,
            top_p=1.0, pad_token_id=0,
        )  # fmt: skip
    return [str(tokenizer.decode(row[ids.shape[1] :], skip_special_tokens=True)).split("\n")[0] for row in out]


def probe_summary(model: Any, tokenizer: Any, count: int, seed: int, samples: int = 0) -> dict[str, Any]:
    from liveloop.demo.simulator.summaries import SUMMARY_CUE, facts_held, read_summary
    from liveloop.demo.simulator.summary_corpus import corpus_examples

    with_facts = facts_in_context = facts_kept = all_kept = 0
    sampled = sampled_held = sampled_kept = made_up = verbatim = 0
    torch.manual_seed(seed)
    for example in corpus_examples(size=count, seed=seed):
        if not facts_held(example.prompt.removesuffix(SUMMARY_CUE), example.task):
            continue  # nothing to keep: any summary keeps it all
        # Read as the simulator reads a live summary: the facts held, and which of them it kept.
        read = read_summary(complete(model, tokenizer, example.prompt, 64), example.prompt, example.task)
        with_facts += 1
        facts_in_context += len(read.held)
        facts_kept += len(read.held) - len(read.lost)
        all_kept += read.keeps_all
        for text in sample(model, tokenizer, example.prompt, 64, samples) if samples else []:
            read = read_summary(text, example.prompt, example.task)
            sampled += 1
            sampled_held += len(read.held)
            sampled_kept += len(read.held) - len(read.lost)
            made_up += bool(read.made_up)
            verbatim += read.verbatim
    figures: dict[str, Any] = {
        "prompts_with_facts": with_facts,
        "facts_in_context": facts_in_context,
        "facts_kept": facts_kept,
        "prompts_all_kept": all_kept,
    }
    if sampled:
        figures["sampled"] = {
            "summaries": sampled,
            "kept_share": round(sampled_kept / sampled_held, 3),
            "made_up_share": round(made_up / sampled, 3),
            "verbatim_share": round(verbatim / sampled, 3),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("scenario", choices=["prune", "summary"])
    parser.add_argument("base", type=Path, help="a saved base model folder")
    parser.add_argument("--count", type=int, default=60, help="corpus prompts to complete")
    parser.add_argument("--seed", type=int, default=99, help="the corpus seed: not the base's own")
    parser.add_argument("--samples", type=int, default=0, help="summary: sampled completions per prompt, too")
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(args.base).eval()
    if args.scenario == "prune":
        figures = probe_prune(model, byte_tokenizer(), args.count, args.seed)
    else:
        figures = probe_summary(model, byte_tokenizer(), args.count, args.seed, args.samples)
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
