"""Test helpers: tiny checkpoint folders with manifests, registered in the real MLflow server.

Registration goes the way the brief describes for tests (run artifacts + ``Registry.register_folder``)
and deliberately does not verify the folder, so that tests can register broken checkpoints too.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import torch
from mlflow import MlflowClient

from distill.samples import HeldOutRule, HeldOutSettings
from infra.registry import CANDIDATE, Registry
from learner.manifest import CheckpointManifest, config_hash, hash_folder, now_utc, read_manifest, write_manifest
from learner.publish import announce, announcement_of
from learner.tiny_model import TinyModelSpec, build_tiny_model, byte_tokenizer


def write_checkpoint(
    folder: Path,
    *,
    model_name: str,
    policy_version: int,
    model: Any | None = None,
    seed: int = 0,
    parent_id: str | None = None,
    held_out: HeldOutRule | None = None,
) -> CheckpointManifest:
    """Save ``model`` (or a fresh tiny model from ``seed``) with tokenizer and a correct manifest, whose
    held-out rule is ``held_out`` (default: the deployment's, as the gate reads it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (model if model is not None else build_tiny_model(TinyModelSpec(seed=seed))).save_pretrained(
        folder, safe_serialization=True
    )
    byte_tokenizer().save_pretrained(folder)
    manifest = CheckpointManifest(
        checkpoint_id=f"ckpt-{policy_version}-{uuid.uuid4().hex[:8]}",
        parent_id=parent_id,
        model_name=model_name,
        base_model="tiny-llama:test",
        policy_version=policy_version,
        step=policy_version,
        sample_count=0,
        training_config={},
        training_config_hash=config_hash({}),
        code_version="test",
        files=hash_folder(folder),
        created_at=now_utc(),
        held_out=held_out if held_out is not None else HeldOutSettings().rule(),
    )
    write_manifest(folder, manifest)
    return manifest


def corrupt_manifest_hash(folder: Path, manifest: CheckpointManifest) -> None:
    """Rewrite the manifest so that it names a wrong sha256 for the weights file."""
    files = dict(manifest.files)
    files["model.safetensors"] = "0" * 64
    write_manifest(folder, manifest.model_copy(update={"files": files}))


def nan_model(seed: int = 0) -> Any:
    """A tiny model with a NaN in one weight."""
    model = build_tiny_model(TinyModelSpec(seed=seed))
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    return model


def register(mlflow_uri: str, folder: Path, model_name: str) -> int:
    """Log ``folder`` as artifacts of a new run and register it as a version of ``model_name``."""
    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name("liveloop-tests")
    experiment_id = experiment.experiment_id if experiment else client.create_experiment("liveloop-tests")
    run_id = client.create_run(experiment_id).info.run_id
    client.log_artifacts(run_id, str(folder), "checkpoint")
    client.set_terminated(run_id)
    return Registry(mlflow_uri).register_folder(model_name, run_id, "checkpoint")


def announce_candidate(mlflow_uri: str, bootstrap: str, topic: str, folder: Path, model_version: int) -> None:
    """What the learner does once it registered ``folder`` as ``model_version``: point the ``candidate``
    alias at it, then announce it on the checkpoints ``topic`` (``learner.publish``)."""
    manifest = read_manifest(folder)
    registry = Registry(mlflow_uri)
    registry.set_alias(manifest.model_name, CANDIDATE, model_version)
    run_id = registry.client.get_model_version(manifest.model_name, str(model_version)).run_id
    announce(bootstrap, topic, announcement_of(folder, manifest, model_version, run_id))
