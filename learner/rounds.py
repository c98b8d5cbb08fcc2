"""Training rounds and the round journal that makes them replayable.

The learner consumes continuously but trains in rounds. Before a round trains, its exact offset ranges
per partition (first..last inclusive, contiguous with the previous round) are appended to
``<data_dir>/rounds.jsonl`` and fsynced; before a checkpoint is written, a checkpoint entry is appended.
After a crash the learner loads its newest complete checkpoint and replays the entries after that
checkpoint's own entry: the same ranges read again, admitted in the same (partition, offset) order,
packed into the same batches with the same advantages and step seeds, so the replay computes what
the first attempt computed.

A rebase entry (:class:`RebaseEntry`, see :mod:`learner.lineage`) is journaled before the learner drops its
weights for the champion's; replaying it loads the same champion and re-trains the same rounds, so a crash
during or after a rebase ends where an uninterrupted learner does.

A torn last line (a crash during the append) is dropped when the journal is opened: that round never
started training, and its records are simply read again live.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from distill.samples import Sample
from learner.baseline import EmaBaseline, bucket_of
from learner.engine import StepBatch
from learner.intake import pack_batches, training_units
from learner.loss import advantage_spread, normalise_advantages
from learner.manifest import OffsetRange
from learner.settings import LossWeighting
from learner.shaping import ShapingSchedule
from learner.token_spans import token_credit

JOURNAL_FILE = "rounds.jsonl"
MIN_SPAN_SPREAD = 0.1
"""The least spread of rewards a span's credit is divided by: in a batch whose rewards barely differ, dividing by
their spread would blow one span's credit up without bound (by ``1 / eps`` where they are all equal)."""


class RoundEntry(BaseModel):
    """A round: the offset ranges it trains on, on top of checkpoint ``parent``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["round"] = "round"
    round: int = Field(ge=1, description="Rounds in the whole lineage, this one included.")
    parent: str = Field(description="The newest checkpoint when the round started.")
    ranges: list[OffsetRange]


class CheckpointEntry(BaseModel):
    """The intent to write checkpoint ``checkpoint_id`` after round ``after_round``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["checkpoint"] = "checkpoint"
    checkpoint_id: str
    parent: str
    after_round: int = Field(ge=0)
    policy_version: int | None = Field(
        default=None,
        ge=1,
        description="The checkpoint's version, chosen when it was journaled (it may skip numbers to match the "
        "registry's, so a replay must not recompute it); absent in journals written before it was recorded.",
    )
    reference_id: str | None = Field(
        default=None,
        description="The KL reference of the cycle that starts after this checkpoint (the champion read before it "
        "was journaled; the checkpoint itself when the learner has no registry); None in older journals: itself.",
    )


class RebaseEntry(BaseModel):
    """The intent to leave checkpoint ``parent``'s line for the champion ``onto``: load its weights, reset the
    optimizer and the KL reference to it, and train the cycle's rounds again on top of it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["rebase"] = "rebase"
    parent: str = Field(description="The newest checkpoint (the cycle's start), as in the round entries.")
    left: str = Field(description="The head of the line left behind (the rejected checkpoint or its descendant).")
    onto: str = Field(description="The champion's checkpoint id, the new parent.")
    onto_version: int = Field(ge=1, description="The champion's version (its MLflow version).")


Entry = RoundEntry | CheckpointEntry | RebaseEntry
JournalEntry = Annotated[Entry, Field(discriminator="kind")]
_ENTRY: TypeAdapter[Entry] = TypeAdapter(JournalEntry)


class RoundJournal:
    """The append-only, fsynced journal of rounds and checkpoint intents."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / JOURNAL_FILE
        self.entries: list[Entry] = []
        if self.path.exists():
            self._load()

    def _load(self) -> None:
        lines = self.path.read_bytes().split(b"\n")
        kept: list[bytes] = []
        for number, line in enumerate(lines):
            if not line.strip():
                continue
            try:
                self.entries.append(_ENTRY.validate_json(line))
            except ValidationError:
                if any(rest.strip() for rest in lines[number + 1 :]):
                    raise
                break  # a torn final append: that round never trained
            kept.append(line)
        if len(kept) != sum(1 for line in lines if line.strip()):
            self._rewrite(kept)

    def _rewrite(self, lines: list[bytes]) -> None:
        temporary = self.path.with_suffix(".tmp")
        with temporary.open("wb") as handle:
            handle.write(b"".join(line + b"\n" for line in lines))
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(self.path)

    def append(self, entry: Entry) -> None:
        """Append ``entry`` durably (write, flush, fsync) before anything acts on it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("ab") as handle:
            handle.write(entry.model_dump_json().encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        self.entries.append(entry)

    def compact(self, checkpoint_id: str) -> None:
        """Forget what came before the intent of ``checkpoint_id`` (complete now): a restart resumes from it
        or later, so older entries would only make the journal grow for as long as the learner runs."""
        for index in range(len(self.entries) - 1, 0, -1):
            entry = self.entries[index]
            if isinstance(entry, CheckpointEntry) and entry.checkpoint_id == checkpoint_id:
                kept = self.entries[index:]
                self._rewrite([item.model_dump_json().encode() for item in kept])
                self.entries = kept
                return

    def after(self, checkpoint_id: str) -> list[Entry]:
        """The entries written after the intent of ``checkpoint_id`` (all of them if it has none: the base)."""
        for index in range(len(self.entries) - 1, -1, -1):
            entry = self.entries[index]
            if isinstance(entry, CheckpointEntry) and entry.checkpoint_id == checkpoint_id:
                return self.entries[index + 1 :]
        return list(self.entries)


def round_ranges(topic: str, start: dict[int, int], last_seen: dict[int, int]) -> list[OffsetRange]:
    """The ranges of a round: per partition read, from the position before it to the last offset read."""
    return [
        OffsetRange(topic=topic, partition=partition, first_offset=start[partition], last_offset=last)
        for partition, last in sorted(last_seen.items())
    ]


def plan_round(
    samples: Sequence[Sample],
    baseline: EmaBaseline,
    token_budget: int,
    *,
    shaping: ShapingSchedule,
    first_step: int,
    weighting: LossWeighting = "token",
    min_advantage: float | None = None,
    tokenizer: Any | None = None,
) -> list[StepBatch]:
    """The round's optimizer steps: ``samples`` (admitted, in (partition, offset) order) packed by tokens,
    whole trajectories per batch (:func:`learner.intake.pack_batches`); batch ``i`` trains at optimiser step
    ``first_step + i``.

    Per batch, each sample's advantage is its reward shaped at that step (:meth:`ShapingSchedule.shaped_reward`)
    against its unit's baseline (a unit: a trajectory, or a single-turn sample,
    :func:`learner.intake.training_units`) before the batch updates it, then normalised with each sample weighing
    ``1 / its unit's samples``, so a 30-turn trajectory weighs in the mean and std once, as one rollout. A
    trajectory's turns share its reward, and so one advantage, unless a turn's own check added to its reward
    (``turn_check``, :mod:`distill.trajectory`). The baseline is updated once per unit, with the unit's mean
    reward, in place. A frozen agent's sample (intake drops them) is left out here too: it must never train, nor
    move the statistics of those that do.

    ``weighting`` (``LearnerSettings.loss_weighting``): with ``"unit"`` each unit's advantage is scaled by the
    batch's mean policy tokens per unit over its own (:func:`unit_weights`), so that in the step's token-mean
    loss every unit weighs the same, a 20-token answer as much as a 280-token one. ``min_advantage``
    (``LearnerSettings.min_advantage``) floors each normalised advantage before that weighting.

    A turn's credited spans (:attr:`distill.samples.AgentCredit.spans`: the parts its own check passed or failed)
    add their credit, divided by the batch's spread of rewards (the scale the normalisation divides by, at least
    :data:`MIN_SPAN_SPREAD`), to the advantage of the tokens that write them
    (:func:`learner.token_spans.token_credit`, with ``tokenizer``, the base model's, which serving uses too). The
    floor does not reach them: a made-up fact is charged even in a turn whose advantage was floored. Without a
    tokenizer, or in a batch whose advantages normalise to zero, spans add nothing.
    """
    trainable = [sample for sample in samples if sample.agent is None or not sample.agent.frozen]
    steps: list[StepBatch] = []
    for index, batch in enumerate(pack_batches(trainable, token_budget)):
        units = training_units(batch)
        ordered = [sample for unit in units for sample in unit]
        by_unit = [[shaping.shaped_reward(sample, first_step + index) for sample in unit] for unit in units]
        unit_buckets = [bucket_of(unit[0]) for unit in units]
        raw = baseline.advantages(
            [reward for rewards in by_unit for reward in rewards],
            [bucket for unit, bucket in zip(units, unit_buckets, strict=True) for _ in unit],
        )
        baseline.update([math.fsum(rewards) / len(rewards) for rewards in by_unit], unit_buckets)
        weights = torch.tensor([1.0 / len(unit) for unit in units for _ in unit], dtype=torch.float64)
        raw_tensor = torch.tensor(raw, dtype=torch.float64)
        advantages = normalise_advantages(raw_tensor, weights=weights).tolist()
        if min_advantage is not None:
            advantages = [max(a, min_advantage) for a in advantages]
        credit = _span_credit(ordered, tokenizer, advantage_spread(raw_tensor, weights=weights))
        scales = [1.0] * len(ordered)
        if weighting == "unit":
            scales = [w for unit, w in zip(units, unit_weights(units), strict=True) for _ in unit]
            advantages = [a * w for a, w in zip(advantages, scales, strict=True)]
        steps.append(
            StepBatch(
                prompt_ids=[list(s.prompt_token_ids or ()) for s in ordered],
                completion_ids=[list(s.completion_token_ids or ()) for s in ordered],
                behaviour_logprobs=[list(s.behaviour_logprobs or ()) for s in ordered],
                loss_mask=[list(s.loss_mask or ()) for s in ordered],
                advantages=[float(a) for a in advantages],
                token_credit=None
                if credit is None
                else [[c * scale for c in row] for row, scale in zip(credit, scales, strict=True)],
            )
        )
    return steps


def _span_credit(ordered: Sequence[Sample], tokenizer: Any | None, spread: float | None) -> list[list[float]] | None:
    """Per sample, its credited spans' credit per completion token over ``spread`` (at least
    :data:`MIN_SPAN_SPREAD`; empty for a sample without spans); None when no sample has any, or without a tokenizer
    or a spread to scale them by."""
    if tokenizer is None or spread is None or not any(s.agent is not None and s.agent.spans for s in ordered):
        return None
    scale = max(spread, MIN_SPAN_SPREAD)
    return [
        [c / scale for c in token_credit(tokenizer, s.completion_token_ids or (), s.agent.spans)]
        if s.agent is not None and s.agent.spans
        else []
        for s in ordered
    ]


def unit_weights(units: Sequence[Sequence[Sample]]) -> list[float]:
    """Per unit, the mean policy tokens (loss mask ones) of the units that have any, over its own: a unit's
    tokens then carry as much of a token-mean loss as any other's. A unit with no policy token gets 0 (it
    trains nothing either way)."""
    tokens = [sum(sum(sample.loss_mask or ()) for sample in unit) for unit in units]
    counted = [n for n in tokens if n > 0]
    if not counted:
        return [0.0] * len(units)
    mean = sum(counted) / len(counted)
    return [mean / n if n > 0 else 0.0 for n in tokens]
