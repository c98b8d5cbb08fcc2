"""Plain next-token pre-training of a Hugging Face causal LM on a list of texts (no DeepSpeed, no Kafka).

The demo's base model is a tiny Llama with random weights (no weights can be downloaded); a few hundred
steps on the simulator's language (:func:`liveloop.demo.simulator.language.pretraining_corpus`, passed in by
the caller: this floor may not import ``liveloop``) make its completions plausible, so that the loop
starts from a policy whose outputs users can judge. Deterministic for a seed: batches are drawn from a
private generator and the global RNG is left as it was.

A text is either plain (every token is learned) or :class:`Prompted` (only its completion is): an agent scenario's
base reads a long context and writes a short answer, and over the whole text almost all of the loss is the
context's filler, which no model can predict; the answer's few bytes then teach next to nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch


class Prompted(NamedTuple):
    """A pre-training text whose prompt is read but not learned: the loss counts the completion's tokens only (and
    the eos after them), as a model fine-tuned on answers is."""

    prompt: str
    completion: str


PretrainingText = str | Prompted
"""A plain text (every token learned) or a :class:`Prompted` one."""


class EncodedText(NamedTuple):
    """A text's token ids and how many leading ones are context only (not predicted)."""

    ids: list[int]
    read_only: int = 0


def encode_texts(tokenizer: Any, texts: Sequence[PretrainingText], max_length: int) -> list[EncodedText]:
    """Token ids of each text with the tokenizer's special tokens (ByT5 appends eos, so the model learns to stop),
    cut to ``max_length``; a text with fewer than 2 tokens, or a prompted one cut before its completion, is left
    out (nothing to learn)."""
    encoded = []
    for text in texts:
        whole = text if isinstance(text, str) else text.prompt + text.completion
        ids = list(tokenizer(whole, add_special_tokens=True)["input_ids"])[:max_length]
        # A byte tokenizer encodes the prompt to the same ids on its own as at the front of the whole text.
        read_only = 0 if isinstance(text, str) else len(tokenizer(text.prompt, add_special_tokens=False)["input_ids"])
        if len(ids) >= 2 and read_only < len(ids):
            encoded.append(EncodedText(ids, read_only))
    return encoded


def _batch(rows: list[EncodedText], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(r.ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row.ids)] = torch.tensor(row.ids, dtype=torch.long)
        mask[i, : len(row.ids)] = 1
    labels = ids.masked_fill(mask == 0, -100)  # padding is not predicted
    for i, row in enumerate(rows):
        labels[i, : row.read_only] = -100  # nor is a prompted text's prompt
    return ids, mask, labels


def pretrain(
    model: Any,
    tokenizer: Any,
    texts: Sequence[PretrainingText],
    *,
    steps: int,
    lr: float = 3e-3,
    batch_size: int = 32,
    seed: int = 0,
    max_length: int = 128,
    warmup_steps: int = 20,
    threads: int | None = None,
) -> list[float]:
    """Train ``model`` in place with next-token cross-entropy on ``texts`` (a :class:`Prompted` text's completion
    only); return the loss of every step.

    Each step draws ``batch_size`` texts at random (with replacement, from ``seed``), right-pads them and
    takes one AdamW step (linear warm-up over ``warmup_steps``, then cosine decay to 10 % of ``lr``). The
    model is left in eval mode. ``threads`` sets torch's intra-op threads for the call (restored afterwards):
    a tiny model trains fastest on one thread, and on a busy 2-core machine two threads were 15 times slower
    (0.07 s against 1.0 s a step, measured). Raises ``ValueError`` for no usable text or a non-positive setting.
    """
    if steps < 1 or batch_size < 1 or not lr > 0:
        raise ValueError(f"steps {steps}, batch_size {batch_size} and lr {lr} must all be positive")
    rows = encode_texts(tokenizer, texts, max_length)
    if not rows:
        raise ValueError("no text of at least 2 tokens to train on; pass a non-empty corpus")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def schedule(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, steps - warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + torch.cos(torch.tensor(progress * torch.pi)).item())

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    losses: list[float] = []
    model.train()
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)  # dropout, if the model has any
            for _ in range(steps):
                picks = torch.randint(len(rows), (batch_size,), generator=generator).tolist()
                ids, mask, labels = (t.to(device) for t in _batch([rows[i] for i in picks], pad_id))
                loss = model(input_ids=ids, attention_mask=mask, labels=labels, use_cache=False).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                losses.append(float(loss.item()))
    finally:
        torch.set_num_threads(previous_threads)
        model.eval()
    return losses
