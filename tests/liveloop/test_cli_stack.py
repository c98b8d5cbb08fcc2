"""`liveloop up`, `status --json` and `down` as a user runs them: real processes, nothing left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from distill.trajectory import GUARDS
from infra.processes import wait_until
from infra.settings import StackSettings
from infra.stack import Stack
from tests.conftest import WHOLE_LOOP, free_port

LIVELOOP = str(Path(sys.executable).with_name("liveloop"))


def _run(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LIVELOOP, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _processes_using(path: Path) -> list[str]:
    """Processes whose command line mentions ``path`` (the broker's config, MLflow's artifacts, the cluster)."""
    marker = str(path.resolve())
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if marker in cmdline:
            found.append(f"{proc.info['pid']}: {cmdline[:200]}")
    return found


@WHOLE_LOOP
@pytest.mark.timeout(900)
def test_up_status_down_leave_nothing_running(tmp_path: Path) -> None:
    state = tmp_path / "state"
    ports = {name: free_port() for name in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "POSTGRES_PORT", "MLFLOW_PORT")}
    env = dict(os.environ, LIVELOOP_INFRA_STATE_DIR=str(state))
    env.update({f"LIVELOOP_INFRA_{name}": str(port) for name, port in ports.items()})
    # The components listen too: keep them off the ports of a stack the developer may be running.
    env.update(
        LIVELOOP_INGEST_PORT=str(free_port()),
        LIVELOOP_DISTILL_WEB_PORT=str(free_port()),
        LIVELOOP_LEARNER_STATUS_PORT=str(free_port()),
        LIVELOOP_SERVING_PORT=str(free_port()),
        LIVELOOP_DASHBOARD_PORT=str(free_port()),
    )
    pids: list[int] = []
    try:
        up = _run(["up"], env, timeout=420)
        assert up.returncode == 0, up.stdout + up.stderr

        # `up` returns once every component answers its health check; the learner then still recovers
        # (reads its checkpoints, seeks the samples topic) before its /status reports a step.
        def learner_running() -> bool:
            answer = json.loads(_run(["status", "--json"], env).stdout or "{}")
            details = answer.get("components", {}).get("learner", {}).get("details") or {}
            return details.get("state") == "running"

        assert wait_until(learner_running, timeout_s=180), "the learner never reported that it runs"
        status = _run(["status", "--json"], env)
        assert status.returncode == 0, status.stdout + status.stderr
        report = json.loads(status.stdout)
        assert report["services"]["kafka"] == {
            "healthy": True, "address": f"127.0.0.1:{ports['KAFKA_PORT']}", "managed": True,
        }  # fmt: skip
        assert report["services"]["postgres"]["healthy"] is True
        dsn = report["services"]["postgres"]["dsn"]
        assert dsn.startswith("postgresql://liveloop:***@127.0.0.1:")
        assert report["services"]["mlflow"]["url"] == f"http://127.0.0.1:{ports['MLFLOW_PORT']}"
        assert report["services"]["mlflow"]["healthy"] is True
        components = report["components"]
        assert set(components) == {"ingest-api", "archiver", "distiller", "learner", "gate", "gateway", "dashboard"}
        assert all(c["healthy"] for c in components.values()), components
        assert all(c["restarts"] == 0 for c in components.values()), components
        learner = components["learner"]["details"]  # the learner's own /status
        assert (learner["state"], learner["step"], learner["policy_version"]) == ("running", 0, 1)
        assert learner["samples_since_checkpoint"] == 0
        assert "next_checkpoint_at" in learner
        assert learner["lag"] == {"0": 0, "1": 0, "2": 0}
        assert components["archiver"]["lag"] == 0
        # The distiller's /status: how many feedback events joined nothing, and generations had none.
        assert components["distiller"]["details"] == {
            "state": "running", "unjoined_feedback": 0, "generations_without_feedback": 0,
            "agent_guards": {"trajectories": 0, **dict.fromkeys(GUARDS, 0)},
        }  # fmt: skip
        pids = [c["pid"] for c in components.values()]
        # The password never reaches the status output.
        password = json.loads((state / "credentials.json").read_text())["postgres_password"]
        assert password not in status.stdout

        # A component that crashes is started again by its keeper.
        archiver = Stack(StackSettings(state_dir=state, **{k.lower(): v for k, v in ports.items()}))
        crashed = archiver.component_child_pid("archiver")
        assert crashed is not None
        os.kill(crashed, signal.SIGKILL)
        assert wait_until(lambda: archiver.component_child_pid("archiver") not in (None, crashed), timeout_s=30)
        restarted = json.loads(_run(["status", "--json"], env).stdout)["components"]["archiver"]
        assert restarted["restarts"] == 1

        # Idempotent: a second `up` finds everything running and starts nothing new.
        before = sorted(p.split(":")[0] for p in _processes_using(state))
        again = _run(["up"], env, timeout=420)
        assert again.returncode == 0, again.stdout + again.stderr
        assert sorted(p.split(":")[0] for p in _processes_using(state)) == before
    finally:
        down = _run(["down", "--purge"], env)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "kafka" in down.stdout
    assert "postgres" in down.stdout
    assert "mlflow" in down.stdout
    assert _processes_using(state) == []
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not state.exists()
    status = _run(["status", "--json"], env)
    assert status.returncode == 1
    assert not any(service["healthy"] for service in json.loads(status.stdout)["services"].values())


def test_a_missing_prerequisite_is_one_clear_line(tmp_path: Path) -> None:
    env = dict(
        os.environ,
        PATH=str(Path(sys.executable).parent),  # no java, no mvn
        LIVELOOP_INFRA_STATE_DIR=str(tmp_path / "state"),
        LIVELOOP_INFRA_CACHE_DIR=str(tmp_path / "cache"),
    )
    result = _run(["setup"], env, timeout=60)
    assert result.returncode == 1
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "java not found" in lines[0]
    assert "apt-get install openjdk-17-jre-headless" in lines[0]


def test_schema_export_writes_one_schema_per_event_type(tmp_path: Path) -> None:
    from ingest.events import EVENT_TYPES

    result = _run(["schema", "export", str(tmp_path / "schemas")], dict(os.environ), timeout=60)
    assert result.returncode == 0, result.stderr
    written = {Path(line).name for line in result.stdout.split()}
    assert written == {f"{t}.schema.json" for t in EVENT_TYPES} | {"event.schema.json"}
    generation = json.loads((tmp_path / "schemas" / "generation.schema.json").read_text())
    assert generation["properties"]["type"]["const"] == "generation"
