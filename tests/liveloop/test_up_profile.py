"""`liveloop up --profile fast`: the loop on a base model at the demo's cadence, on a team's own traffic
(issue 37, point 6). No demo: the stack is started by the public command, the traffic comes from the
simulator's public pieces through the ingest SDK and the gateway, and a checkpoint is announced within
the learner's cadence. Everything listens on free ports and lives in a temporary state folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from liveloop.demo.simulator.runner import Simulation
from liveloop.demo.simulator.settings import SimulatorSettings
from tests.conftest import WHOLE_LOOP, free_port

LIVELOOP = str(Path(sys.executable).with_name("liveloop"))
INTERVAL_S = 60  # the learner's cadence in this test (the profile's is 120 s)


def _run(args: list[str], env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LIVELOOP, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _status(env: dict[str, str]) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(_run(["status", "--json"], env).stdout)
    return result


@WHOLE_LOOP
@pytest.mark.timeout(1500)
def test_up_with_the_fast_profile_learns_a_checkpoint_within_its_cadence(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = dict(os.environ, LIVELOOP_INFRA_STATE_DIR=str(state))
    ports = {
        name: free_port()
        for name in ("INGEST_PORT", "DISTILL_WEB_PORT", "LEARNER_STATUS_PORT", "SERVING_PORT", "DASHBOARD_PORT")
    }
    for name in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "POSTGRES_PORT", "MLFLOW_PORT"):
        env[f"LIVELOOP_INFRA_{name}"] = str(free_port())
    env.update({f"LIVELOOP_{name}": str(port) for name, port in ports.items()})
    # A shorter cadence than the profile's, and a checkpoint once 16 samples trained, so that a minute of
    # traffic is enough; every other setting (lr, rounds, held-out share, the gate's policy) is the profile's.
    env.update(
        LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S=str(INTERVAL_S),
        LIVELOOP_LEARNER_MIN_SAMPLES="16",
        LIVELOOP_LEARNER_ROUND_SAMPLES="16",
    )
    try:
        up = _run(["up", "--profile", "fast"], env, timeout=900)
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:]
        assert "profile fast" in up.stdout
        policy = json.loads((state / "fast-gate-policy.json").read_text())
        assert (policy["version"], policy["auto_promote"]) == ("fast-2", True)
        before = _status(env)
        assert before["models"]["champion"]["version"] == 1  # the tiny base, registered by `up`
        assert before["components"]["learner"]["details"]["policy_version"] == 1

        simulator = SimulatorSettings(
            gateway_url=f"http://127.0.0.1:{ports['SERVING_PORT']}/v1",
            credentials_path=state / "credentials.json",
            ingest_url=f"http://127.0.0.1:{ports['INGEST_PORT']}",
            bootstrap=before["services"]["kafka"]["address"],
            sdk_journal_dir=tmp_path / "journal",
            minutes=1.5,
            session_rate=2.0,
            drain_s=20.0,
            seed=5,
        )
        simulation = Simulation(simulator)
        simulation.start()
        traffic_started = time.monotonic()
        try:
            # The first samples arrive once sessions end; a checkpoint is due one interval after the
            # learner started, and then waits for its minimum of samples. Allow the traffic's length and
            # two intervals on a busy 2-core machine.
            deadline = traffic_started + simulator.minutes * 60 + 2 * INTERVAL_S + 60
            learner: dict[str, Any] = {}
            while time.monotonic() < deadline:
                learner = _status(env)["components"]["learner"].get("details") or {}
                if learner.get("policy_version", 0) >= 2 and not learner.get("unpublished"):
                    break
                time.sleep(5)
        finally:
            simulation.stop()
            summary = simulation.finish()
        assert learner.get("policy_version", 0) >= 2, f"no checkpoint announced: {learner}, {summary.model_dump()}"
        assert learner["last_checkpoint_id"].endswith("-v00002")  # the base is version 1
    finally:
        down = _run(["down", "--purge"], env, timeout=300)
    assert down.returncode == 0, down.stdout + down.stderr
    assert not state.exists()
