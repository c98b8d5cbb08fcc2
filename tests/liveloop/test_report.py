"""The demo report as a typed model: one version number per checkpoint in report.json, report.md and the plot."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from liveloop.demo.plot import move_label
from liveloop.demo.report import (
    Checkpoint,
    Counts,
    DemoReport,
    GateDecision,
    LeakScan,
    Promotion,
    SimulatorStats,
    VersionResult,
    markdown,
    verdict,
    write_report,
)
from liveloop.demo.simulator.stats import wilson_interval
from liveloop.demo.simulator.summary import Recorder

STARTED = datetime(2026, 1, 1, tzinfo=UTC)


def _version(version: int, requests: int, accepted: int) -> VersionResult:
    return VersionResult(
        version=version,
        requests=requests,
        accepted=accepted,
        acceptance_rate=accepted / requests,
        acceptance_ci95=wilson_interval(accepted, requests),
        preferred=accepted,
        invalid_tool_calls=0,
        invalid_tool_call_rate=0.0,
        mean_reward=0.5,
        deferral_rate=0.1,
        samples=requests,
    )


def _promotion(to: int, start: int, minute: int) -> Promotion:
    at = STARTED + timedelta(minutes=minute)
    return Promotion(action="promote", from_version=start, to_version=to, actor="gate", reason="passed", at=at)


def _report(base: int) -> DemoReport:
    versions = [_version(base, 400, 160), _version(base + 1, 300, 150), _version(base + 2, 400, 320)]
    # The base's own promotion (from nothing) and two by the gate; the last one served nobody yet.
    promotions = [
        Promotion(action="promote", from_version=None, to_version=base, actor="init", reason="base", at=STARTED),
        _promotion(base + 1, base, 2),
        _promotion(base + 2, base + 1, 4),
        _promotion(base + 3, base + 2, 6),
    ]
    return DemoReport(
        seed=3,
        profile="semicolons",
        minutes=8.0,
        base_version=base,
        final_champion=base + 3,
        versions=versions,
        checkpoints=[Checkpoint(version=base + i, created_at=STARTED + timedelta(minutes=2 * i)) for i in (1, 2, 3)],
        gate_decisions=[GateDecision(version=base + 1, decision="promote", reasons=["pass: ok"], metrics={"n": 40})],
        promotions=promotions,
        counts=Counts(events=10, samples=5, dead_letters=1),
        simulator=SimulatorStats(
            sessions=4,
            requests=1100,
            request_errors=0,
            privacy_sessions=1,
            planted_secrets=2,
            malformed_sent=1,
            malformed_dead_lettered=1,
        ),
        leaks=LeakScan(secrets=2, privacy_sessions=1, found={}),
        verdict=verdict(versions, promotions, base),
    )


@pytest.mark.parametrize("base", [0, 1])
def test_the_verdict_judges_the_newest_served_promotion_against_the_base_whatever_its_number(base: int) -> None:
    report = _report(base)
    judged = report.verdict.comparison
    assert judged is not None
    assert judged.judged_version == base + 2  # base + 3 was promoted but served no request
    assert (judged.base_acceptance, judged.final_acceptance, judged.acceptance_gain_points) == (0.4, 0.8, 40.0)
    assert judged.intervals_separate
    assert report.verdict.improved
    assert report.verdict.promotions == 3


def test_without_a_served_promotion_the_verdict_says_why() -> None:
    versions = [_version(1, 100, 40)]
    result = verdict(versions, [_promotion(2, 1, 1)], base_version=1)
    assert (result.improved, result.comparison, result.why) == (False, None, "no promoted checkpoint served requests")


def test_report_json_round_trips_and_every_file_speaks_of_one_version_number(tmp_path: Path) -> None:
    report = _report(1)
    recorder = Recorder(bucket_s=60)
    for version, at_s in ((1, 10.0), (2, 130.0), (3, 250.0)):
        recorder.served(
            at_s,
            version,
            f"g{version}",
            accepted=True,
            preferred=True,
            invalid_tools=0,
            privacy=False,
            completion=" 1;",
            well_formed=True,
        )
    summary = recorder.summary("run", 3, {"semicolons": 1.0}, STARTED, 300.0)

    json_path, md_path, png_path = write_report(report, summary, tmp_path)

    assert DemoReport.model_validate_json(json_path.read_text(encoding="utf-8")) == report
    assert "policy_version" not in json_path.read_text(encoding="utf-8")
    assert "model_version" not in json_path.read_text(encoding="utf-8")
    text = md_path.read_text(encoding="utf-8")
    assert text.startswith("# liveloop demo")
    assert "policy version" not in text
    assert "model version" not in text
    assert "| version | requests |" in text
    assert "Base champion: version 1; final champion: version 4." in text
    assert "(version 3, the newest promoted one that served requests)" in text
    assert "- version 2: **promote** (pass: ok)" in text
    assert "promote 2 → 3 by gate" in text
    assert "nothing found." in text
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert move_label("promote", 3) == "promote -> v3"


def test_a_leak_is_named_in_report_md() -> None:
    report = _report(1).model_copy(update={"leaks": LeakScan(secrets=2, privacy_sessions=1, found={"kafka:x": 2})})
    assert "FOUND in kafka:x (2)." in markdown(report)
