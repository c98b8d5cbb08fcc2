"""The gate policy: the thresholds a candidate must meet against the champion, and what a pass does.

A typed, versioned value (YAML/JSON file or defaults). :func:`decide` turns an evaluation's metrics
into ``promote`` (all checks pass and ``auto_promote``), ``hold`` (all pass, an operator promotes) or
``reject`` (any check fails), with one reason per check, failed or passed, so the audit row says why.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from serving.documents import read_document
from serving.errors import ServingError

Decision = Literal["promote", "reject", "hold"]


class InvalidGatePolicy(ServingError):
    """The gate policy file is missing or invalid; the message lists every problem. Fix the file."""


class GatePolicy(BaseModel):
    """Thresholds of the evaluation gate. Every rule compares the candidate with the current champion, but the two
    that compare it with the base (``max_guard_rise``, ``max_reward_drop_from_base``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    version: str = Field(default="1", min_length=1, description="Recorded with every decision.")
    min_reward_improvement: float = Field(
        default=0.0,
        description="OPE(candidate) - OPE(champion) must be at least this; negative allows a bounded drop.",
    )
    min_improvement_ci_low: float = Field(
        default=-0.1, description="The lower bound of the difference's confidence interval must be at least this."
    )
    max_kl: float = Field(default=1.0, gt=0, description="Most mean per-token KL(candidate || champion), in nats.")
    min_ess: float = Field(default=10.0, ge=1, description="Fewest effective samples of the candidate's estimate.")
    min_held_out_samples: int = Field(default=20, ge=1, description="Fewer held-out samples: reject (cannot judge).")
    min_regression_pass_rate: float = Field(default=1.0, ge=0, le=1, description="Share of suite cases that pass.")
    min_distinct_share_ratio: float = Field(
        default=0.7,
        ge=0,
        le=1,
        description="Sampled distinct-completion share of the candidate / the champion's must be at least this "
        "(learning a preference narrows a little; a collapse onto a few completions falls far below).",
    )
    min_distinct_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Absolute floor of the candidate's distinct share (0: off). The ratio alone lets a run narrow "
        "step by step over many promotions; the floor depends on the suite's probe, so set it per product.",
    )
    min_entropy_ratio: float = Field(
        default=0.6,
        ge=0,
        le=1,
        description="Mean per-token sampling entropy of the candidate / the champion's must be at least this.",
    )
    max_well_formed_drop: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Most the well-formed share may fall below the champion's, in absolute share points "
        "(checked only where the suite defines a well_formed validator).",
    )
    max_guard_rise: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Most the share of held-out agent turns on which a reward guard fired (fake parallelism, give "
        "up, an invalid call, ...) may rise over the base's (policy version 1), both estimated off-policy as the "
        "reward is; None: not checked. The reward already charges each guard, but a learned hack can pay for its "
        "charge; this refuses a candidate that found one, whatever its reward.",
    )
    max_reward_drop_from_base: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Most the candidate's estimated reward may lie below the base's (policy version 1), on the same "
        "held-out samples; None: not checked. A policy that lets a candidate be a little below its champion "
        "(min_reward_improvement < 0, a non-inferiority check for cycles that move the policy by less than the "
        "estimate can resolve) bounds with this what many such cycles may lose in all.",
    )
    auto_promote: bool = Field(default=False, description="True: a pass promotes at once; False: it waits (hold).")
    importance_weight_clip: float = Field(default=20.0, gt=1, description="Truncation of importance weights.")
    ci_level: float = Field(default=0.95, gt=0.5, lt=1)
    bootstrap_resamples: int = Field(default=1000, ge=100, le=100_000)
    seed: int = Field(default=0, description="Bootstrap seed: the same data gives the same decision.")

    @property
    def compares_with_base(self) -> bool:
        """Whether a rule compares the candidate with the base, so that the gate must read the base too."""
        return self.max_guard_rise is not None or self.max_reward_drop_from_base is not None


def load_policy(path: Path) -> GatePolicy:
    """Read a policy from YAML or JSON."""
    try:
        data = read_document(path)
    except OSError as exc:
        raise InvalidGatePolicy(f"cannot read gate policy {path}: {exc}") from exc
    except ValueError as exc:
        raise InvalidGatePolicy(f"{path} is not a valid gate policy: {exc}") from exc
    try:
        return GatePolicy.model_validate(data)
    except ValidationError as exc:
        raise InvalidGatePolicy(f"{path} is not a valid gate policy: {exc}") from exc


class GateMetrics(BaseModel):
    """What an evaluation measured; the inputs of :func:`decide` (and the MLflow metrics)."""

    model_config = ConfigDict(frozen=True)

    held_out_samples: int
    candidate_reward: float = math.nan
    champion_reward: float = math.nan
    reward_difference: float = math.nan
    difference_ci_low: float = math.nan
    difference_ci_high: float = math.nan
    candidate_ess: float = 0.0
    champion_ess: float = 0.0
    mean_kl: float = math.nan
    regression_pass_rate: float = 0.0
    champion_regression_pass_rate: float = math.nan
    diversity_completions: int = 0
    candidate_distinct_share: float = math.nan
    champion_distinct_share: float = math.nan
    candidate_token_entropy: float = math.nan
    champion_token_entropy: float = math.nan
    candidate_completion_entropy: float = math.nan
    champion_completion_entropy: float = math.nan
    candidate_well_formed_share: float = math.nan
    champion_well_formed_share: float = math.nan
    well_formed_validator: str | None = None
    base_reward: float = math.nan
    agent_samples: int = 0
    candidate_guard_rates: dict[str, float] = Field(default_factory=dict)
    base_guard_rates: dict[str, float] = Field(default_factory=dict)
    sanity_ok: bool = True


def decide(policy: GatePolicy, m: GateMetrics, sanity_problems: list[str] | None = None) -> tuple[Decision, list[str]]:
    """The decision and one reason per rule (failed rules first, each prefixed 'FAIL' or 'ok')."""
    checks: list[tuple[bool, str]] = []
    if sanity_problems:
        checks += [(False, f"sanity: {problem}") for problem in sanity_problems]
    else:
        checks.append(
            (
                m.held_out_samples >= policy.min_held_out_samples,
                f"held-out samples {m.held_out_samples} >= {policy.min_held_out_samples}",
            )
        )
        checks.append(
            (
                _ge(m.reward_difference, policy.min_reward_improvement),
                f"reward {m.candidate_reward:.4f} vs champion {m.champion_reward:.4f}: "
                f"difference {m.reward_difference:+.4f} >= {policy.min_reward_improvement:+.4f}",
            )
        )
        checks.append(
            (
                _ge(m.difference_ci_low, policy.min_improvement_ci_low),
                f"difference CI low {m.difference_ci_low:+.4f} >= {policy.min_improvement_ci_low:+.4f}",
            )
        )
        checks += _base_reward_checks(policy, m)
        checks.append((_ge(m.candidate_ess, policy.min_ess), f"ESS {m.candidate_ess:.1f} >= {policy.min_ess:.1f}"))
        checks.append((_ge(policy.max_kl, m.mean_kl), f"mean KL {m.mean_kl:.4f} <= {policy.max_kl:.4f}"))
        checks.append(
            (
                _ge(m.regression_pass_rate, policy.min_regression_pass_rate),
                f"regression pass rate {m.regression_pass_rate:.3f} >= {policy.min_regression_pass_rate:.3f}",
            )
        )
        checks += _diversity_checks(policy, m)
        checks += _guard_checks(policy, m)
    reasons = [f"FAIL {text}" for ok, text in checks if not ok] + [f"ok {text}" for ok, text in checks if ok]
    if not all(ok for ok, _ in checks):
        return "reject", reasons
    return ("promote" if policy.auto_promote else "hold"), reasons


def _base_reward_checks(policy: GatePolicy, m: GateMetrics) -> list[tuple[bool, str]]:
    """The candidate's estimated reward against the base's (only where the policy sets a bound)."""
    bound = policy.max_reward_drop_from_base
    if bound is None:
        return []
    drop = m.base_reward - m.candidate_reward
    text = f"reward {m.candidate_reward:.4f} vs base {m.base_reward:.4f}: drop {drop:+.4f} <= {bound:.4f}"
    return [(_ge(bound, drop), text)]


def _diversity_checks(policy: GatePolicy, m: GateMetrics) -> list[tuple[bool, str]]:
    """Candidate against champion on the sampled probe (see :mod:`serving.diversity`)."""
    distinct = _ratio(m.candidate_distinct_share, m.champion_distinct_share)
    entropy = _ratio(m.candidate_token_entropy, m.champion_token_entropy)
    checks = [
        (
            _ge(distinct, policy.min_distinct_share_ratio),
            f"distinct share {m.candidate_distinct_share:.3f} vs champion {m.champion_distinct_share:.3f} "
            f"({m.diversity_completions} sampled completions each): ratio {distinct:.2f} "
            f">= {policy.min_distinct_share_ratio:.2f}",
        ),
        (
            _ge(m.candidate_distinct_share, policy.min_distinct_share),
            f"distinct share {m.candidate_distinct_share:.3f} >= floor {policy.min_distinct_share:.3f}",
        ),
        (
            _ge(entropy, policy.min_entropy_ratio),
            f"token entropy {m.candidate_token_entropy:.3f} vs champion {m.champion_token_entropy:.3f} nats: "
            f"ratio {entropy:.2f} >= {policy.min_entropy_ratio:.2f}",
        ),
    ]
    if m.well_formed_validator is None:
        checks.append((True, "well-formed share not checked: the suite defines no well_formed validator"))
    else:
        drop = m.champion_well_formed_share - m.candidate_well_formed_share
        checks.append(
            (
                _ge(policy.max_well_formed_drop, drop),
                f"well-formed share ({m.well_formed_validator}) {m.candidate_well_formed_share:.3f} "
                f"vs champion {m.champion_well_formed_share:.3f}: "
                f"drop {drop:+.3f} <= {policy.max_well_formed_drop:.3f}",
            )
        )
    return checks


def _guard_checks(policy: GatePolicy, m: GateMetrics) -> list[tuple[bool, str]]:
    """Each reward guard's firing rate, candidate against the base (only where the policy sets a bound)."""
    bound = policy.max_guard_rise
    if bound is None:
        return []
    if m.agent_samples < policy.min_held_out_samples:
        return [(True, f"guard rates not checked: {m.agent_samples} held-out agent turns")]
    if not m.candidate_guard_rates:
        return [(True, f"guard rates: no reward guard fired on any of the {m.agent_samples} held-out agent turns")]
    checks = []
    for name in sorted(m.candidate_guard_rates):
        candidate, base = m.candidate_guard_rates[name], m.base_guard_rates.get(name, math.nan)
        rise = candidate - base
        checks.append(
            (
                _ge(bound, rise),
                f"guard {name} fired on {candidate:.3f} of held-out agent turns vs base {base:.3f}: "
                f"rise {rise:+.3f} <= {bound:.3f}",
            )
        )
    return checks


def _ratio(candidate: float, champion: float) -> float:
    # A champion with no diversity at all (one completion, zero entropy) cannot be narrowed further.
    if champion == 0 and candidate >= 0:
        return math.inf
    return candidate / champion if champion > 0 else math.nan


def _ge(value: float, bound: float) -> bool:
    # NaN (nothing measured) never passes a rule.
    return not (math.isnan(value) or math.isnan(bound)) and value >= bound
