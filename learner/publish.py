"""Publishing a written checkpoint: audit rows, an MLflow run and model version, the announcement.

A checkpoint folder is complete once it has been renamed into place (see :mod:`learner.checkpoint`);
publishing it then takes four steps, each idempotent, so that a learner that crashes anywhere between
them simply calls :func:`publish_checkpoint` again after its restart:

1. PostgreSQL: the ``checkpoints`` row, its ``checkpoint_offsets`` and ``checkpoint_samples``
   (``ON CONFLICT DO NOTHING``; a sample id that another checkpoint already holds is an error, because
   a sample must train one checkpoint at most).
2. MLflow: one run per checkpoint, found again by its ``liveloop.checkpoint_id`` tag, holding the
   training metrics and the folder as artifacts; the tag ``liveloop.artifacts`` = ``complete`` is set
   only after the upload, so a crash mid-upload uploads again.
3. The model version of that run (found again by ``run_id``), with alias ``candidate``. Its number must be
   the manifest's ``policy_version`` (the one number that names the checkpoint everywhere): publishing
   refuses to register when the registry already holds that number or a higher one, and fails when
   MLflow assigned another number (a version registered into the model by something else meanwhile).
4. The announcement on the checkpoints topic, keyed by checkpoint id. The gate dedupes on the id, so a
   repeated announcement after a crash is harmless.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from mlflow import MlflowClient
from mlflow.entities import RunStatus
from mlflow.exceptions import MlflowException

from infra.producers import reliable_producer
from infra.registry import CANDIDATE, CHAMPION, AliasNotSet, Registry, RegistryError
from learner.errors import LearnerError
from learner.manifest import (
    BASE_POLICY_VERSION,
    MANIFEST_FILE,
    CheckpointAnnouncement,
    CheckpointManifest,
    now_utc,
    verify_checkpoint,
)

EXPERIMENT = "liveloop-learner"
"""The MLflow experiment that holds one run per checkpoint."""

ARTIFACT_PATH = "checkpoint"
CHECKPOINT_TAG = "liveloop.checkpoint_id"
ARTIFACTS_TAG = "liveloop.artifacts"
VERSION_TAG = "liveloop.policy_version"
"""Tag on the run and the model version: the checkpoint's version (equal to the model version's number)."""


class PublishError(LearnerError):
    """A step of publishing failed; the checkpoint stays on disk and publishing is retried at the next start."""


def publish_checkpoint(
    folder: Path,
    *,
    dsn: str,
    mlflow_uri: str,
    bootstrap: str,
    checkpoints_topic: str,
    samples_topic: str,
    sample_ids: Sequence[str],
) -> CheckpointAnnouncement:
    """Record, register and announce the checkpoint in ``folder``; safe to call again after a crash."""
    manifest = verify_checkpoint(folder)
    strays = sorted({r.topic for r in manifest.consumed} - {samples_topic})
    if strays:
        raise PublishError(
            f"checkpoint {manifest.checkpoint_id} consumed {strays}, not the samples topic {samples_topic}"
        )
    record_checkpoint(dsn, manifest, sample_ids)
    client = MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    run_id = _log_run(client, folder, manifest)
    version = _register(Registry(mlflow_uri), manifest, run_id)
    try:
        client.set_registered_model_alias(manifest.model_name, CANDIDATE, str(version))
    except MlflowException as exc:
        raise PublishError(f"setting {manifest.model_name}@{CANDIDATE} -> version {version} failed: {exc}") from exc
    _record_version(dsn, manifest, version)
    announcement = announcement_of(folder, manifest, version, run_id)
    announce(bootstrap, checkpoints_topic, announcement)
    return announcement


def announcement_of(folder: Path, manifest: CheckpointManifest, version: int, run_id: str) -> CheckpointAnnouncement:
    """The announcement of the checkpoint in ``folder`` (``manifest``), registered as ``version`` by ``run_id``."""
    return CheckpointAnnouncement(
        checkpoint_id=manifest.checkpoint_id,
        policy_version=manifest.policy_version,
        parent_id=manifest.parent_id,
        model_name=manifest.model_name,
        model_version=version,
        run_id=run_id,
        sample_count=manifest.sample_count,
        manifest_sha256=hashlib.sha256((folder / MANIFEST_FILE).read_bytes()).hexdigest(),
        announced_at=now_utc(),
    )


def register_base(folder: Path, *, mlflow_uri: str, dsn: str, actor: str = "liveloop learner init-base") -> int:
    """Register the base model folder (version 1) as version 1 of its registered model and make it
    ``champion`` if the model has no champion yet; return its version. Idempotent; PublishError if the
    registered model already holds versions made elsewhere (the base must be its version 1)."""
    manifest = verify_checkpoint(folder)
    if manifest.policy_version != BASE_POLICY_VERSION:
        raise PublishError(
            f"{folder} holds version {manifest.policy_version}; a base model must be version {BASE_POLICY_VERSION}"
        )
    record_checkpoint(dsn, manifest, ())
    client = MlflowClient(tracking_uri=mlflow_uri, registry_uri=mlflow_uri)
    registry = Registry(mlflow_uri)
    version = _register(registry, manifest, _log_run(client, folder, manifest))
    _record_version(dsn, manifest, version)
    try:
        registry.version_by_alias(manifest.model_name, CHAMPION)
    except AliasNotSet:
        registry.set_alias(manifest.model_name, CHAMPION, version)
        with psycopg.connect(dsn) as conn:
            conn.execute(
                "INSERT INTO promotions (model_name, action, from_version, to_version, actor, reason) "
                "VALUES (%s, 'promote', NULL, %s, %s, %s)",
                (manifest.model_name, version, actor, "base model: the first champion"),
            )
    return version


def record_checkpoint(dsn: str, manifest: CheckpointManifest, sample_ids: Sequence[str]) -> None:
    """Write the checkpoint's audit rows in one transaction (a repeat writes nothing new)."""
    try:
        with psycopg.connect(dsn) as conn, conn.cursor() as cur:
            cur.execute(
                "INSERT INTO checkpoints (checkpoint_id, parent_id, policy_version, base_model, sample_count, "
                "manifest, model_name) VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s) "
                "ON CONFLICT (checkpoint_id) DO NOTHING",
                (
                    manifest.checkpoint_id,
                    manifest.parent_id,
                    manifest.policy_version,
                    manifest.base_model,
                    manifest.sample_count,
                    manifest.model_dump_json(),
                    manifest.model_name,
                ),
            )
            cur.executemany(
                "INSERT INTO checkpoint_offsets (checkpoint_id, topic, kafka_partition, first_offset, last_offset) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [
                    (manifest.checkpoint_id, r.topic, r.partition, r.first_offset, r.last_offset)
                    for r in manifest.consumed
                ],
            )
            cur.executemany(
                "INSERT INTO checkpoint_samples (checkpoint_id, sample_id) VALUES (%s, %s) "
                "ON CONFLICT (checkpoint_id, sample_id) DO NOTHING",
                [(manifest.checkpoint_id, sample_id) for sample_id in sample_ids],
            )
    except psycopg.errors.UniqueViolation as exc:
        raise PublishError(
            f"checkpoint {manifest.checkpoint_id}: a sample or policy version is already recorded for another "
            f"checkpoint ({exc.diag.message_detail}); a sample trains one checkpoint at most"
        ) from exc
    except psycopg.Error as exc:
        raise PublishError(f"recording checkpoint {manifest.checkpoint_id} in PostgreSQL failed: {exc}") from exc


def _record_version(dsn: str, manifest: CheckpointManifest, version: int) -> None:
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "UPDATE checkpoints SET model_version = %s WHERE checkpoint_id = %s",
            (version, manifest.checkpoint_id),
        )


def _log_run(client: MlflowClient, folder: Path, manifest: CheckpointManifest) -> str:
    """The checkpoint's MLflow run (created or found again) with its artifacts complete; its id."""
    try:
        experiment = client.get_experiment_by_name(EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{CHECKPOINT_TAG}` = '{manifest.checkpoint_id}'", max_results=1
        )
        if found:
            run_id: str = found[0].info.run_id
            if found[0].data.tags.get(ARTIFACTS_TAG) == "complete":
                return run_id
        else:
            run = client.create_run(
                experiment_id,
                run_name=manifest.checkpoint_id,
                tags={CHECKPOINT_TAG: manifest.checkpoint_id, VERSION_TAG: str(manifest.policy_version)},
            )
            run_id = run.info.run_id
            for key, metric in _metrics(manifest).items():
                client.log_metric(run_id, key, metric)
            for key, param in _params(manifest).items():
                client.log_param(run_id, key, param)
        client.log_artifacts(run_id, str(folder), ARTIFACT_PATH)
        client.set_tag(run_id, ARTIFACTS_TAG, "complete")
        client.set_terminated(run_id, RunStatus.to_string(RunStatus.FINISHED))
    except MlflowException as exc:
        raise PublishError(f"logging checkpoint {manifest.checkpoint_id} to MLflow failed: {exc}") from exc
    return run_id


def _register(registry: Registry, manifest: CheckpointManifest, run_id: str) -> int:
    """The model version of the run (registered now unless it already exists); PublishError unless its
    number is the manifest's policy version."""
    name, wanted = manifest.model_name, manifest.policy_version
    try:
        existing = list(registry.client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"))
    except MlflowException:
        existing = []  # the registered model does not exist yet
    if existing:  # published before a crash: the same run's version, checked again
        return _same_number(manifest, int(existing[0].version))
    try:
        newest = registry.newest_version(name)
        if newest >= wanted:  # refuse before registering: a version made now would take the wrong number
            raise PublishError(_mismatch(manifest, newest + 1))
        tags = {CHECKPOINT_TAG: manifest.checkpoint_id, VERSION_TAG: str(wanted)}
        return _same_number(manifest, registry.register_folder(name, run_id, ARTIFACT_PATH, tags=tags))
    except RegistryError as exc:
        raise PublishError(f"registering checkpoint {manifest.checkpoint_id} in MLflow failed: {exc}") from exc


def _same_number(manifest: CheckpointManifest, version: int) -> int:
    """``version``, if it is the manifest's policy version; PublishError otherwise."""
    if version != manifest.policy_version:
        raise PublishError(_mismatch(manifest, version))
    return version


def _mismatch(manifest: CheckpointManifest, version: int) -> str:
    return (
        f"checkpoint {manifest.checkpoint_id} is version {manifest.policy_version}, but MLflow gives it "
        f"{manifest.model_name} version {version}: something other than this learner registered versions of "
        f"{manifest.model_name} (only the learner may), and a checkpoint's version must be its MLflow version; "
        "set LIVELOOP_LEARNER_MODEL_NAME to a fresh registered model name"
    )


def _metrics(manifest: CheckpointManifest) -> dict[str, float]:
    reward = manifest.reward
    return {
        "sample_count": float(manifest.sample_count),
        "step": float(manifest.step),
        "policy_version": float(manifest.policy_version),
        "reward_mean": reward.mean,
        "reward_std": reward.std,
        "reward_min": reward.min,
        "reward_max": reward.max,
        **{f"train_{key}": float(value) for key, value in manifest.training_metrics.items()},
    }


def _params(manifest: CheckpointManifest) -> dict[str, str]:
    params: dict[str, Any] = {
        "checkpoint_id": manifest.checkpoint_id,
        "parent_id": manifest.parent_id or "",
        "base_model": manifest.base_model,
        "format": manifest.format,
        "training_config_hash": manifest.training_config_hash,
        "code_version": manifest.code_version,
    }
    params.update({f"config.{key}": value for key, value in manifest.training_config.items()})
    # MLflow caps a param value at 6000 characters; configs are flat and short, but be safe.
    return {
        key: json.dumps(value)[:6000] if not isinstance(value, str) else value[:6000] for key, value in params.items()
    }


def announce(bootstrap: str, topic: str, announcement: CheckpointAnnouncement) -> None:
    """Put ``announcement`` on the checkpoints ``topic``, keyed by checkpoint id; PublishError if it fails."""
    producer = reliable_producer(bootstrap)
    try:
        producer.send(
            topic, key=announcement.checkpoint_id.encode(), value=announcement.model_dump_json().encode()
        ).get(timeout=30)
        producer.flush()
    except Exception as exc:
        raise PublishError(f"announcing {announcement.checkpoint_id} on {topic} failed: {exc}") from exc
    finally:
        producer.close()
