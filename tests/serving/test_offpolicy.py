"""The SNIS off-policy estimator: exact values on hand-computed cases, truncation, ESS, paired intervals."""

from __future__ import annotations

import math

import pytest

from serving.offpolicy import compare, estimate, truncated_weights


def test_equal_weights_give_the_mean_reward_and_full_ess() -> None:
    result = estimate([0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0])
    assert result.value == 0.5
    assert result.ess == pytest.approx(4.0)
    assert result.n == 4
    assert result.clipped_fraction == 0.0
    assert 0.0 <= result.ci_low <= 0.5 <= result.ci_high <= 1.0


def test_weights_are_truncated_and_self_normalised() -> None:
    result = estimate([math.log(2.0), 0.0, math.log(100.0)], [1.0, 0.0, 1.0], clip=20.0)
    # w = [2, 1, 20]: value = (2 + 20) / 23, ESS = 23^2 / (4 + 1 + 400).
    assert result.value == pytest.approx(22 / 23)
    assert result.ess == pytest.approx(529 / 405)
    assert result.clipped_fraction == pytest.approx(1 / 3)


def test_huge_log_ratios_do_not_overflow_and_nan_is_refused() -> None:
    assert list(truncated_weights([1e6, -1e6], clip=5.0)) == [5.0, 0.0]
    with pytest.raises(ValueError, match="finite"):
        estimate([float("nan")], [1.0])
    with pytest.raises(ValueError, match="one reward per log ratio"):
        estimate([0.0, 0.0], [1.0])


def test_paired_difference_and_its_interval() -> None:
    rewards = [1.0, 0.0] * 20
    same = compare([0.0] * 40, [0.0] * 40, rewards)
    assert same.difference == 0.0
    assert (same.difference_ci_low, same.difference_ci_high) == (0.0, 0.0)  # paired: identical policies, no spread
    # The candidate doubles the weight of every rewarded sample: (2*20) / (2*20 + 20) = 2/3.
    better = compare([math.log(2.0), 0.0] * 20, [0.0] * 40, rewards, seed=7)
    assert better.candidate.value == pytest.approx(2 / 3)
    assert better.champion.value == pytest.approx(0.5)
    assert better.difference == pytest.approx(1 / 6)
    assert 0.0 < better.difference_ci_low <= better.difference_ci_high
    assert better == compare([math.log(2.0), 0.0] * 20, [0.0] * 40, rewards, seed=7)  # seeded: repeatable
