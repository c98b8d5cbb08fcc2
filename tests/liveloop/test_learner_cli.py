"""``liveloop learner init-base``: the base model on disk with its manifest, registered as the first champion."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from infra.migrations import migrate
from infra.registry import CHAMPION, Registry
from infra.stack import Endpoints
from learner.manifest import verify_checkpoint
from liveloop.learner_cli import app


def test_init_base_writes_version_1_and_registers_it_as_champion_once(
    endpoints: Endpoints, fresh_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    migrate(fresh_database)
    monkeypatch.setenv("LIVELOOP_LEARNER_DSN", fresh_database)
    monkeypatch.setenv("LIVELOOP_LEARNER_MLFLOW_URI", endpoints.mlflow_url)
    args = ["init-base", "--tiny", "--model-name", "cli-base", "--data-dir", str(tmp_path)]
    runner = CliRunner()
    for _ in range(2):  # idempotent: the second run finds the folder and the registration
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    manifest = verify_checkpoint(tmp_path / "checkpoints" / "cli-base-v00001")
    assert (manifest.policy_version, manifest.parent_id, manifest.sample_count) == (1, None, 0)
    assert manifest.base_model.startswith("tiny-llama:")
    assert "model.safetensors" in manifest.files
    assert int(Registry(endpoints.mlflow_url).version_by_alias("cli-base", CHAMPION).version) == 1


def test_init_base_wants_exactly_one_source(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["init-base", "--data-dir", str(tmp_path), "--no-register"])
    assert result.exit_code == 2
    assert "exactly one of --tiny or --from" in result.output
