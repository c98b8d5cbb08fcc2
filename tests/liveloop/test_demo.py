"""A short `liveloop demo` end to end: real services, every component, simulated users, a report.

The cadence is compressed further than the default demo (a checkpoint every 50 s), so that a run of
four minutes trains, evaluates and promotes at least one checkpoint. (Three minutes gave the gate three
candidates judged on 20-70 held-out samples each; in two of three runs here it rejected all three on
the width of the confidence interval, though they learned; four minutes with a tenth held out once
rejected all four, the later ones on their effective sample size, so the demo holds out a fifth.)
Everything listens on free ports and lives in a temporary state folder, purged at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from liveloop.demo.report import DemoReport
from tests.conftest import free_port

# Library chatter that must stay off the demo's console (it goes to <state>/logs/demo.log): MLflow's run
# links, log lines, Python warnings and tqdm progress bars.
CHATTER = ("View run", "View experiment", " INFO ", "WARNING", "Warning:", "it/s]", "%|", "█")


LIVELOOP = str(Path(sys.executable).with_name("liveloop"))


def _liveloop(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LIVELOOP, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.timeout(1200)
def test_a_short_demo_trains_evaluates_promotes_and_reports(tmp_path: Path) -> None:
    state, report_dir = tmp_path / "state", tmp_path / "report"
    env = dict(os.environ, LIVELOOP_INFRA_STATE_DIR=str(state))
    for name in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "POSTGRES_PORT", "MLFLOW_PORT"):
        env[f"LIVELOOP_INFRA_{name}"] = str(free_port())
    for name in ("INGEST_PORT", "DISTILL_WEB_PORT", "LEARNER_STATUS_PORT", "SERVING_PORT", "DASHBOARD_PORT"):
        env[f"LIVELOOP_{name}"] = str(free_port())
    env.update(LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S="50", LIVELOOP_SIMULATOR_DRAIN_S="20")
    args = ["demo", "--minutes", "4", "--seed", "3", "--report", str(report_dir), "--state-dir", str(state)]
    try:
        run = _liveloop(args, env, timeout=1100)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    finally:
        _liveloop(["down", "--purge"], env, timeout=300)

    console = run.stdout + run.stderr
    assert "1/4" in console
    assert "4/4" in console
    for chatter in CHATTER:
        assert chatter not in console, f"{chatter!r} on the console:\n{console[-4000:]}"
    report = DemoReport.model_validate_json((report_dir / "report.json").read_text())
    assert (report.seed, report.profile, report.minutes, report.base_version) == (3, "semicolons", 4.0, 1)
    assert report.versions, "the simulator recorded no requests"
    assert report.checkpoints, "the learner wrote no checkpoint"
    assert report.gate_decisions, "the gate evaluated nothing"
    promoted = [p for p in report.promotions if p.action == "promote" and p.from_version is not None]
    assert promoted, f"nothing was promoted: {report.gate_decisions}"
    assert promoted[0].actor == "gate"
    assert report.counts.events > 0
    assert report.counts.samples > 0
    assert report.leaks.found == {}, report.leaks  # no planted secret, no private session stored anywhere
    assert (report_dir / "report.md").read_text().startswith("# liveloop demo")
    assert (report_dir / "acceptance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not state.exists()
    # One number per checkpoint: the base served first, under the version MLflow registered it as, and
    # every promotion moved the alias to a checkpoint's version.
    assert report.versions[0].version == report.base_version
    assert {p.to_version for p in promoted} <= {c.version for c in report.checkpoints}
