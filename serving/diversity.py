"""Diversity and validity of a policy's sampled completions: what collapses as a preference is learned.

A policy that learns a preference narrows; one that over-learns collapses onto a few completions (the
demo saw the share of distinct completions fall from 0.86 to 0.21, almost only ``' 1;'`` and ``' 58;'``)
and may stop writing well-formed output. Greedy regression checks cannot see that, so the gate samples.

Two halves:

* pure measures of a list of completions (:func:`distinct_share`, :func:`completion_entropy`,
  :func:`well_formed_share`, :func:`summarize`), which the demo report can call on the completions the
  simulator saw per version as well;
* :class:`DiversityProbe`, the sampling set-up a suite file declares (prompts, samples per prompt,
  temperature, seed, stop strings, an optional :class:`WellFormed` validator), and :func:`probe`, which
  samples a model on it with a fixed seed and also returns the model's own per-token entropy.

Distinct share is pooled: distinct completions / completions over every prompt of the probe. It depends
on how many completions are drawn, so it is only compared between policies probed the same way (the gate
probes candidate and champion on the same prompts with the same seed).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

MAX_BATCH_ROWS = 128
"""Most rows sampled together: bounds the KV cache of a probe on a larger model."""


def _compiles(value: str) -> str:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"pattern {value!r} does not compile: {exc}") from exc
    return value


RegexPattern = Annotated[str, Field(min_length=1), AfterValidator(_compiles)]
"""A regular expression, refused at load time (naming it) when it does not compile; the suite's checks use it too."""


class WellFormed(BaseModel):
    """What a well-formed completion is, where the product defines it: a regex it must match in full.

    Versioned, because a decision records which definition it applied (``name@version``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="Recorded with the shares.")
    version: str = Field(min_length=1, description="Change it whenever the pattern changes.")
    regex: RegexPattern = Field(description="``re.fullmatch`` against the completion text (after stop strings).")

    @property
    def label(self) -> str:
        """``name@version``, as recorded with a decision."""
        return f"{self.name}@{self.version}"

    def matches(self, completion: str) -> bool:
        """Whether ``completion`` is well-formed."""
        return re.fullmatch(self.regex, completion) is not None


class DiversityProbe(BaseModel):
    """How the gate samples candidate and champion to compare their diversity (a suite's ``diversity``).

    The prompts are the suite's ``prompts`` followed by the distinct prompts of up to
    ``held_out_prompts`` held-out logged samples (what users really ask). Each prompt is sampled
    ``samples_per_prompt`` times at ``temperature`` (top-p 1, the serving defaults) from one generator
    seeded with ``seed``, so the same models give the same figures.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompts: list[str] = Field(default_factory=list, description="Fixed prompts, probed first.")
    held_out_prompts: int = Field(default=32, ge=0, le=1000, description="Distinct held-out prompts added.")
    samples_per_prompt: int = Field(default=8, ge=2, le=256, description="Completions sampled per prompt.")
    max_tokens: int = Field(default=16, ge=1, le=512, description="Tokens sampled per completion at most.")
    temperature: float = Field(default=1.0, gt=0, le=2, description="Sampling temperature (not greedy).")
    seed: int = Field(default=0, description="Seed of the sampling generator: a decision is reproducible.")
    stop: list[str] = Field(default_factory=list, description="The text ends before the first of these.")
    well_formed: WellFormed | None = Field(default=None, description="None: well-formedness is not checked.")

    @field_validator("prompts")
    @classmethod
    def _non_empty(cls, prompts: list[str]) -> list[str]:
        if any(not p for p in prompts):
            raise ValueError("diversity prompts must not be empty strings")
        return prompts


class DiversityStats(BaseModel):
    """The diversity of one policy's completions. NaN: not measured (no completions, no validator)."""

    model_config = ConfigDict(frozen=True)

    completions: int
    distinct_share: float = Field(description="Distinct completions / completions.")
    completion_entropy: float = Field(description="Entropy of the empirical distribution of completions, nats.")
    token_entropy: float = Field(
        default=math.nan, description="Mean entropy of the model's sampling distribution per sampled token, nats."
    )
    well_formed_share: float = Field(default=math.nan, description="Share matching the validator.")
    top: list[tuple[str, int]] = Field(default_factory=list, description="The most common completions.")


def distinct_share(completions: Sequence[str]) -> float:
    """Distinct completions / completions (NaN for none): 1 when all differ, 1/n when all are the same."""
    return len(set(completions)) / len(completions) if completions else math.nan


def completion_entropy(completions: Sequence[str]) -> float:
    """Shannon entropy (nats) of the empirical distribution of the completions (NaN for none); 0 when all agree."""
    if not completions:
        return math.nan
    n = len(completions)
    return -sum(c / n * math.log(c / n) for c in Counter(completions).values())


def well_formed_share(completions: Sequence[str], well_formed: WellFormed | None) -> float:
    """Share of the completions ``well_formed`` accepts; NaN without a validator or without completions."""
    if well_formed is None or not completions:
        return math.nan
    return sum(well_formed.matches(c) for c in completions) / len(completions)


def summarize(
    completions: Sequence[str],
    well_formed: WellFormed | None = None,
    token_entropy: float = math.nan,
    top: int = 10,
) -> DiversityStats:
    """Every measure of :class:`DiversityStats` for one policy's completions."""
    return DiversityStats(
        completions=len(completions),
        distinct_share=distinct_share(completions),
        completion_entropy=completion_entropy(completions),
        token_entropy=token_entropy,
        well_formed_share=well_formed_share(completions, well_formed),
        top=Counter(completions).most_common(top),
    )


@dataclass(frozen=True)
class Sampled:
    """What :func:`sample_completions` drew: the texts and the entropy of every sampling step."""

    completions: list[str]
    token_entropies: list[float]


def sample_completions(model: Any, tokenizer: Any, prompts: Sequence[str], probe: DiversityProbe) -> Sampled:
    """Sample ``probe.samples_per_prompt`` completions of every prompt, with a KV cache, on the CPU generator.

    Prompts of the same token length run as one batch (of at most :data:`MAX_BATCH_ROWS` rows), every
    prompt repeated once per sample: no padding, so a row decodes exactly as it would alone, and a probe
    costs about ``max_tokens`` forward passes per batch rather than per prompt. A row ends at eos, after
    ``max_tokens``, or once its text holds a stop string (cut there). Each step records the entropy of
    the tempered next-token distribution of every row still running: the model's own measure of how
    much choice it has, less noisy than counting texts. Completions come back grouped by prompt, in the
    order of ``prompts``.
    """
    eos = tokenizer.eos_token_id
    encoded = [list(tokenizer(p, add_special_tokens=False)["input_ids"]) or [eos] for p in prompts]
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(index)
    per_batch = max(1, MAX_BATCH_ROWS // probe.samples_per_prompt)
    batches = [group[i : i + per_batch] for group in by_length.values() for i in range(0, len(group), per_batch)]
    generator = _generator(probe.seed)
    texts: dict[int, list[str]] = {}
    entropies: list[float] = []
    for indices in batches:
        rows = [encoded[i] for i in indices for _ in range(probe.samples_per_prompt)]
        drawn, drawn_entropies = _sample_batch(model, tokenizer, rows, probe, generator)
        entropies += drawn_entropies
        for position, i in enumerate(indices):
            k = probe.samples_per_prompt
            texts[i] = drawn[position * k : (position + 1) * k]
    return Sampled([text for i in range(len(prompts)) for text in texts[i]], entropies)


def _generator(seed: int) -> Any:
    import torch

    return torch.Generator(device="cpu").manual_seed(seed)


def _sample_batch(
    model: Any, tokenizer: Any, rows: list[list[int]], probe: DiversityProbe, generator: Any
) -> tuple[list[str], list[float]]:
    # Rows of one length; see sample_completions.
    import torch

    device = next(model.parameters()).device
    eos = tokenizer.eos_token_id
    out: list[list[int]] = [[] for _ in rows]
    running = [True] * len(rows)
    entropies: list[float] = []
    step = torch.tensor(rows, dtype=torch.long, device=device)
    past = None
    with torch.no_grad():
        for _ in range(probe.max_tokens):
            result = model(input_ids=step, past_key_values=past, use_cache=True)
            past = result.past_key_values
            logp = torch.log_softmax(result.logits[:, -1].double().cpu() / probe.temperature, dim=-1)
            entropy = -(logp.exp() * logp).nan_to_num().sum(dim=-1)
            tokens = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
            for row, token in enumerate(tokens.tolist()):
                if not running[row]:
                    continue
                entropies.append(float(entropy[row]))
                if token == eos:
                    running[row] = False
                    continue
                out[row].append(token)
                if probe.stop and _stopped(tokenizer, out[row], probe.stop):
                    running[row] = False
            if not any(running):
                break
            step = tokens.unsqueeze(1).to(device)
    return [_cut(str(tokenizer.decode(ids, skip_special_tokens=True)), probe.stop) for ids in out], entropies


def probe(model: Any, tokenizer: Any, prompts: Sequence[str], settings: DiversityProbe) -> DiversityStats:
    """Sample ``model`` on ``prompts`` (:func:`sample_completions`) and summarize what it wrote."""
    drawn = sample_completions(model, tokenizer, prompts, settings)
    token_entropy = sum(drawn.token_entropies) / len(drawn.token_entropies) if drawn.token_entropies else math.nan
    return summarize(drawn.completions, settings.well_formed, token_entropy)


def _stopped(tokenizer: Any, row: list[int], stop: Sequence[str]) -> bool:
    # A row whose text holds a stop string is finished: what follows would be cut anyway.
    text = str(tokenizer.decode(row, skip_special_tokens=True))
    return any(s in text for s in stop)


def _cut(text: str, stop: Sequence[str]) -> str:
    # OpenAI's stop rule, as serving applies it: the text ends before the first stop string.
    ends = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[: min(ends)] if ends else text
