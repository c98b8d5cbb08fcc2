"""Sample intake: what the learner admits for training, and how admitted samples are packed into batches.

:class:`Intake` drops, and counts, every sample the learner must not train on. It checks in this order,
and the first reason that applies is the one counted:

1. ``private``: the sample's session was in privacy mode. The distiller never emits these; this is the
   re-check, first so that no other reason can hide a privacy breach from its counter.
2. ``duplicate``: a sample with this ``sample_id`` was already admitted (a re-delivery or a replay).
   Before staleness, so that a re-delivered sample counts as the duplicate it is even after the base moved.
3. ``held_out``: the sample is in the evaluation split (:class:`distill.samples.HeldOutRule`) the gate
   scores candidates on.
4. ``stale``: ``base_policy_version - policy_version > max_staleness``: its behaviour policy is too far
   behind for truncated importance weights to correct.
5. ``frozen``: a frozen agent's turn (a sub-agent whose outputs are the orchestrator's environment). Its
   loss mask is all zeros by contract; dropped by name so that no code path can train it by mistake.
6. ``no_tokens``: no prompt tokens, completion tokens or behaviour logprobs, or no 1 in its loss mask:
   there is nothing to train on.

Only admitted samples are remembered as seen, so the seen set is exactly what was (or will be) trained on.
It is kept bounded (:func:`recent_seen`): a sample too old to pass the staleness check needs no remembering,
since a re-delivery of it is dropped as ``stale`` instead.

Batches are packed from *units* (:func:`training_units`): the samples of one agent trajectory (sharing
``agent.trajectory_id``) are one unit, a single-turn sample is its own. A unit is never split across
batches, so a trajectory's turns take one optimiser step together and share one advantage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from uuid import UUID

from distill.samples import HeldOutRule, Sample
from learner.metrics import DROP_REASONS, SAMPLES_ACCEPTED, SAMPLES_DROPPED


class Intake:
    """Admits samples for training, or drops them with a reason; counts both here and in Prometheus.

    ``base_policy_version`` is the learner's current policy version: set it when a checkpoint is written.
    ``seen_sample_ids`` are samples already trained on (from the last manifest), so a restarted learner
    drops their re-delivery. ``counts`` holds one entry per drop reason plus ``"accepted"``.
    """

    def __init__(
        self,
        base_policy_version: int,
        max_staleness: int,
        seen_sample_ids: Iterable[str] = (),
        held_out: HeldOutRule | None = None,
    ) -> None:
        if base_policy_version < 0:
            raise ValueError(f"base_policy_version {base_policy_version} must be >= 0")
        if max_staleness < 0:
            raise ValueError(f"max_staleness {max_staleness} must be >= 0; 0 trains on the current policy only")
        self.base_policy_version = base_policy_version
        self.max_staleness = max_staleness
        # The evaluation gate estimates rewards on this split (the manifest records it): training on it
        # would let a candidate be judged on samples it learned from. None: no split (tests).
        self.held_out = held_out
        self._seen: set[str] = set(seen_sample_ids)
        self.counts: dict[str, int] = dict.fromkeys((*DROP_REASONS, "accepted"), 0)

    def reason_to_drop(self, sample: Sample) -> str | None:
        """Why ``sample`` must not be trained on, or ``None``; counts and remembers nothing."""
        if sample.privacy_mode:
            return "private"
        if sample.sample_id in self._seen:
            return "duplicate"
        if self.held_out is not None and self.held_out.holds_out_sample(sample):
            return "held_out"
        if self.base_policy_version - sample.policy_version > self.max_staleness:
            return "stale"
        if sample.agent is not None and sample.agent.frozen:
            return "frozen"
        if (
            not sample.prompt_token_ids
            or not sample.completion_token_ids
            or not sample.behaviour_logprobs
            or not sample.loss_mask
            or 1 not in sample.loss_mask
        ):
            return "no_tokens"
        return None

    def admit(self, sample: Sample) -> str | None:
        """``None`` if the sample is accepted (and now counts as seen), else the reason it was dropped."""
        reason = self.reason_to_drop(sample)
        if reason is None:
            self._seen.add(sample.sample_id)
            self.counts["accepted"] += 1
            SAMPLES_ACCEPTED.inc()
        else:
            self.counts[reason] += 1
            SAMPLES_DROPPED.labels(reason=reason).inc()
        return reason

    def seen(self, sample_id: str) -> bool:
        """Whether ``sample_id`` was admitted (or given as already trained on)."""
        return sample_id in self._seen


def sample_tokens(sample: Sample) -> int:
    """The tokens a sample puts through the model: its prompt plus its completion."""
    return len(sample.prompt_token_ids or ()) + len(sample.completion_token_ids or ())


def training_units(samples: Sequence[Sample]) -> list[list[Sample]]:
    """Group ``samples`` into units: an agent trajectory's samples (by ``agent.trajectory_id``) together, a
    single-turn sample alone; units in the order of their first sample, samples in their given order.

    A trajectory's samples come from different partitions of the samples topic (keyed by sample id), so
    they need not be adjacent in (partition, offset) order; grouping them here keeps them one unit anyway.
    """
    units: list[list[Sample]] = []
    trajectories: dict[UUID, list[Sample]] = {}
    for sample in samples:
        if sample.agent is None:
            units.append([sample])
        elif (unit := trajectories.get(sample.agent.trajectory_id)) is not None:
            unit.append(sample)
        else:
            trajectories[sample.agent.trajectory_id] = unit = [sample]
            units.append(unit)
    return units


def pack_batches(samples: Sequence[Sample], token_budget: int) -> list[list[Sample]]:
    """Split ``samples`` into batches of whole :func:`training_units`, in order, whose :func:`sample_tokens`
    sum to at most ``token_budget``.

    A batch is closed when the next unit would overflow it. A single unit over the budget (one long sample,
    or a trajectory with many turns) becomes a batch on its own rather than being dropped or split: intake
    already decided it is trainable, dropping it here would lose it silently, and splitting a trajectory
    would give it several optimiser steps and several advantages (the engine may still refuse it, and then
    says so).
    """
    if token_budget < 1:
        raise ValueError(f"token_budget {token_budget} must be >= 1")
    batches: list[list[Sample]] = []
    current: list[Sample] = []
    used = 0
    for unit in training_units(samples):
        size = sum(sample_tokens(sample) for sample in unit)
        if current and used + size > token_budget:
            batches.append(current)
            current, used = [], 0
        current.extend(unit)
        used += size
    if current:
        batches.append(current)
    return batches


def recent_seen(sample_ids: Sequence[str], policy_versions: Sequence[int], oldest: int) -> tuple[list[str], list[int]]:
    """The seen samples (ids and their policy versions, in order) whose policy version is at least ``oldest``.

    Call it with ``oldest = base_policy_version - max_staleness`` of the next cycle: a forgotten sample is
    stale for that base and every later one, so a re-delivery of it is still never trained on. Without this,
    the seen set (and every state file) would grow with every sample the learner ever trained on.
    An id without a version (a state written before versions were kept) counts as recent.
    """
    versions = list(policy_versions) + [oldest] * (len(sample_ids) - len(policy_versions))
    kept = [(sample_id, version) for sample_id, version in zip(sample_ids, versions, strict=True) if version >= oldest]
    return [sample_id for sample_id, _ in kept], [version for _, version in kept]
