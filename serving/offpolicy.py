"""Off-policy evaluation: the expected reward of a policy, estimated from samples another policy logged.

Self-normalised importance sampling (SNIS). For sample ``i`` with completion tokens ``t``:

    log w_i = sum_t mask_t * (log pi(t) - log mu(t))          (mu: the behaviour policy that logged it)
    w_i     = min(exp(log w_i), clip)                          (truncated, so one sample cannot dominate)
    V       = sum_i w_i r_i / sum_i w_i
    ESS     = (sum_i w_i)^2 / sum_i w_i^2                      (effective sample size, 1..n)

Confidence intervals are percentile bootstrap intervals with a fixed seed (so an evaluation is
reproducible): SNIS is a ratio estimator whose delta-method variance is poor with few samples and
heavy-tailed weights, and the bootstrap also gives the interval of the *difference* between two
policies directly, by resampling the same sample indices for both (a paired bootstrap), which is
what the gate compares against the champion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class OpeEstimate(BaseModel):
    """One policy's estimated expected reward on a set of logged samples."""

    model_config = ConfigDict(frozen=True)

    value: float
    ci_low: float
    ci_high: float
    ess: float = Field(description="Effective sample size of the truncated weights.")
    n: int
    clipped_fraction: float = Field(description="Share of samples whose weight hit the clip.")


class OpeComparison(BaseModel):
    """A candidate against the champion on the same samples: both estimates and their paired difference."""

    model_config = ConfigDict(frozen=True)

    candidate: OpeEstimate
    champion: OpeEstimate
    difference: float = Field(description="candidate.value - champion.value")
    difference_ci_low: float
    difference_ci_high: float


def truncated_weights(log_ratios: Sequence[float], clip: float) -> np.ndarray:
    """``min(exp(log_ratio), clip)`` computed without overflow (the clip is applied in log space)."""
    if clip <= 0:
        raise ValueError(f"importance weight clip {clip} must be positive")
    logs = np.asarray(log_ratios, dtype=np.float64)
    if not np.all(np.isfinite(logs)):
        raise ValueError("log importance ratios must be finite; a sample has a NaN/Inf logprob")
    limit = math.log(clip)
    # exp(log(clip)) is not exactly clip in floating point: a clipped weight is set to clip itself.
    return np.where(logs >= limit, clip, np.exp(np.minimum(logs, limit)))


def snis(weights: np.ndarray, rewards: np.ndarray) -> float:
    """The self-normalised estimate ``sum w r / sum w``."""
    total = float(weights.sum())
    if total <= 0.0:
        raise ValueError("every importance weight is zero; the policy gives the logged completions no probability")
    return float((weights * rewards).sum() / total)


def effective_sample_size(weights: np.ndarray) -> float:
    """Kish's effective sample size ``(sum w)^2 / sum w^2``."""
    squares = float((weights**2).sum())
    return float(weights.sum()) ** 2 / squares if squares > 0 else 0.0


def _bootstrap_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _ratio_of_sums(weights: np.ndarray, rewards: np.ndarray, idx: np.ndarray) -> np.ndarray:
    w = weights[idx]
    totals = w.sum(axis=1)
    # A resample whose weights are all zero has no estimate; it is dropped from the interval.
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray((w * rewards[idx]).sum(axis=1) / totals)


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return (math.nan, math.nan)
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(finite, [tail, 100.0 - tail])
    return (float(low), float(high))


def estimate(
    log_ratios: Sequence[float],
    rewards: Sequence[float],
    *,
    clip: float = 20.0,
    level: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> OpeEstimate:
    """SNIS estimate of the expected reward with its bootstrap interval and effective sample size."""
    if len(log_ratios) != len(rewards) or not rewards:
        raise ValueError(f"need one reward per log ratio and at least one sample, got {len(log_ratios)}/{len(rewards)}")
    weights = truncated_weights(log_ratios, clip)
    r = np.asarray(rewards, dtype=np.float64)
    low, high = _interval(_ratio_of_sums(weights, r, _bootstrap_indices(len(r), resamples, seed)), level)
    return OpeEstimate(
        value=snis(weights, r),
        ci_low=low,
        ci_high=high,
        ess=effective_sample_size(weights),
        n=len(r),
        clipped_fraction=float(np.mean(np.asarray(log_ratios) >= math.log(clip))),
    )


def compare(
    candidate_log_ratios: Sequence[float],
    champion_log_ratios: Sequence[float],
    rewards: Sequence[float],
    *,
    clip: float = 20.0,
    level: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> OpeComparison:
    """Both policies' estimates on the same samples, and a paired-bootstrap interval of their difference."""
    if not len(candidate_log_ratios) == len(champion_log_ratios) == len(rewards):
        raise ValueError("candidate, champion and rewards must describe the same samples, in the same order")
    candidate = estimate(candidate_log_ratios, rewards, clip=clip, level=level, resamples=resamples, seed=seed)
    champion = estimate(champion_log_ratios, rewards, clip=clip, level=level, resamples=resamples, seed=seed)
    r = np.asarray(rewards, dtype=np.float64)
    idx = _bootstrap_indices(len(r), resamples, seed)
    diffs = _ratio_of_sums(truncated_weights(candidate_log_ratios, clip), r, idx) - _ratio_of_sums(
        truncated_weights(champion_log_ratios, clip), r, idx
    )
    low, high = _interval(diffs, level)
    return OpeComparison(
        candidate=candidate,
        champion=champion,
        difference=candidate.value - champion.value,
        difference_ci_low=low,
        difference_ci_high=high,
    )
