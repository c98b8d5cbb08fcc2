"""One running stack per folder, found by every command (issue 37, points 4 and 5).

A stack started under another state folder of the folder (as ``liveloop demo --keep-running`` does,
in ``.liveloop/demo``) is what ``liveloop status`` reports, with its champion, candidate and last gate
decision; ``liveloop up`` refuses to start a second one; ``liveloop down`` stops it; and none of them
writes a credential file with keys the running stack does not know.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import mlflow
import psycopg
import pytest

from infra.active import STATE_DIR_ENV, mark_running, marker_path
from infra.registry import CANDIDATE, CHAMPION, Registry
from infra.stack import Stack
from tests.conftest import WHOLE_LOOP, stack_settings

LIVELOOP = str(Path(sys.executable).with_name("liveloop"))
MODEL = "liveloop-policy"  # serving's default model name, which `status` reads


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LIVELOOP, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180, check=False)


def _register_version(stack: Stack, tmp: Path) -> int:
    folder = tmp / f"ckpt-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"weights")
    mlflow.set_tracking_uri(stack.endpoints.mlflow_url)
    mlflow.set_experiment("test-folder-stack")
    with mlflow.start_run() as run:
        mlflow.log_artifacts(str(folder), artifact_path="checkpoint")
    return Registry(stack.endpoints.mlflow_url).register_folder(MODEL, run.info.run_id, "checkpoint")


def _record_history(dsn: str) -> None:
    """Version 1 (the base) promoted by init-base; version 2 a candidate the gate rejected."""
    with psycopg.connect(dsn) as conn:
        for version, parent in ((1, None), (2, "ckpt-1")):
            conn.execute(
                "INSERT INTO checkpoints (checkpoint_id, parent_id, policy_version, base_model, sample_count, manifest,"
                " model_name, model_version) VALUES (%s, %s, %s, 'tiny', 0, '{}'::jsonb, %s, %s)",
                (f"ckpt-{version}", parent, version - 1, MODEL, version),
            )
        conn.execute(
            "INSERT INTO promotions (model_name, action, from_version, to_version, actor, reason) "
            "VALUES (%s, 'promote', NULL, 1, 'liveloop learner init-base', 'base model: the first champion')",
            (MODEL,),
        )
        conn.execute(
            "INSERT INTO evaluations (evaluation_id, checkpoint_id, champion_version, metrics, decision, reasons) "
            "VALUES (%s, 'ckpt-2', 1, '{}'::jsonb, 'reject', %s::jsonb)",
            (uuid.uuid4(), json.dumps(["FAIL kl 0.9 > 0.5", "ok reward"])),
        )


@WHOLE_LOOP
@pytest.mark.timeout(600)
def test_every_command_finds_the_folders_running_stack_and_none_mints_keys(tmp_path: Path) -> None:
    folder = tmp_path / "project"
    folder.mkdir()
    settings = stack_settings(folder / ".liveloop" / "demo")
    env = {key: value for key, value in os.environ.items() if key != STATE_DIR_ENV}
    for name in ("kafka_port", "kafka_controller_port", "postgres_port", "mlflow_port"):
        env[f"LIVELOOP_INFRA_{name.upper()}"] = str(getattr(settings, name))
    default_credentials = folder / ".liveloop" / "credentials.json"
    demo = Stack(settings)
    try:
        # What `liveloop demo --keep-running` leaves behind: its services up, from its own state folder.
        demo.up()
        mark_running(settings, "liveloop demo", folder=folder)
        registry = Registry(demo.endpoints.mlflow_url)
        registry.set_alias(MODEL, CHAMPION, _register_version(demo, tmp_path))
        registry.set_alias(MODEL, CANDIDATE, _register_version(demo, tmp_path))
        _record_history(demo.endpoints.dsn())

        status = _run(["status", "--json"], folder, env)
        report = json.loads(status.stdout)
        assert report["state_dir"] == str(settings.state_dir.resolve())
        # PostgreSQL answers only to the demo's own password: status used the demo's keys.
        assert {name: s["healthy"] for name, s in report["services"].items()} == {
            "kafka": True, "postgres": True, "mlflow": True,
        }  # fmt: skip
        models = report["models"]
        assert models["errors"] == []
        assert models["champion"] == {
            "version": 1,
            "checkpoint_id": "ckpt-1",
            "action": "promote",
            "actor": "liveloop learner init-base",
            "reason": "base model: the first champion",
            "since": models["champion"]["since"],
        }
        assert models["candidate"] == {"version": 2, "checkpoint_id": "ckpt-2"}
        decision = models["last_decision"]
        assert (decision["version"], decision["checkpoint_id"], decision["decision"]) == (2, "ckpt-2", "reject")
        assert decision["reasons"] == ["FAIL kl 0.9 > 0.5", "ok reward"]
        human = _run(["status"], folder, {**env, "COLUMNS": "250"}).stdout  # Rich wraps at the terminal's width
        assert "base model: the first champion" in human, human
        assert "reject at" in human, human
        assert "FAIL kl 0.9" in human, human
        assert not default_credentials.exists()

        up = _run(["up"], folder, env)
        assert up.returncode == 1, up.stdout + up.stderr
        lines = [line for line in (up.stdout + up.stderr).splitlines() if line.strip()]
        assert len(lines) == 1, lines
        assert str(settings.state_dir.resolve()) in lines[0]
        assert "liveloop down" in lines[0]
        assert not default_credentials.exists()

        down = _run(["down"], folder, env)
        assert down.returncode == 0, down.stdout + down.stderr
        assert all(name in down.stdout for name in ("kafka", "postgres", "mlflow")), down.stdout
        assert not marker_path(folder).exists()
        assert not demo.kafka_healthy()
        assert not demo.mlflow_healthy()
        after = json.loads(_run(["status", "--json"], folder, env).stdout)
        assert after["models"]["champion"] is None
        assert not default_credentials.exists()
    finally:
        demo.purge()
