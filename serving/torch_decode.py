"""One padded batch of sequences decoded together with a KV cache, each row sampled with its own parameters.

The prompts are left-padded to one width; the attention mask hides the padding and the position ids
count only real tokens, so a row decodes exactly as it would alone (up to float rounding). The prompt
runs once, then one token per step reuses ``past_key_values``; rows that finish are dropped from the
batch (and from the cache), so a short request does not pay for a long neighbour, and new rows can
join a running batch between two steps (:class:`BatchRun`).

Which logprob is reported, and why: the learner recomputes pi_theta itself; from serving it needs the
probability with which the behaviour policy mu actually drew each token, for off-policy correction.
So a sampled token's logprob is taken under the SAMPLING distribution: the logits divided by the
temperature, restricted to the top-p nucleus and renormalised. A greedy request (temperature 0) has a
degenerate sampling distribution (every logprob would be 0); it reports the logprob of the argmax
under the model's untempered distribution instead. Both engines (torch, vLLM) follow this rule.

Stop strings and eos: the text stops before the first stop string (OpenAI's behaviour), while
``token_ids``/``logprobs`` keep every sampled token up to and including the one that completed the
stop string or the eos token: that is what the policy generated, and learning to stop needs it.
Sampling is drawn from one ``torch.Generator`` per row, seeded by the request's ``seed``, and done on
the CPU, so a seed repeats on any device and in any batch composition.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from serving.engine import SamplingParams

FinishReason = Literal["stop", "length"]


@dataclass
class Decoded:
    """What one row produced."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason = "length"


class RowSampler:
    """Picks one row's next token and its behaviour logprob (see the module docstring)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.generator = torch.Generator(device="cpu")
        if params.seed is None:
            self.generator.seed()  # a fresh nondeterministic seed
        else:
            self.generator.manual_seed(params.seed)

    def pick(self, logits: torch.Tensor) -> tuple[int, float]:
        """The next token for float32 CPU ``logits`` of shape [vocab]."""
        p = self.params
        if p.temperature == 0.0:
            token = int(torch.argmax(logits))
            return token, min(0.0, float(torch.log_softmax(logits, dim=-1)[token]))
        # Shifted by the max first (softmax does not change) and divided in float64: a tiny temperature then
        # sends the others to -inf, not the top logit to +inf (or 0/0 where float32 rounds it to 0), which made
        # every probability NaN and drew an arbitrary token.
        probs = torch.softmax((logits - logits.max()).double() / p.temperature, dim=-1)
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # The nucleus: the fewest most-likely tokens whose mass reaches top_p (never empty).
        kept = max(1, int(((cumulative - sorted_probs) < p.top_p).sum())) if p.top_p < 1.0 else len(order)
        mass = float(cumulative[kept - 1])
        draw = float(torch.rand((), generator=self.generator)) * mass
        index = min(int(torch.searchsorted(cumulative[:kept], torch.tensor(draw), right=True)), kept - 1)
        chosen = float(sorted_probs[index])
        if chosen <= 0.0:  # cannot happen for a drawn token unless probabilities underflow; fall back to the top
            index, chosen = 0, float(sorted_probs[0])
        return int(order[index]), min(0.0, math.log(chosen / mass))


class _Row:
    """Decoding state of one row."""

    def __init__(self, params: SamplingParams, tokenizer: Any, eos_ids: frozenset[int]) -> None:
        self.params = params
        self.sampler = RowSampler(params)
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.out = Decoded()
        self.done = False
        self._longest_stop = max((len(s) for s in params.stop), default=0)
        self._scanned = 0  # stop strings are searched from here on (earlier text was already searched)

    def step(self, logits: torch.Tensor, greedy: tuple[int, float]) -> int:
        """Take the next token: ``greedy`` (argmax, its untempered logprob) or, when sampling, a draw."""
        token, logprob = greedy if self.params.temperature == 0.0 else self.sampler.pick(logits)
        self.out.token_ids.append(token)
        self.out.logprobs.append(logprob)
        if token in self.eos_ids:
            self._finish("stop")
        elif self.params.stop and self._stop_string_found():
            pass
        elif len(self.out.token_ids) >= self.params.max_tokens:
            self._finish("length")
        return token

    def _stop_string_found(self) -> bool:
        text = self.tokenizer.decode(self.out.token_ids, skip_special_tokens=True)
        start = max(0, self._scanned - self._longest_stop)
        hits = [at for at in (text.find(s, start) for s in self.params.stop) if at >= 0]
        self._scanned = len(text)
        if not hits:
            return False
        self.done = True
        self.out.finish_reason = "stop"
        self.out.text = text[: min(hits)]
        return True

    def _finish(self, reason: FinishReason) -> None:
        self.done = True
        self.out.finish_reason = reason
        self.out.text = self.tokenizer.decode(self.out.token_ids, skip_special_tokens=True)


def eos_ids_of(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every token id that ends a generation: the tokenizer's eos and the generation config's."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, list):
            ids.update(v for v in value if isinstance(v, int))
    return frozenset(ids)


def _left_pad(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """``x`` padded with zeros on the left of ``dim`` up to ``width``."""
    missing = width - x.shape[dim]
    if missing == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [missing, 0]
    return torch.nn.functional.pad(x, pad)


class BatchRun:
    """A batch being decoded, one token per :meth:`step`; new rows may :meth:`add` themselves between steps.

    Joining is what keeps the engine busy when requests arrive a few ms apart (each through an HTTP
    round trip): a row prefills on its own, then its cache is left-padded to the batch's length and
    concatenated to it (``can_join`` is False for caches that cannot be merged so, e.g. sliding windows).
    Rows are identified by the caller's keys; finished rows leave the batch and its cache at once.
    """

    def __init__(self, model: Any, tokenizer: Any, device: torch.device, eos_ids: frozenset[int]) -> None:
        self.model, self.tokenizer, self.device, self.eos_ids = model, tokenizer, device, eos_ids
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.cache: Any = None
        self.mask = torch.zeros((0, 0), dtype=torch.long, device=device)  # over the cached positions
        self.last_positions = torch.zeros((0, 1), dtype=torch.long, device=device)
        self.keys: list[Any] = []
        self.rows: list[_Row] = []
        self.next_tokens: list[int] = []

    @property
    def size(self) -> int:
        """Rows decoding now."""
        return len(self.rows)

    @property
    def can_join(self) -> bool:
        """Whether rows can join this batch (its cache layers are plain growing key/value tensors)."""
        layers = getattr(self.cache, "layers", None)
        if layers is None:
            return self.cache is None
        return all(hasattr(layer, "keys") and not getattr(layer, "is_sliding", False) for layer in layers)

    @torch.inference_mode()
    def add(
        self, keys: Sequence[Any], prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams]
    ) -> list[tuple[Any, Decoded]]:
        """Prefill new rows (token ids, non-empty) and pick their first tokens; return those already finished."""
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        rows = [_Row(p, self.tokenizer, self.eos_ids) for p in params]
        tokens = _pick(out.logits[:, -1, :], rows)
        keep = [j for j, row in enumerate(rows) if not row.done]
        finished = [(keys[j], rows[j].out) for j, row in enumerate(rows) if row.done]
        if not keep:
            return finished
        cache = out.past_key_values
        if len(keep) < len(rows):
            index = torch.tensor(keep, device=self.device)
            cache.batch_select_indices(index)
            mask, positions = mask[index], positions[index]
        if self.cache is None:
            self.cache, self.mask = cache, mask
            self.last_positions = positions[:, -1:]
        else:
            length = max(self.mask.shape[1], mask.shape[1])
            for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
                mine.keys = torch.cat([_left_pad(mine.keys, length, 2), _left_pad(theirs.keys, length, 2)])
                mine.values = torch.cat([_left_pad(mine.values, length, 2), _left_pad(theirs.values, length, 2)])
            self.mask = torch.cat([_left_pad(self.mask, length, 1), _left_pad(mask, length, 1)])
            self.last_positions = torch.cat([self.last_positions, positions[:, -1:]])
        self.keys += [keys[j] for j in keep]
        self.rows += [rows[j] for j in keep]
        self.next_tokens += [tokens[j] for j in keep]
        return finished

    @torch.inference_mode()
    def step(self) -> list[tuple[Any, Decoded]]:
        """Decode one more token for every row; return the rows that finished (they leave the batch)."""
        step_ids = torch.tensor(self.next_tokens, dtype=torch.long, device=self.device).unsqueeze(1)
        self.mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=1)
        self.last_positions = self.last_positions + 1
        out = self.model(
            input_ids=step_ids,
            attention_mask=self.mask,
            position_ids=self.last_positions,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        self.next_tokens = _pick(out.logits[:, -1, :], self.rows)
        keep = [j for j, row in enumerate(self.rows) if not row.done]
        finished = [(self.keys[j], row.out) for j, row in enumerate(self.rows) if row.done]
        if len(keep) < len(self.rows):
            index = torch.tensor(keep, dtype=torch.long, device=self.device)
            if keep:
                self.cache.batch_select_indices(index)
            self.mask, self.last_positions = self.mask[index], self.last_positions[index]
            self.keys = [self.keys[j] for j in keep]
            self.rows = [self.rows[j] for j in keep]
            self.next_tokens = [self.next_tokens[j] for j in keep]
            if keep:
                self._trim()
        if not keep:
            self.cache = None  # an empty batch starts afresh
        return finished

    def _trim(self) -> None:
        """Drop the leading cache positions no remaining row attends to (padding only).

        Under a steady stream of requests a batch never empties, and each joining row pads the others
        to its length: without this, the cache grew with every join for as long as the batch lived, and
        every step grew slower with it (attention and the cache's concatenation over mostly padding).
        """
        attended = self.mask.any(dim=0)
        first = int(attended.to(torch.uint8).argmax())
        if first == 0:
            return
        self.mask = self.mask[:, first:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[:, :, first:, :]
            layer.values = layer.values[:, :, first:, :]


def _pick(last_logits: torch.Tensor, rows: Sequence[_Row]) -> list[int]:
    """Each row's next token from its logits (batch x vocab)."""
    logits = last_logits.float().cpu()
    # Greedy picks for every row at once: per-row tensor ops would cost more than the forward pass.
    best = logits.argmax(dim=-1)
    best_logprobs = torch.log_softmax(logits, dim=-1).gather(1, best.unsqueeze(1)).squeeze(1)
    greedy = list(zip(best.tolist(), (min(0.0, lp) for lp in best_logprobs.tolist()), strict=True))
    return [row.step(logits[j], greedy[j]) for j, row in enumerate(rows)]


def decode_batch(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    params: Sequence[SamplingParams],
    device: torch.device,
    eos_ids: frozenset[int],
) -> list[Decoded]:
    """Decode every prompt (token ids, non-empty) with its own parameters, as one left-padded batch."""
    run = BatchRun(model, tokenizer, device, eos_ids)
    results = dict(run.add(range(len(prompts)), prompts, params))
    while run.size:
        results.update(run.step())
    return [results[i] for i in range(len(prompts))]
