"""A short `liveloop demo` end to end: real services, every component, simulated users, a report.

The cadence is compressed further than the default demo (a checkpoint every 50 s), so that a run of
four minutes trains, evaluates and promotes at least one checkpoint. (Three minutes gave the gate three
candidates judged on 20-70 held-out samples each; in two of three runs here it rejected all three on
the width of the confidence interval, though they learned; four minutes with a tenth held out once
rejected all four, the later ones on their effective sample size, so the demo holds out a fifth.)
Everything listens on free ports and lives in a temporary state folder, purged at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port

REPORT_KEYS = {
    "seed",
    "profile",
    "minutes",
    "base_version",
    "final_champion",
    "versions",
    "checkpoints",
    "gate_decisions",
    "promotions",
    "counts",
    "leaks",
    "verdict",
}
VERSION_KEYS = {
    "policy_version",
    "requests",
    "acceptance_rate",
    "acceptance_ci95",
    "mean_reward",
    "invalid_tool_call_rate",
    "deferral_rate",
    "distinct_share",
    "well_formed_share",
}


LIVELOOP = str(Path(sys.executable).with_name("liveloop"))


def _liveloop(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LIVELOOP, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(1200)
def test_a_short_demo_trains_evaluates_promotes_and_reports(tmp_path: Path) -> None:
    state, report_dir = tmp_path / "state", tmp_path / "report"
    env = dict(os.environ, LIVELOOP_INFRA_STATE_DIR=str(state))
    for name in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "POSTGRES_PORT", "MLFLOW_PORT"):
        env[f"LIVELOOP_INFRA_{name}"] = str(free_port())
    for name in ("INGEST_PORT", "DISTILL_WEB_PORT", "LEARNER_STATUS_PORT", "SERVING_PORT"):
        env[f"LIVELOOP_{name}"] = str(free_port())
    env.update(LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S="50", LIVELOOP_SIMULATOR_DRAIN_S="20")
    args = ["demo", "--minutes", "4", "--seed", "3", "--report", str(report_dir), "--state-dir", str(state)]
    try:
        run = _liveloop(args, env, timeout=1100)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    finally:
        _liveloop(["down", "--purge"], env, timeout=300)

    report = json.loads((report_dir / "report.json").read_text())
    assert set(report) >= REPORT_KEYS
    assert (report["seed"], report["profile"], report["minutes"], report["base_version"]) == (3, "semicolons", 4.0, 1)
    assert report["versions"], "the simulator recorded no requests"
    assert all(set(version) >= VERSION_KEYS for version in report["versions"])
    assert report["versions"][0]["policy_version"] == 0  # the base served first
    assert report["checkpoints"], "the learner wrote no checkpoint"
    assert report["gate_decisions"], "the gate evaluated nothing"
    promoted = [p for p in report["promotions"] if p["action"] == "promote" and p["from"] is not None]
    assert promoted, f"nothing was promoted: {report['gate_decisions']}"
    assert promoted[0]["actor"] == "gate"
    assert report["counts"]["events"] > 0
    assert report["counts"]["samples"] > 0
    assert report["leaks"] == {}, report["leaks"]  # no planted secret, no private session stored anywhere
    assert (report_dir / "report.md").read_text().startswith("# liveloop demo")
    assert (report_dir / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not state.exists()
