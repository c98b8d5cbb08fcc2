"""The model registry on the real MLflow server: versions from run artifact folders, aliases as state.

This is how the learner publishes checkpoints and how serving finds the champion, so the round trip
(register a folder, move ``champion``, fetch the files back by alias) must work against the server.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import mlflow
import pytest

from infra.registry import CHAMPION, AliasNotSet, Registry
from infra.stack import Endpoints


def _log_checkpoint(tracking_uri: str, tmp: Path, weights: bytes) -> str:
    folder = tmp / f"ckpt-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "manifest.json").write_text(f'{{"id": "{folder.name}"}}', encoding="utf-8")
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment(f"test-registry-{uuid.uuid4().hex[:6]}")
    with mlflow.start_run() as run:
        mlflow.log_metric("loss", 0.5)
        mlflow.log_artifacts(str(folder), artifact_path="checkpoint")
    return str(run.info.run_id)


def test_register_folder_move_champion_and_load_by_alias(endpoints: Endpoints, tmp_path: Path) -> None:
    registry = Registry(endpoints.mlflow_url)
    name = f"test-model-{uuid.uuid4().hex[:8]}"

    run1 = _log_checkpoint(endpoints.mlflow_url, tmp_path, b"weights-one")
    v1 = registry.register_folder(name, run1, "checkpoint")
    with pytest.raises(AliasNotSet):
        registry.version_by_alias(name, CHAMPION)
    registry.set_alias(name, CHAMPION, v1)

    run2 = _log_checkpoint(endpoints.mlflow_url, tmp_path, b"weights-two")
    v2 = registry.register_folder(name, run2, "checkpoint")
    assert (v1, v2) == (1, 2)
    assert int(registry.version_by_alias(name, CHAMPION).version) == 1

    registry.set_alias(name, CHAMPION, v2)
    champion = registry.version_by_alias(name, CHAMPION)
    assert int(champion.version) == 2
    assert champion.run_id == run2

    files = registry.download(name, int(champion.version), tmp_path / "download")
    assert (files / "model.safetensors").read_bytes() == b"weights-two"
    assert (files / "manifest.json").exists()

    # Rollback is one alias move back.
    registry.set_alias(name, CHAMPION, v1)
    again = registry.download(name, int(registry.version_by_alias(name, CHAMPION).version), tmp_path / "back")
    assert (again / "model.safetensors").read_bytes() == b"weights-one"
