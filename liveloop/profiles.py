"""Profiles of ``liveloop up --profile NAME``: a cadence for the whole loop in one word.

A profile is the components' environment (their ``LIVELOOP_<STAGE>_*`` settings) plus the gate policy
they run under. ``fast`` is the compressed cadence of ``liveloop demo``, offered to anyone: the loop
learns in minutes instead of hours, on a team's own traffic sent to the ingest API and the gateway.
Each value is a default: a variable already set in ``up``'s environment wins.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from infra.stack import Stack
from liveloop.exit_codes import UsageProblem
from serving.gate_policy import GatePolicy
from serving.regression import DEFAULT_SUITE


@dataclass(frozen=True)
class LoopProfile:
    """The environment of the loop's components and the gate policy they run under."""

    name: str
    summary: str
    environment: Mapping[str, str]
    gate_policy: GatePolicy


# From the learnability experiment (tests/liveloop/learnability_experiment.py): at lr 5e-4 a round of
# 64 samples per step lifts acceptance by 15 points within about 256 samples; one torch thread per
# process, because on 2 cores extra threads only spin against the other processes. A fifth of the
# samples, not a tenth, is held out for the gate: a checkpoint every minute or two leaves it a few dozen
# samples to judge on, and at a tenth it rejected candidates that had learned, on the width of the
# confidence interval or on too small an effective sample size. The learner and the gate must hold out
# the same share.
FAST = LoopProfile(
    name="fast",
    summary="a checkpoint every 2 minutes once 64 samples trained, gated and promoted automatically",
    environment={
        "LIVELOOP_LEARNER_LR": "5e-4",
        "LIVELOOP_LEARNER_ROUND_SAMPLES": "64",
        "LIVELOOP_LEARNER_TOKEN_BUDGET": "4096",
        "LIVELOOP_LEARNER_MIN_SAMPLES": "64",
        "LIVELOOP_LEARNER_CHECKPOINT_INTERVAL_S": "120",
        "LIVELOOP_HELD_OUT_PERCENT": "20",
        "LIVELOOP_LEARNER_THREADS": "1",
        "LIVELOOP_SERVING_TORCH_THREADS": "1",
        "LIVELOOP_SERVING_SWAP_RECONCILE_INTERVAL_S": "5",
        "OMP_NUM_THREADS": "1",
        # The regression suite with the demo language's prompts and its well-formedness rule, so that the
        # gate can reject a candidate whose completions stop being valid statements.
        "LIVELOOP_GATE_SUITE_PATH": str(DEFAULT_SUITE.with_name("code-demo.yaml")),
    },
    # Diversity: learning the users' preference narrows the completions, and at this learning rate a
    # two-minute cycle can narrow them by a third (a demo run here: a distinct share of 0.84 in the
    # champion's probe, 0.56 in the next candidate's), which the default ratio of 0.7 rejected cycle after
    # cycle. The profile allows half per step and guards against collapse with an absolute floor.
    gate_policy=GatePolicy(
        version="fast-2",
        auto_promote=True,
        min_held_out_samples=20,
        min_distinct_share_ratio=0.5,
        min_distinct_share=0.4,
    ),
)

PROFILES: dict[str, LoopProfile] = {FAST.name: FAST}


def profile_named(name: str) -> LoopProfile:
    """The profile called ``name``; a UsageProblem naming the ones there are otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageProblem(f"no loop profile {name!r}; use one of: {', '.join(sorted(PROFILES))}") from None


def apply_profile(profile: LoopProfile, state_dir: Path) -> Path:
    """Write the profile's gate policy into ``state_dir`` and put its environment into this process's, which
    the components inherit; a variable already set wins. Return the policy file."""
    state_dir.mkdir(parents=True, exist_ok=True)
    policy_path = state_dir.resolve() / f"{profile.name}-gate-policy.json"
    policy_path.write_text(profile.gate_policy.model_dump_json(indent=2) + "\n", encoding="utf-8")
    for key, value in {**profile.environment, "LIVELOOP_GATE_POLICY_PATH": str(policy_path)}.items():
        os.environ.setdefault(key, value)
    return policy_path


def check_base_folder(source: Path | None) -> None:
    """A UsageProblem unless ``source`` is None (the tiny model) or a Hugging Face model folder."""
    if source is not None and not (source / "config.json").is_file():
        raise UsageProblem(f"{source} is not a Hugging Face model folder (no config.json)")


def register_base_model(stack: Stack, source: Path | None) -> int:
    """Write the lineage's base checkpoint into the stack's learner folder (the tiny model, or a copy of the
    Hugging Face folder ``source``) and register it as the first champion if the model has none; return its
    MLflow version. Idempotent; the stack's services must be up. The learner must start from ``source`` too
    (``LIVELOOP_LEARNER_BASE_MODEL``), or its first candidate would not descend from the champion."""
    from learner.checkpoint import write_base_checkpoint
    from learner.publish import register_base
    from learner.settings import LearnerSettings

    check_base_folder(source)
    learner_dir = stack.settings.state_dir.resolve() / "learner"  # the learner component's data folder
    folder = write_base_checkpoint(learner_dir, LearnerSettings().model_name, source)
    return register_base(folder, mlflow_uri=stack.endpoints.mlflow_url, dsn=stack.endpoints.dsn())
