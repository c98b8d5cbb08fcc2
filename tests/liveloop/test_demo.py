"""A short `liveloop demo` end to end: real services, every component, simulated users, a report.

The cadence is compressed further than the default demo (a checkpoint every 50 s), so that a run of
four minutes trains, evaluates and promotes at least one checkpoint. (Three minutes gave the gate three
candidates judged on 20-70 held-out samples each; in two of three runs here it rejected all three on
the width of the confidence interval, though they learned; four minutes with a tenth held out once
rejected all four, the later ones on their effective sample size, so the demo holds out a fifth.)
Everything listens on free ports and lives in a temporary state folder, purged at the end.

The demo runs with ``--keep-running``, so that its data is audited as an auditor would (issue 41, "on a
demo's data"): ``audit checkpoint`` of the champion, ``audit session`` of a session it trained on,
``replay`` under the recorded spec and under one weight changed, and ``export`` read back by pandas; and
the console must say where the ops dashboard answers and how to sign in (issue 40).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pandas
import psycopg
import pytest
import yaml

from liveloop.demo.report import DemoReport, Promotion
from liveloop.store import audit_dsn
from tests.conftest import WHOLE_LOOP, free_port
from tests.distill.stream_harness import DEFAULT_SPEC_PATH

# Library chatter that must stay off the demo's console (it goes to <state>/logs/demo.log): MLflow's run
# links, log lines, Python warnings and tqdm progress bars.
CHATTER = ("View run", "View experiment", " INFO ", "WARNING", "Warning:", "it/s]", "%|", "█")


LIVELOOP = str(Path(sys.executable).with_name("liveloop"))


def _liveloop(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LIVELOOP, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)


@WHOLE_LOOP
@pytest.mark.timeout(1500)
def test_a_short_demo_trains_evaluates_promotes_and_reports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state, report_dir = tmp_path / "state", tmp_path / "report"
    env = dict(os.environ, LIVELOOP_INFRA_STATE_DIR=str(state))
    for name in ("KAFKA_PORT", "KAFKA_CONTROLLER_PORT", "POSTGRES_PORT", "MLFLOW_PORT"):
        env[f"LIVELOOP_INFRA_{name}"] = str(free_port())
    for name in ("INGEST_PORT", "DISTILL_WEB_PORT", "LEARNER_STATUS_PORT", "SERVING_PORT", "DASHBOARD_PORT"):
        env[f"LIVELOOP_{name}"] = str(free_port())
    env.update(LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S="50", LIVELOOP_SIMULATOR_DRAIN_S="20")
    args = ["demo", "--minutes", "4", "--seed", "3", "--report", str(report_dir), "--state-dir", str(state)]
    try:
        run = _liveloop([*args, "--keep-running"], env, timeout=1100)
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        dashboard = f"http://127.0.0.1:{env['LIVELOOP_DASHBOARD_PORT']}/"
        said = " ".join(run.stdout.split())  # the console wraps long lines at its width
        assert f"ops dashboard: {dashboard} ; sign in with operator_key (to act) or viewer_key" in said, said[-2000:]
        assert httpx.get(f"{dashboard}signin", timeout=30).status_code == 200
        for name in ("LIVELOOP_INFRA_STATE_DIR", "LIVELOOP_INFRA_POSTGRES_PORT"):
            monkeypatch.setenv(name, env[name])  # audit_dsn() below finds the demo's PostgreSQL as the CLI does
        report = DemoReport.model_validate_json((report_dir / "report.json").read_text())
        _audit(report, env, audit_dsn(), tmp_path / "audit")
    finally:
        _liveloop(["down", "--purge"], env, timeout=300)

    console = run.stdout + run.stderr
    assert "1/4" in console
    assert "4/4" in console
    for chatter in CHATTER:
        assert chatter not in console, f"{chatter!r} on the console:\n{console[-4000:]}"
    assert (report.seed, report.profile, report.minutes, report.base_version) == (3, "semicolons", 4.0, 1)
    assert report.versions, "the simulator recorded no requests"
    assert report.checkpoints, "the learner wrote no checkpoint"
    assert report.gate_decisions, "the gate evaluated nothing"
    promoted = _promotions(report)
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


def _promotions(report: DemoReport) -> list[Promotion]:
    """The checkpoints' promotions, oldest first (the base's registration as the first champion is not one)."""
    promoted = [p for p in report.promotions if p.action == "promote" and p.from_version is not None]
    assert promoted, f"nothing was promoted: {report.gate_decisions}"
    return promoted


def _settled(dsn: str) -> None:
    """Wait until the archive and the samples stop growing: the distiller finalises its last sessions after the
    simulator stops, and an audit of a range still being written would compare two moments."""
    last = None
    for _ in range(60):
        with psycopg.connect(dsn) as conn:
            now = conn.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM samples)").fetchone()
        if now == last:
            return
        last = now
        time.sleep(5)
    raise AssertionError(f"the demo's archive and samples kept growing: {last}")


def _audit(report: DemoReport, env: dict[str, str], dsn: str, out: Path) -> None:
    """The audit tools on the demo's own data (issue 41's acceptance)."""
    _settled(dsn)
    champion = _promotions(report)[-1].to_version
    day = datetime.now(UTC).date()
    span = ["--from", f"{day - timedelta(days=1)}", "--to", f"{day + timedelta(days=1)}"]

    audited = _liveloop(["audit", "checkpoint", str(champion), "--json"], env, timeout=300)
    assert audited.returncode == 0, audited.stderr[-2000:]
    lineage = json.loads(audited.stdout)
    # What it trained on is exactly what the learner's intake recorded for the manifest's offset ranges.
    assert lineage["offset_ranges"], lineage["checkpoint"]
    assert lineage["trained_samples"] == lineage["checkpoint"]["sample_count"] == lineage["samples"]["samples"] > 0
    assert lineage["trained_samples_not_stored"] == 0
    assert ("promote", "gate") in [(p["action"], p["actor"]) for p in lineage["promotions"]]
    with psycopg.connect(dsn) as conn:
        trained_session, checkpoint_id = conn.execute(
            "SELECT s.session_id, k.checkpoint_id FROM checkpoint_samples c JOIN samples s USING (sample_id) "
            "JOIN checkpoints k USING (checkpoint_id) WHERE k.policy_version = %s LIMIT 1",
            (champion,),
        ).fetchone() or (None, None)
        samples, accepted = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE (components->>'accepted')::float <> 0) FROM samples"
        ).fetchone() or (0, 0)
        events = (conn.execute("SELECT count(*) FROM events").fetchone() or (0,))[0]
    assert trained_session is not None
    session = _liveloop(["audit", "session", trained_session, "--json"], env, timeout=300)
    assert session.returncode == 0, session.stderr[-2000:]
    assert checkpoint_id in [c["checkpoint_id"] for c in json.loads(session.stdout)["checkpoints"]]

    replay = _liveloop(["replay", *span, "--out", str(out / "replay")], env, timeout=600)
    assert replay.returncode == 0, replay.stderr[-2000:]
    recorded = json.loads((out / "replay" / "report.json").read_text())
    assert recorded["no_differences"], recorded["counts"]
    assert recorded["counts"]["recorded"] == recorded["counts"]["identical"] == samples > 0

    document = yaml.safe_load(DEFAULT_SPEC_PATH.read_text())
    document["weights"]["accepted"] -= 0.25
    document["version"] = "demo-audit"
    (out / "spec.yaml").write_text(yaml.safe_dump(document))
    changed = _liveloop(["replay", *span, "--spec", str(out / "spec.yaml"), "--out", str(out / "changed")], env, 600)
    assert changed.returncode == 0, changed.stderr[-2000:]
    deltas = json.loads((out / "changed" / "report.json").read_text())["component_deltas"]
    assert accepted > 0
    assert deltas == {
        "accepted": {"changed": accepted, "total": pytest.approx(-0.25 * accepted), "mean": -0.25, "min": -0.25,
                     "max": -0.25}
    }  # fmt: skip

    exported = _liveloop(["export", *span, "--out", str(out / "export")], env, timeout=600)
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert len(pandas.read_parquet(out / "export" / "events")) == events
    assert len(pandas.read_parquet(out / "export" / "samples")) == samples
