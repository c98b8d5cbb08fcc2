"""The learner's Prometheus metrics, as module-level objects on the default registry.

Intake counts every sample it sees: accepted, or dropped with a reason (each reason is a label value,
created at import so that a dashboard shows a zero rather than no series).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

DROP_REASONS = ("private", "duplicate", "held_out", "stale", "frozen", "no_tokens")
"""Every reason :class:`learner.intake.Intake` drops a sample for, in the order it checks them."""

# prometheus-client appends "_total" to counter names itself.
SAMPLES_DROPPED = Counter(
    "liveloop_learner_samples_dropped", "Samples the learner's intake dropped, by reason.", ("reason",)
)
SAMPLES_ACCEPTED = Counter("liveloop_learner_samples_accepted", "Samples the learner's intake accepted for training.")

for _reason in DROP_REASONS:
    SAMPLES_DROPPED.labels(reason=_reason)

# -- agent trajectories held until complete (learner.trajectories) -------------------------------
TRAJECTORIES_RELEASED = Counter(
    "liveloop_learner_trajectories_released",
    "Agent trajectories handed to training: complete (every turn arrived) or incomplete (waited too long).",
    ("how",),
)
TRAJECTORIES_HELD = Gauge("liveloop_learner_trajectories_held", "Agent trajectories waiting for their other turns.")
for _how in ("complete", "incomplete"):
    TRAJECTORIES_RELEASED.labels(how=_how)

# -- the training loop and checkpoints (learner.service) ----------------------------------------
SAMPLES_INVALID = Counter(
    "liveloop_learner_samples_invalid", "Records on the samples topic that are not valid samples (skipped)."
)
ROUNDS = Counter("liveloop_learner_rounds", "Training rounds run (replayed rounds included).")
STEPS = Counter("liveloop_learner_steps", "Optimizer steps taken by this process.")
CHECKPOINTS = Counter("liveloop_learner_checkpoints", "Checkpoints written by this process.")
PUBLISH_FAILURES = Counter("liveloop_learner_publish_failures", "Publishing attempts that failed (retried).")
STEP = Gauge("liveloop_learner_step", "Optimizer steps in the lineage.")
POLICY_VERSION = Gauge("liveloop_learner_policy_version", "Policy version of the newest checkpoint.")
SAMPLES_SINCE_CHECKPOINT = Gauge(
    "liveloop_learner_samples_since_checkpoint", "Accepted samples (trained or buffered) since the last checkpoint."
)
LAG = Gauge("liveloop_learner_lag", "Records on the samples topic not yet in a round, per partition.", ("partition",))
CHECKPOINT_SECONDS = Gauge("liveloop_learner_checkpoint_seconds", "Time the last checkpoint took to write.")
