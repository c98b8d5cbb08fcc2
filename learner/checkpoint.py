"""Writing a checkpoint folder: consolidated safetensors (or the LoRA adapter), tokenizer, manifest, rename.

The folder is assembled as ``<data_dir>/checkpoints/.tmp-<id>/`` and renamed to ``<id>/`` only when every
file and the manifest are on disk and fsynced, so no reader (serving, the publisher, a restarted learner)
ever sees half a checkpoint. Publishing (:mod:`learner.publish`) comes after the rename.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from distill.samples import HeldOutRule, HeldOutSettings
from learner.manifest import (
    BASE_POLICY_VERSION,
    CheckpointManifest,
    OffsetRange,
    RewardStats,
    config_hash,
    hash_folder,
    now_utc,
    write_manifest,
)
from learner.settings import LearnerSettings, PausePoint
from learner.shaping import ShapingRecord
from learner.state import DataDir, StateError, commit_folder

log = logging.getLogger(__name__)


def checkpoint_id_for(model_name: str, policy_version: int) -> str:
    """``<model_name>-v<policy_version:05d>``, lower-cased (the manifest's id pattern)."""
    return f"{model_name}-v{policy_version:05d}".lower()


def next_policy_version(last_policy_version: int, registry_newest: int) -> int:
    """The version of the checkpoint written next: its parent's plus one, or the registry's newest version
    of the model plus one if that is higher, so that it is the number MLflow will assign when the
    checkpoint is registered (MLflow numbers a model's versions 1, 2, 3... in the order they are registered)."""
    return max(last_policy_version + 1, registry_newest + 1)


def code_version() -> str:
    """The liveloop package version that wrote a checkpoint."""
    try:
        return f"liveloop {importlib.metadata.version('liveloop')}"
    except importlib.metadata.PackageNotFoundError:
        return "liveloop (not installed)"


def pause_if(settings: LearnerSettings, point: PausePoint) -> None:
    """Test hook: at ``settings.pause_at`` write ``<data_dir>/paused-<point>`` and sleep until killed."""
    if settings.pause_at != point or point == "none":
        return
    marker = settings.data_dir / f"paused-{point}"
    marker.write_text(str(time.time()), encoding="utf-8")
    log.warning("paused at %s for a fault-injection test; kill this process", point)
    while True:
        time.sleep(3600)


@dataclass
class CycleRecord:
    """What a cycle (the rounds since the last checkpoint) trained on, for the next manifest."""

    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)
    sample_ids: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    spec_hashes: set[str] = field(default_factory=set)
    metric_sums: dict[str, float] = field(default_factory=dict)
    steps: int = 0

    def add_ranges(self, ranges: Sequence[OffsetRange]) -> None:
        """Extend the cycle's range per partition (rounds are contiguous, so first..last stays one range)."""
        for r in ranges:
            first, _ = self.ranges.get(r.partition, (r.first_offset, r.last_offset))
            self.ranges[r.partition] = (first, r.last_offset)

    def add_metrics(self, metrics: Mapping[str, float]) -> None:
        """Accumulate one step's metrics (averaged over the cycle's steps in the manifest)."""
        self.steps += 1
        for key, value in metrics.items():
            self.metric_sums[key] = self.metric_sums.get(key, 0.0) + value

    def reward_stats(self) -> RewardStats:
        """Count, mean, population std, min and max of the cycle's rewards."""
        if not self.rewards:
            return RewardStats(count=0)
        return RewardStats(
            count=len(self.rewards),
            mean=statistics.fmean(self.rewards),
            std=statistics.pstdev(self.rewards),
            min=min(self.rewards),
            max=max(self.rewards),
        )

    def training_metrics(self) -> dict[str, float]:
        """Mean of each step metric over the cycle."""
        return {key: value / self.steps for key, value in sorted(self.metric_sums.items())} if self.steps else {}


def base_tokenizer(base_model: str) -> Any | None:
    """The base model's tokenizer (the byte-level one for ``"tiny"``), or None for a weights-only folder."""
    if base_model == "tiny":
        from learner.tiny_model import byte_tokenizer

        return byte_tokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(base_model)
    except (OSError, ValueError) as exc:  # a weights-only base folder: serving brings its own tokenizer
        log.warning("%s has no tokenizer (%s)", base_model, exc)
        return None


def save_tokenizer(base_model: str, folder: Path) -> None:
    """Save the base model's tokenizer beside the weights, so the folder loads on its own (none for a weights-only
    base folder: serving brings its own)."""
    tokenizer = base_tokenizer(base_model)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def build_manifest(
    *,
    settings: LearnerSettings,
    base_label: str,
    checkpoint_id: str,
    parent_id: str | None,
    policy_version: int,
    step: int,
    cycle: CycleRecord,
    positions: Mapping[int, int],
    files: dict[str, str],
    held_out: HeldOutRule,
    reference_id: str | None = None,
    rebased_from: str | None = None,
) -> CheckpointManifest:
    """The manifest of a checkpoint written now; ``held_out`` is the split the learner's intake skipped,
    ``parent_id`` the checkpoint its weights descend from, ``reference_id`` its cycle's KL reference and
    ``rebased_from`` the checkpoint a rebase left (see :mod:`learner.lineage`)."""
    # The split decides which samples train, so it belongs in the hashed config as well as in its own field.
    training_config = {**settings.training_config(), "held_out": held_out.model_dump()}
    return CheckpointManifest(
        checkpoint_id=checkpoint_id,
        parent_id=parent_id,
        model_name=settings.model_name,
        base_model=base_label,
        policy_version=policy_version,
        format="lora" if settings.lora else "full",
        step=step,
        sample_count=len(cycle.sample_ids),
        consumed=[
            OffsetRange(topic=settings.samples_topic, partition=p, first_offset=first, last_offset=last)
            for p, (first, last) in sorted(cycle.ranges.items())
        ],
        positions={settings.samples_topic: dict(sorted(positions.items()))},
        reward=cycle.reward_stats(),
        spec_hashes=sorted(cycle.spec_hashes),
        training_config=training_config,
        training_metrics=cycle.training_metrics(),
        training_config_hash=config_hash(training_config),
        code_version=code_version(),
        files=files,
        created_at=now_utc(),
        held_out=held_out,
        reference_id=reference_id,
        rebased_from=rebased_from,
        shaping=ShapingRecord.at_step(settings.shaping(), step),
    )


def check_lineage_held_out(newest: CheckpointManifest, held_out: HeldOutRule) -> None:
    """Refuse to continue a lineage that trained under another held-out split than ``held_out``.

    A checkpoint's weights hold everything its ancestors trained on, so a lineage that skipped one split and
    then moved to another has trained on part of the new one, which its later manifests could not show: the
    gate would score it on samples it learned from. The base (no parent) trained on nothing, and a schema 1
    manifest recorded no rule, so neither is checked.
    """
    if newest.parent_id is None or newest.held_out is None or newest.held_out == held_out:
        return
    raise StateError(
        f"checkpoint {newest.checkpoint_id} was trained with held-out split {newest.held_out.describe()}, but this "
        f"learner skips {held_out.describe()}; set LIVELOOP_HELD_OUT_PERCENT={newest.held_out.percent} again, "
        "or start a new lineage (another model name) under the new split"
    )


def write_checkpoint_folder(
    data: DataDir,
    checkpoint_id: str,
    save_weights: Any,
    settings: LearnerSettings,
    manifest_for: Any,
) -> Path:
    """Assemble the checkpoint in a temporary folder, then rename it into place; return the final folder.

    ``save_weights(folder)`` writes the safetensors; ``manifest_for(files)`` builds the manifest from the
    hashed files. The ``mid_checkpoint`` pause sits between the complete temporary folder and the rename.
    """
    temporary = data.temp_checkpoint(checkpoint_id)
    if temporary.exists():
        shutil.rmtree(temporary)
    temporary.mkdir(parents=True)
    save_weights(temporary)
    save_tokenizer(settings.base_model, temporary)
    write_manifest(temporary, manifest_for(hash_folder(temporary)))
    pause_if(settings, "mid_checkpoint")
    final = data.checkpoint(checkpoint_id)
    commit_folder(temporary, final)
    return final


def write_base_checkpoint(
    data_dir: Path, model_name: str, source: Path | None = None, held_out: HeldOutRule | None = None
) -> Path:
    """Write the base model, version 1, as ``<data_dir>/checkpoints/<model_name>-v00001/``: the tiny Llama
    (``source`` None) or a copy of the Hugging Face folder ``source``, with its manifest, which records
    ``held_out`` (default: the deployment's :class:`distill.samples.HeldOutSettings`). Idempotent: an
    existing, verified base folder is returned as it is."""
    from learner.engine import base_model_label
    from learner.manifest import verify_checkpoint
    from learner.tiny_model import save_tiny_model

    data = DataDir(data_dir)
    data.make()
    checkpoint_id = checkpoint_id_for(model_name, BASE_POLICY_VERSION)
    final = data.checkpoint(checkpoint_id)
    if final.exists():
        verify_checkpoint(final)
        return final
    temporary = data.temp_checkpoint(checkpoint_id)
    if temporary.exists():
        shutil.rmtree(temporary)
    if source is None:
        save_tiny_model(temporary)
        label = base_model_label("tiny")
    else:
        shutil.copytree(source, temporary, ignore=shutil.ignore_patterns("liveloop-manifest.json", ".*"))
        label = base_model_label(str(source))
    training_config: dict[str, Any] = {}
    manifest = CheckpointManifest(
        checkpoint_id=checkpoint_id,
        model_name=model_name,
        base_model=label,
        policy_version=BASE_POLICY_VERSION,
        step=0,
        sample_count=0,
        training_config=training_config,
        training_config_hash=config_hash(training_config),
        code_version=code_version(),
        files=hash_folder(temporary),
        created_at=now_utc(),
        held_out=held_out if held_out is not None else HeldOutSettings().rule(),
    )
    write_manifest(temporary, manifest)
    commit_folder(temporary, final)
    return final
