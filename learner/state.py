"""The learner's private training state, kept beside each published checkpoint, and the data folder layout.

``<data_dir>/state/<checkpoint_id>/`` holds the DeepSpeed checkpoint (weights, optimizer, step; one file
per rank) and ``learner-state.json`` (:class:`TrainingState`: step, policy version, reward baseline,
the sample ids already trained, the positions after the checkpoint, the samples of the checkpoint).
Like the published folder it is written under a temporary name and renamed, and it is renamed *before*
the published folder: a published checkpoint always has its state. A state folder newer than the
newest published checkpoint is an orphan of a crash mid-checkpoint and is deleted at start.
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime
from pathlib import Path

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from learner.errors import LearnerError
from learner.manifest import BASE_POLICY_VERSION, MANIFEST_FILE, CheckpointManifest, read_manifest
from learner.trajectories import HeldTrajectory

STATE_FILE = "learner-state.json"
TEMP_PREFIX = ".tmp-"


class StateError(LearnerError):
    """The data folder is inconsistent (a checkpoint without its state); the message says what to remove."""


class TrainingState(BaseModel):
    """Everything besides the engine's tensors that a resumed learner needs to continue exactly."""

    model_config = ConfigDict(extra="forbid")

    checkpoint_id: str
    policy_version: int = Field(ge=0)
    step: int = Field(ge=0, description="Optimizer steps in the lineage.")
    round: int = Field(ge=0, description="Rounds in the lineage.")
    positions: dict[int, int] = Field(description="samples-topic partition -> next offset after the checkpoint.")
    baseline: dict[str, float]
    seen_sample_ids: list[str] = Field(
        description="The samples the lineage trained on that a re-delivery could still bring back (intake drops "
        "repeats); older ones are forgotten at each checkpoint (see learner.intake.recent_seen)."
    )
    seen_policy_versions: list[int] = Field(
        default_factory=list,
        description="The policy version of each of seen_sample_ids, in order (missing in older states: recent).",
    )
    checkpoint_sample_ids: list[str] = Field(description="The samples of this checkpoint, for re-publishing.")
    checkpointed_at: AwareDatetime
    reference_id: str | None = Field(
        default=None,
        description="The KL reference of the next cycle (the champion when this checkpoint was written); None in "
        "older states: the checkpoint itself.",
    )
    held_trajectories: list[HeldTrajectory] = Field(
        default_factory=list,
        description="Agent trajectories admitted but not trained yet, waiting for their other turns (their offsets "
        "lie behind the positions, so they live here); empty in older states.",
    )


class DataDir:
    """The folder layout under ``data_dir``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state = root / "state"
        self.checkpoints = root / "checkpoints"
        self.published = root / "published"

    def make(self) -> None:
        """Create the folders."""
        for folder in (self.state, self.checkpoints, self.published):
            folder.mkdir(parents=True, exist_ok=True)

    def checkpoint(self, checkpoint_id: str) -> Path:
        return self.checkpoints / checkpoint_id

    def temp_checkpoint(self, checkpoint_id: str) -> Path:
        return self.checkpoints / f"{TEMP_PREFIX}{checkpoint_id}"

    def state_of(self, checkpoint_id: str) -> Path:
        return self.state / checkpoint_id

    def temp_state(self, checkpoint_id: str) -> Path:
        return self.state / f"{TEMP_PREFIX}{checkpoint_id}"

    def published_marker(self, checkpoint_id: str) -> Path:
        return self.published / checkpoint_id

    def remove_temporaries(self) -> list[Path]:
        """Delete every half-written folder (``.tmp-*``); return what was deleted."""
        removed = []
        for parent in (self.state, self.checkpoints):
            for path in sorted(parent.glob(f"{TEMP_PREFIX}*")):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
                removed.append(path)
        return removed

    def newest_checkpoint(self, model_name: str) -> CheckpointManifest | None:
        """The manifest of the newest complete checkpoint of ``model_name`` (by policy version)."""
        found = [
            read_manifest(folder)
            for folder in self.checkpoints.iterdir()
            if folder.is_dir() and not folder.name.startswith(TEMP_PREFIX) and (folder / MANIFEST_FILE).is_file()
        ]
        ours = [m for m in found if m.model_name == model_name]
        return max(ours, key=lambda m: m.policy_version, default=None)

    def remove_orphan_states(self, newest_policy_version: int, newest_id: str | None) -> list[Path]:
        """Delete state folders of checkpoints that were never published as folders (newer than the newest)."""
        removed = []
        for folder in sorted(self.state.iterdir()):
            if folder.name.startswith(TEMP_PREFIX) or folder.name == newest_id:
                continue
            state_file = folder / STATE_FILE
            version = read_state(folder).policy_version if state_file.is_file() else None
            if version is None or version > newest_policy_version:
                shutil.rmtree(folder)
                removed.append(folder)
        return removed


def fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder`` and the folders themselves, so a rename publishes durable bytes."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
    fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    """fsync a directory (makes a rename inside it durable)."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def commit_folder(temporary: Path, final: Path) -> None:
    """Make ``temporary`` durable and rename it to ``final`` in one step (no reader sees half of it)."""
    fsync_tree(temporary)
    if final.exists():
        raise StateError(f"{final} exists already; a checkpoint id is written once (remove it to write it again)")
    temporary.rename(final)
    fsync_dir(final.parent)


def write_state_file(folder: Path, state: TrainingState) -> None:
    """Write ``learner-state.json`` into a (temporary) state folder."""
    (folder / STATE_FILE).write_text(state.model_dump_json(indent=1), encoding="utf-8")


def read_state(folder: Path) -> TrainingState:
    """Read the ``learner-state.json`` of a state folder."""
    path = folder / STATE_FILE
    if not path.is_file():
        raise StateError(f"{folder} has no {STATE_FILE}; it is not a complete learner state folder")
    return TrainingState.model_validate_json(path.read_bytes())


def fresh_state(checkpoint_id: str, started_at: datetime) -> TrainingState:
    """The state of a lineage at its base model: nothing trained, positions from the earliest offsets."""
    return TrainingState(
        checkpoint_id=checkpoint_id,
        policy_version=BASE_POLICY_VERSION,
        step=0,
        round=0,
        positions={},
        baseline={},
        seen_sample_ids=[],
        checkpoint_sample_ids=[],
        checkpointed_at=started_at,
    )
