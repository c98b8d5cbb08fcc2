"""The checkpoint contract: the manifest written beside every checkpoint's weights, and the
announcement the learner publishes on the ``liveloop.checkpoints`` topic.

Owned by the learner, imported by serving (hot-swap, the evaluation gate). Light on purpose: no torch,
no MLflow, so that a reader can check a checkpoint folder without loading a model.

Decisions a reader must know:

- ``policy_version`` is the one number that names a checkpoint everywhere: it *is* the checkpoint's
  MLflow model version. The base model is version 1 (:data:`BASE_POLICY_VERSION`), MLflow version 1 of a
  fresh registered model; each later checkpoint takes its parent's number plus one, or the registry's
  newest version plus one if that is higher (:mod:`learner.checkpoint`), so that it equals the version
  MLflow assigns when the checkpoint is registered; publishing refuses a checkpoint whose registered version
  differs (:mod:`learner.publish`). It is what serving reports with every completion, what samples carry
  (so staleness is a subtraction), what ``liveloop promote N`` takes and what the promotion history shows.
- ``positions`` are the *next* offsets to read, per partition of the samples topic, after this
  checkpoint: a restarted learner seeks there, never to a committed group offset that may run ahead.
  ``consumed`` are the offset ranges this checkpoint itself read (inclusive); across a lineage they
  are contiguous and never overlap.
- ``files`` maps each file of the folder (relative, ``/``-separated), except the manifest itself,
  to its sha256; :func:`verify_checkpoint` refuses a folder with a missing, extra or changed file.
- ``held_out`` is the evaluation split (:class:`distill.samples.HeldOutRule`) the lineage never trained
  on, so the gate can refuse a candidate judged under another split. Schema 1 manifests (written before
  it was recorded) still read, with ``held_out`` None; the gate refuses such a candidate.
- ``parent_id`` is the checkpoint whose weights this one was trained from: the learner's previous
  checkpoint, or, after a *rebase* (:mod:`learner.lineage`: its newest checkpoint was rejected, or the
  champion moved off its line), the champion it started again from; ``rebased_from`` then names the
  checkpoint it left. ``reference_id`` is the KL reference the cycle trained against (the champion when
  the cycle started). Schema 3 added both; older manifests read with them None.
- ``shaping`` is the annealed schedule of agent samples' shaping terms (:mod:`learner.shaping`) and the
  coefficients it had reached at the checkpoint's ``step``, so the gate and an auditor can see how much of
  the training signal was shaping rather than the performance the gate judges. Schema 4 added it; older
  manifests, and the base (which trained on nothing), read with it None.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from distill.samples import HeldOutRule
from learner.errors import LearnerError
from learner.shaping import ShapingRecord

MANIFEST_FILE = "liveloop-manifest.json"
"""The manifest's name inside a checkpoint folder."""

MANIFEST_SCHEMA_VERSION = 4
"""4 added ``shaping``, 3 ``reference_id`` and ``rebased_from``, 2 ``held_out``; 1 to 3 are still read."""

BASE_POLICY_VERSION = 1
"""The base model's version: MLflow version 1 of its registered model, so the two numbers are one."""

_HEX_64 = r"^[0-9a-f]{64}$"
_CHECKPOINT_ID = r"^[a-z0-9][a-z0-9._-]{0,127}$"
# Registered model names travel inside MLflow filter strings: letters, digits, '.', '_' and '-' only.
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class ManifestError(LearnerError):
    """A checkpoint folder or announcement is not what its manifest says; do not load it."""


class OffsetRange(BaseModel):
    """Offsets ``first..last`` (inclusive) of one partition of the samples topic."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str
    partition: int = Field(ge=0)
    first_offset: int = Field(ge=0)
    last_offset: int = Field(ge=0)


class RewardStats(BaseModel):
    """Reward statistics of the samples a checkpoint trained on."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    count: int = Field(ge=0)
    mean: float = 0.0
    std: float = Field(default=0.0, ge=0)
    min: float = 0.0
    max: float = 0.0


class CheckpointManifest(BaseModel):
    """What a checkpoint is, where it came from and exactly which data made it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schema_version: int = Field(default=MANIFEST_SCHEMA_VERSION, ge=1)
    checkpoint_id: str = Field(pattern=_CHECKPOINT_ID)
    parent_id: str | None = Field(default=None, description="The checkpoint this one was trained from.")
    model_name: str = Field(pattern=MODEL_NAME_PATTERN, description="The MLflow registered model of this lineage.")
    base_model: str = Field(
        min_length=1, description="What the lineage's base (version 1) was: a folder or 'tiny-llama:<hash>'."
    )
    policy_version: int = Field(ge=0, description="The checkpoint's version, which is also its MLflow model version.")
    format: Literal["full", "lora"] = "full"
    step: int = Field(ge=0, description="Optimizer steps taken in the whole lineage, this checkpoint included.")
    sample_count: int = Field(ge=0)
    consumed: list[OffsetRange] = Field(default_factory=list)
    positions: dict[str, dict[int, int]] = Field(
        default_factory=dict, description="topic -> partition -> next offset to read after this checkpoint."
    )
    reward: RewardStats = Field(default_factory=lambda: RewardStats(count=0))
    spec_hashes: list[str] = Field(default_factory=list, description="Reward spec hashes of the samples.")
    training_config: dict[str, Any] = Field(default_factory=dict)
    training_metrics: dict[str, float] = Field(
        default_factory=dict, description="Means over the cycle's steps: loss, kl, mean_weight, truncated_fraction..."
    )
    training_config_hash: str = Field(pattern=_HEX_64)
    code_version: str = Field(min_length=1)
    files: dict[str, str] = Field(min_length=1, description="relative path -> sha256 of every weight/config file.")
    created_at: AwareDatetime
    held_out: HeldOutRule | None = Field(
        default=None, description="The held-out split never trained on; None only in schema 1 manifests."
    )
    reference_id: str | None = Field(
        default=None,
        pattern=_CHECKPOINT_ID,
        description="The KL reference's checkpoint (the champion when the cycle started); None for the base.",
    )
    rebased_from: str | None = Field(
        default=None,
        pattern=_CHECKPOINT_ID,
        description="The checkpoint the learner left to start again from parent_id (the champion), or None.",
    )
    shaping: ShapingRecord | None = Field(
        default=None,
        description="The shaping schedule of agent samples and its coefficients at this step; None before schema 4 "
        "and for the base.",
    )

    @model_validator(mode="after")
    def _held_out_recorded(self) -> CheckpointManifest:
        if self.schema_version >= 2 and self.held_out is None:
            raise ValueError(
                f"a schema {self.schema_version} manifest records its held_out rule (distill.samples.HeldOutRule)"
            )
        return self


class CheckpointAnnouncement(BaseModel):
    """The value on the checkpoints topic (key: checkpoint id): a registered candidate to evaluate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint_id: str = Field(pattern=_CHECKPOINT_ID)
    policy_version: int = Field(ge=0, description="The checkpoint's version; equal to model_version.")
    parent_id: str | None = None
    model_name: str = Field(pattern=MODEL_NAME_PATTERN)
    model_version: int = Field(
        ge=1, description="The MLflow model version holding the folder: the same number as policy_version."
    )
    run_id: str = Field(description="The MLflow run that logged the training metrics and artifacts.")
    sample_count: int = Field(ge=0)
    manifest_sha256: str = Field(pattern=_HEX_64)
    announced_at: AwareDatetime


def config_hash(config: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of a training config (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """sha256 of a file's bytes, read in chunks so that large weight files do not fill memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def hash_folder(folder: Path) -> dict[str, str]:
    """relative path -> sha256 of every file under ``folder``, the manifest excepted."""
    return {
        path.relative_to(folder).as_posix(): sha256_file(path)
        for path in sorted(folder.rglob("*"))
        if path.is_file() and path.name != MANIFEST_FILE
    }


def manifest_bytes(manifest: CheckpointManifest) -> bytes:
    """The manifest's canonical JSON bytes (what :attr:`CheckpointAnnouncement.manifest_sha256` hashes)."""
    return manifest.model_dump_json(indent=2).encode()


def write_manifest(folder: Path, manifest: CheckpointManifest) -> Path:
    """Write the manifest into ``folder`` durably (temporary file, fsync, rename)."""
    target = folder / MANIFEST_FILE
    temporary = folder / f".{MANIFEST_FILE}.tmp"
    with temporary.open("wb") as handle:
        handle.write(manifest_bytes(manifest))
        handle.flush()
        os.fsync(handle.fileno())
    temporary.replace(target)
    return target


def read_manifest(folder: Path) -> CheckpointManifest:
    """Read and validate the manifest of a checkpoint folder; ManifestError says what is wrong."""
    path = folder / MANIFEST_FILE
    try:
        return CheckpointManifest.model_validate_json(path.read_bytes())
    except FileNotFoundError as exc:
        raise ManifestError(f"{folder} has no {MANIFEST_FILE}; it is not a liveloop checkpoint") from exc
    except ValidationError as exc:
        raise ManifestError(f"{path} is not a valid manifest: {exc}") from exc


def verify_checkpoint(folder: Path) -> CheckpointManifest:
    """Read the manifest and check every file's sha256 against it; raise ManifestError on any mismatch."""
    manifest = read_manifest(folder)
    actual = hash_folder(folder)
    problems = [f"{name}: missing" for name in sorted(manifest.files.keys() - actual.keys())]
    problems += [f"{name}: not in the manifest" for name in sorted(actual.keys() - manifest.files.keys())]
    problems += [
        f"{name}: sha256 {actual[name][:12]}… but the manifest says {digest[:12]}…"
        for name, digest in sorted(manifest.files.items())
        if name in actual and actual[name] != digest
    ]
    if problems:
        raise ManifestError(
            f"checkpoint {manifest.checkpoint_id} in {folder} fails verification: " + "; ".join(problems)
        )
    return manifest


def now_utc() -> datetime:
    """The current time, timezone-aware UTC (manifests and announcements never hold naive times)."""
    return datetime.now(UTC)
