"""What the gate measures with a model in hand: importance log-ratios of logged samples, and KL drift.

Both run teacher-forced forward passes in small batches under ``torch.no_grad()``; nothing here
generates. The logprobs come from :func:`learner.logprobs.completion_logprobs`, the function the learner
trains with, so the gate scores a sample exactly as the learner sees it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from distill.samples import Sample
from learner.logprobs import completion_logprobs


def load_policy_model(folder: Path) -> tuple[Any, Any]:
    """A Hugging Face causal LM and its tokenizer from a checkpoint folder, on the CPU, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(folder, dtype="float32")
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def usable_for_ope(sample: Sample) -> bool:
    """A sample can be reweighted only if it has prompt and completion token ids and behaviour logprobs."""
    return bool(sample.prompt_token_ids) and bool(sample.completion_token_ids) and sample.behaviour_logprobs is not None


def log_ratios(model: Any, samples: Sequence[Sample], batch: int = 16) -> list[float]:
    """Per sample: ``sum_t mask_t * (log pi_model(t) - behaviour_logprob_t)`` over its completion tokens."""
    import torch

    out: list[float] = []
    with torch.no_grad():
        for start in range(0, len(samples), batch):
            chunk = samples[start : start + batch]
            prompts = [list(s.prompt_token_ids or []) for s in chunk]
            completions = [list(s.completion_token_ids or []) for s in chunk]
            logp, valid = completion_logprobs(model, prompts, completions)
            for row, sample in enumerate(chunk):
                n = len(completions[row])
                mask = torch.tensor(sample.loss_mask or [1] * n, dtype=torch.float64)
                mu = torch.tensor(sample.behaviour_logprobs or [0.0] * n, dtype=torch.float64)
                pi = logp[row, :n].double() * valid[row, :n].double()
                out.append(float((mask * (pi - mu)).sum()))
    return out


def mean_kl(candidate: Any, champion: Any, sequences: Sequence[Sequence[int]], batch: int = 16) -> float:
    """Mean over every predicted position of ``KL(candidate || champion)`` of the next-token distributions (nats).

    ``sequences`` are token ids (held-out prompt + completion, suite prompts); each position but the
    last predicts the next token, and every such position weighs the same.
    """
    import torch

    total, count = 0.0, 0
    usable = [list(s) for s in sequences if len(s) >= 2]
    if not usable:
        return float("nan")
    with torch.no_grad():
        for start in range(0, len(usable), batch):
            chunk = usable[start : start + batch]
            width = max(len(s) for s in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row, seq in enumerate(chunk):
                ids[row, : len(seq)] = torch.tensor(seq)
                attention[row, : len(seq)] = 1
            lp_c = torch.log_softmax(candidate(input_ids=ids, attention_mask=attention).logits.double(), dim=-1)
            lp_h = torch.log_softmax(champion(input_ids=ids, attention_mask=attention).logits.double(), dim=-1)
            kl = (lp_c.exp() * (lp_c - lp_h)).sum(dim=-1)  # [B, L]
            # Position t predicts token t+1: the last real position of each row predicts nothing.
            predicts = attention.clone()
            for row, seq in enumerate(chunk):
                predicts[row, len(seq) - 1] = 0
            total += float((kl * predicts).sum())
            count += int(predicts.sum())
    return total / count
