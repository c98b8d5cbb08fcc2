"""The one held-out rule: one setting with one set of bounds, one hash rule, recorded in every checkpoint manifest."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from distill.samples import (
    HELD_OUT_RULE_VERSION,
    HeldOutRule,
    HeldOutSettings,
    held_out_bucket,
    is_held_out,
    sample_id_for,
)

IDS = [sample_id_for(uuid.UUID(int=i), "ab" * 32) for i in range(300)]


def test_the_rule_is_the_bucket_below_the_share() -> None:
    rule = HeldOutRule(percent=20)
    assert rule.rule_version == HELD_OUT_RULE_VERSION
    assert (
        [rule.holds_out(i) for i in IDS] == [held_out_bucket(i) < 20 for i in IDS] == [is_held_out(i, 20) for i in IDS]
    )
    assert held_out_bucket("0000006f" + "0" * 24) == 11  # 0x6f = 111
    assert not any(HeldOutRule(percent=0).holds_out(i) for i in IDS)


def test_a_rule_of_another_version_is_not_computed_as_if_it_were_this_one() -> None:
    with pytest.raises(ValueError, match=f"rule version {HELD_OUT_RULE_VERSION + 1} .* this code computes"):
        HeldOutRule(percent=10, rule_version=HELD_OUT_RULE_VERSION + 1).holds_out(IDS[0])


def test_the_one_setting_is_read_from_its_one_variable_within_its_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HeldOutSettings().rule() == HeldOutRule(percent=10)
    monkeypatch.setenv("LIVELOOP_HELD_OUT_PERCENT", "20")
    assert HeldOutSettings().rule() == HeldOutRule(percent=20, rule_version=HELD_OUT_RULE_VERSION)
    for bad in ("51", "-1"):
        monkeypatch.setenv("LIVELOOP_HELD_OUT_PERCENT", bad)
        with pytest.raises(ValidationError, match="held_out_percent"):
            HeldOutSettings()
    with pytest.raises(ValidationError):
        HeldOutRule(percent=51)


@pytest.mark.parametrize("retired", ["LIVELOOP_LEARNER_HELD_OUT_PERCENT", "LIVELOOP_GATE_HELD_OUT_PERCENT"])
def test_the_retired_per_service_variables_are_refused_not_ignored(
    monkeypatch: pytest.MonkeyPatch, retired: str
) -> None:
    monkeypatch.setenv(retired, "20")
    with pytest.raises(ValidationError, match=f"{retired} no longer exist.*LIVELOOP_HELD_OUT_PERCENT"):
        HeldOutSettings()
