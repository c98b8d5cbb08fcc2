"""The demo's quiet console: MLflow's printed run links, library log lines and progress bars go to the log file."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from infra.stack import Endpoints
from liveloop.demo.quiet import QUIET_ENVIRONMENT, library_output_to


def test_library_output_goes_to_the_log_file_not_the_console(
    endpoints: Endpoints, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key in QUIET_ENVIRONMENT:
        monkeypatch.delenv(key, raising=False)  # restored after the test: the block sets them for good
    log_file = tmp_path / "logs" / "demo.log"
    artifact = tmp_path / "artifact.txt"
    artifact.write_text("weights\n", encoding="utf-8")
    client = MlflowClient(tracking_uri=endpoints.mlflow_url)
    handlers = logging.getLogger().handlers[:]
    with library_output_to(log_file):
        experiment = client.create_experiment(f"quiet-{uuid.uuid4().hex}")
        run = client.create_run(experiment)
        client.log_artifact(run.info.run_id, str(artifact))
        client.set_terminated(run.info.run_id)  # MLflow prints "View run ... at: http://..." here by default
        logging.getLogger("mlflow.store").warning("a library warning")
        logging.getLogger("urllib3.connectionpool").info("a library info line")
    console = "".join(capfd.readouterr())
    for chatter in ("View run", "View experiment", "a library warning", "a library info line"):
        assert chatter not in console, console
    logged = log_file.read_text(encoding="utf-8")
    assert "WARNING mlflow.store: a library warning" in logged
    assert "INFO urllib3.connectionpool: a library info line" in logged
    # The logging set-up is the caller's again after the block.
    assert logging.getLogger().handlers == handlers
