"""EmaBaseline: per-bucket averages with exact numbers, advantages before the update, state round trip."""

from __future__ import annotations

import pytest

from learner.baseline import EmaBaseline, bucket_of
from tests.learner.sample_factory import make_sample


def test_bucket_is_task_kind_else_surface() -> None:
    assert bucket_of(make_sample(1, surface="ide.tab")) == "surface:ide.tab"
    assert bucket_of(make_sample(2, surface="ide.tab", task_kind="python")) == "task:python"
    # A task kind and a surface of the same name stay apart.
    assert bucket_of(make_sample(3, surface="agent")) != bucket_of(make_sample(4, task_kind="agent"))


def test_advantages_use_the_baseline_before_the_batch() -> None:
    baseline = EmaBaseline(decay=0.5)
    assert baseline.value("a") == 0.0
    rewards, buckets = [1.0, 3.0, -2.0], ["a", "a", "b"]
    assert baseline.advantages(rewards, buckets) == [1.0, 3.0, -2.0]  # unseen buckets: baseline 0
    baseline.update(rewards, buckets)
    # a: first reward sets 1.0, then 0.5 * 1.0 + 0.5 * 3.0 = 2.0; b: -2.0
    assert baseline.value("a") == pytest.approx(2.0)
    assert baseline.value("b") == pytest.approx(-2.0)
    assert baseline.advantages([2.5, 0.0, 1.0], ["a", "b", "c"]) == pytest.approx([0.5, 2.0, 1.0])
    baseline.update([4.0], ["a"])
    assert baseline.value("a") == pytest.approx(0.5 * 2.0 + 0.5 * 4.0)


def test_default_decay_numbers() -> None:
    baseline = EmaBaseline()
    baseline.update([1.0, 0.0, 0.0], ["x", "x", "x"])
    assert baseline.value("x") == pytest.approx(0.9 * 0.9 * 1.0)


def test_state_round_trip() -> None:
    baseline = EmaBaseline(decay=0.8)
    baseline.update([1.0, -1.0, 0.5], ["a", "b", "a"])
    state = baseline.state_dict()
    assert state == pytest.approx({"a": 0.8 * 1.0 + 0.2 * 0.5, "b": -1.0})
    restored = EmaBaseline(decay=0.8)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    state["a"] = 99.0  # the state dict is a copy
    assert baseline.value("a") != 99.0
    # A seen bucket whose average is 0 still updates as seen, not as a first reward.
    restored.load_state_dict({"z": 0.0})
    restored.update([1.0], ["z"])
    assert restored.value("z") == pytest.approx(0.2)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"decay 1\.0"):
        EmaBaseline(decay=1.0)
    with pytest.raises(ValueError, match="2 rewards for 1 buckets"):
        EmaBaseline().advantages([1.0, 2.0], ["a"])
