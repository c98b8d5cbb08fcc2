"""Intake drops private, duplicate, held-out, stale and token-less samples, counted exactly; batches fit the budget."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from distill.samples import HeldOutRule, is_held_out
from learner.intake import Intake, pack_batches, recent_seen, sample_tokens
from tests.learner.sample_factory import make_sample


def _prometheus() -> dict[str, float]:
    values = {
        reason: REGISTRY.get_sample_value("liveloop_learner_samples_dropped_total", {"reason": reason}) or 0.0
        for reason in ("private", "duplicate", "held_out", "stale", "frozen", "no_tokens")
    }
    values["accepted"] = REGISTRY.get_sample_value("liveloop_learner_samples_accepted_total") or 0.0
    return values


def test_each_drop_reason_is_counted_exactly() -> None:
    before = _prometheus()
    already_trained = make_sample(100)
    intake = Intake(base_policy_version=10, max_staleness=3, seen_sample_ids=[already_trained.sample_id])
    stream = [
        (make_sample(1, policy_version=10), None),
        (make_sample(2, policy_version=7), None),  # exactly max_staleness behind: still fresh
        (make_sample(3, policy_version=6), "stale"),  # 4 behind
        (make_sample(4, policy_version=0), "stale"),
        (make_sample(1, policy_version=10), "duplicate"),  # re-delivery of an admitted sample
        (already_trained, "duplicate"),  # trained before a restart
        (make_sample(5, privacy_mode=True, policy_version=10), "private"),
        (make_sample(6, privacy_mode=True, policy_version=0), "private"),  # private wins over stale
        (make_sample(7, completion_token_ids=None, policy_version=10), "no_tokens"),
        (make_sample(8, loss_mask=[0, 0], policy_version=10), "no_tokens"),  # only tool tokens: nothing of the policy's
        (make_sample(9, behaviour_logprobs=None, policy_version=10), "no_tokens"),
        (make_sample(10, prompt_token_ids=[], policy_version=10), "no_tokens"),
        (make_sample(11, completion_token_ids=[], policy_version=10), "no_tokens"),
        (make_sample(12, loss_mask=[0, 1], policy_version=11), None),  # newer than the base is fine
    ]
    assert [intake.admit(sample) for sample, _ in stream] == [reason for _, reason in stream]
    expected = {"private": 2, "duplicate": 2, "held_out": 0, "stale": 2, "frozen": 0, "no_tokens": 5, "accepted": 3}
    assert intake.counts == expected
    after = _prometheus()
    assert {key: after[key] - before[key] for key in after} == {key: float(value) for key, value in expected.items()}


def test_dropped_samples_are_not_remembered_and_the_base_moves() -> None:
    intake = Intake(base_policy_version=5, max_staleness=1)
    old = make_sample(1, policy_version=3)
    assert intake.admit(old) == "stale"
    assert not intake.seen(old.sample_id)
    assert intake.admit(old) == "stale"  # still stale, not a duplicate: it was never admitted
    fresh = make_sample(2, policy_version=5)
    assert intake.admit(fresh) is None
    intake.base_policy_version = 7  # a checkpoint was written
    assert intake.admit(make_sample(3, policy_version=5)) == "stale"
    assert intake.admit(fresh) == "duplicate"
    assert intake.counts == {
        "private": 0,
        "duplicate": 1,
        "held_out": 0,
        "stale": 3,
        "frozen": 0,
        "no_tokens": 0,
        "accepted": 1,
    }


def test_the_gates_held_out_split_is_never_trained_on() -> None:
    intake = Intake(base_policy_version=0, max_staleness=0, held_out=HeldOutRule(percent=10))
    samples = [make_sample(i) for i in range(400)]
    reasons = [intake.admit(sample) for sample in samples]
    held_out = [s for s in samples if is_held_out(s.sample_id, 10)]
    assert 20 <= len(held_out) <= 60  # about a tenth of them
    assert [s for s, r in zip(samples, reasons, strict=True) if r == "held_out"] == held_out
    assert intake.counts["held_out"] == len(held_out)
    assert intake.counts["accepted"] == len(samples) - len(held_out)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_staleness -1"):
        Intake(base_policy_version=0, max_staleness=-1)


def test_pack_batches_in_order_within_budget() -> None:
    # prompt 3 tokens + completion n tokens
    sizes = [2, 2, 5, 1, 20, 1, 1]
    samples = [make_sample(i, completion_token_ids=[7] * n) for i, n in enumerate(sizes)]
    assert [sample_tokens(sample) for sample in samples] == [5, 5, 8, 4, 23, 4, 4]
    batches = pack_batches(samples, token_budget=12)
    numbered = [[samples.index(sample) for sample in batch] for batch in batches]
    # 5+5=10 (+8 > 12); 8+4=12; 23 over the budget alone; 4+4=8
    assert numbered == [[0, 1], [2, 3], [4], [5, 6]]
    assert [sample for batch in batches for sample in batch] == samples  # nothing lost, order kept
    assert pack_batches([], token_budget=12) == []
    with pytest.raises(ValueError, match="token_budget 0"):
        pack_batches(samples, token_budget=0)


def test_the_seen_set_forgets_what_staleness_drops_anyway_and_never_trains_it_twice() -> None:
    old, recent = make_sample(1, policy_version=2), make_sample(2, policy_version=5)
    ids, versions = recent_seen([old.sample_id, recent.sample_id, "legacy"], [2, 5], oldest=6 - 3)
    assert (ids, versions) == ([recent.sample_id, "legacy"], [5, 3])  # an id without a version counts as recent
    intake = Intake(6, 3, ids)
    assert intake.admit(old) == "stale"  # forgotten, yet still refused: its policy is too far behind
    assert intake.admit(recent) == "duplicate"
