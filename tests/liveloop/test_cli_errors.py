"""Every command fails the same way: one ``error:`` line on stderr and the code ``liveloop.exit_codes`` documents.

The first tests run the installed ``liveloop`` as a user does (a real process, real stderr); the last
ones drive a small Typer app built on the same boundary to reach the codes no command reaches cheaply.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from infra.credentials import ensure_credentials
from infra.errors import AccessRefused, ServiceStartError, ServiceUnavailable
from liveloop.exit_codes import (
    ACCESS_REFUSED,
    PROBLEM,
    UNAVAILABLE,
    UNEXPECTED,
    USAGE,
    LiveloopGroup,
)
from tests.conftest import free_port

LIVELOOP = str(Path(sys.executable).with_name("liveloop"))


def _run(args: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [LIVELOOP, *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False
    )


def _one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """A stack of its own: an empty state folder and free ports, so nothing found is another's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVELOOP_")}
    env["LIVELOOP_INFRA_STATE_DIR"] = str(tmp_path / "state")
    for name in ("INFRA_KAFKA_PORT", "INFRA_KAFKA_CONTROLLER_PORT", "INFRA_POSTGRES_PORT", "INFRA_MLFLOW_PORT"):
        env[f"LIVELOOP_{name}"] = str(free_port())
    for name in ("INGEST_PORT", "DISTILL_WEB_PORT", "LEARNER_STATUS_PORT", "SERVING_PORT", "DASHBOARD_PORT"):
        env[f"LIVELOOP_{name}"] = str(free_port())
    return env


def test_bad_settings_are_one_line_naming_each_variable_exit_2(cli_env: dict[str, str], tmp_path: Path) -> None:
    cli_env.update(LIVELOOP_INFRA_KAFKA_PORT="not-a-port", LIVELOOP_INFRA_STARTUP_TIMEOUT_S="0")
    result = _run(["status"], cli_env, tmp_path)
    assert result.returncode == USAGE, result.stderr
    line = _one_error_line(result.stderr)
    assert "LIVELOOP_INFRA_KAFKA_PORT" in line
    assert "LIVELOOP_INFRA_STARTUP_TIMEOUT_S" in line
    assert "not-a-port" not in line  # values are left out: a bad value may be a secret


def test_an_operator_command_with_a_wrong_key_is_one_line_exit_3(cli_env: dict[str, str], tmp_path: Path) -> None:
    credentials = tmp_path / "credentials.json"
    ensure_credentials(credentials)
    cli_env["LIVELOOP_OPERATOR_CREDENTIALS_PATH"] = str(credentials)
    result = _run(["promote", "2", "--reason", "try", "--key", "llok_wrong"], cli_env, tmp_path)
    assert result.returncode == ACCESS_REFUSED, result.stderr
    assert "operator key is wrong" in _one_error_line(result.stderr)
    result = _run(["rollback", "--reason", "try"], cli_env, tmp_path)
    assert result.returncode == USAGE, result.stderr
    assert "operator key is required" in _one_error_line(result.stderr)


def test_status_with_nothing_running_exits_1_without_a_traceback(cli_env: dict[str, str], tmp_path: Path) -> None:
    result = _run(["status", "--json"], cli_env, tmp_path)
    assert result.returncode == PROBLEM, result.stdout + result.stderr
    assert result.stderr.strip() == ""
    assert '"healthy": false' in result.stdout


# ------------------------------------------------------------------ the boundary itself, on a small app

probe = typer.Typer(cls=LiveloopGroup, add_completion=False)
RAISES: dict[str, Exception] = {
    "refused": AccessRefused("the key is wrong; use the right one"),
    "unavailable": ServiceUnavailable("cannot reach Kafka at 127.0.0.1:9; start it"),
    "failed": ServiceStartError("mlflow did not start; read mlflow.log"),
    "bug": ZeroDivisionError("division by zero"),
}


@probe.command()
def fail(kind: str) -> None:
    """Raise the error named ``kind``."""
    raise RAISES[kind]


@probe.command()
def usage(count: int) -> None:
    """Take an int, for Typer's own usage error."""


@pytest.mark.parametrize(
    ("kind", "code"), [("refused", ACCESS_REFUSED), ("unavailable", UNAVAILABLE), ("failed", PROBLEM)]
)
def test_each_kind_of_liveloop_error_gets_its_documented_code(kind: str, code: int) -> None:
    result = CliRunner().invoke(probe, ["fail", kind], env={"LIVELOOP_DEBUG": ""})
    assert result.exit_code == code, result.output
    assert _one_error_line(result.stderr) == f"error: {RAISES[kind]}"


def test_an_unexpected_error_is_one_line_exit_5_with_its_traceback_in_a_file() -> None:
    result = CliRunner().invoke(probe, ["fail", "bug"], env={"LIVELOOP_DEBUG": ""})
    assert result.exit_code == UNEXPECTED, result.output
    line = _one_error_line(result.stderr)
    assert line.startswith("error: unexpected ZeroDivisionError: division by zero")
    found = re.search(r"traceback in (\S+\.log)", line)
    assert found, line
    log = Path(found.group(1))
    try:
        assert "ZeroDivisionError" in log.read_text()
        assert "Traceback" in log.read_text()
    finally:
        log.unlink()


def test_liveloop_debug_prints_the_traceback() -> None:
    result = CliRunner().invoke(probe, ["fail", "failed"], env={"LIVELOOP_DEBUG": "1"})
    assert result.exit_code == PROBLEM
    assert result.stderr.startswith("error: mlflow did not start")
    assert "Traceback" in result.stderr


def test_typer_usage_errors_keep_exit_2() -> None:
    result = CliRunner().invoke(probe, ["usage", "many"])
    assert result.exit_code == USAGE
