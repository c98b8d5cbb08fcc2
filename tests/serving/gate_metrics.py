"""Gate metrics of a healthy candidate, for tests of the gate policy's rules to vary one figure at a time."""

from __future__ import annotations

from serving.gate_policy import GateMetrics

HEALTHY = GateMetrics(
    held_out_samples=100,
    candidate_reward=0.7,
    champion_reward=0.5,
    reward_difference=0.2,
    difference_ci_low=0.05,
    difference_ci_high=0.3,
    candidate_ess=50.0,
    mean_kl=0.1,
    regression_pass_rate=1.0,
    diversity_completions=256,
    candidate_distinct_share=0.70,
    champion_distinct_share=0.77,
    candidate_token_entropy=1.1,
    champion_token_entropy=1.3,
    candidate_well_formed_share=0.80,
    champion_well_formed_share=0.83,
    well_formed_validator="number@1",
)
"""Passes every rule of the default policy: better reward, small KL, a little narrower than the champion."""
