"""The annealed shaping coefficients of agent samples: ``lambda_parallel(t)`` and ``lambda_finish(t)``.

An agent sample's ``reward`` (:class:`distill.samples.Sample`) is what the gate and promotion judge: the
verified performance and the guards' penalties. Its :class:`distill.samples.AgentCredit` also carries two
shaping terms from PARL (Kimi K2.5): ``r_parallel`` against serial collapse (never spawning sub-agents)
and ``r_finish`` against fake parallelism (spawning sub-agents that finish nothing). The learner trains on

    shaped = reward + lambda_parallel(t) * r_parallel + lambda_finish(t) * r_finish

with both coefficients falling linearly from their start values to 0 over ``anneal_steps`` optimiser steps
(``t`` is the lineage's step count, the one a checkpoint manifest records), so that the shaping gets the
orchestrator off the ground and the final policy optimises performance alone. Single-turn samples are
unchanged. Pure, and light (no torch): the checkpoint manifest records the schedule.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from distill.samples import Sample

LAMBDA_MAX = 10.0
"""The largest start value of a coefficient: r_parallel and r_finish lie in [0, 1], rewards in about [-1, 1]."""

ANNEAL_STEPS_MAX = 100_000_000
"""The longest anneal, in optimiser steps (far beyond any lineage: a bound, not a suggestion)."""


class ShapingSchedule(BaseModel):
    """The schedule: start values and the number of optimiser steps over which both fall linearly to 0.

    ``anneal_steps`` 0 means no shaping at all (both coefficients are 0 from the first step).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lambda_parallel: float = Field(ge=0.0, le=LAMBDA_MAX, description="lambda_parallel at step 0.")
    lambda_finish: float = Field(ge=0.0, le=LAMBDA_MAX, description="lambda_finish at step 0.")
    anneal_steps: int = Field(ge=0, le=ANNEAL_STEPS_MAX, description="Optimiser steps until both reach 0.")

    def remaining(self, step: int) -> float:
        """The share of the start values left at optimiser step ``step``: ``max(0, 1 - step / anneal_steps)``."""
        if step < 0:
            raise ValueError(f"step {step} must be >= 0: it counts the lineage's optimiser steps")
        if self.anneal_steps == 0:
            return 0.0
        return max(0.0, 1.0 - step / self.anneal_steps)

    def at(self, step: int) -> tuple[float, float]:
        """``(lambda_parallel(step), lambda_finish(step))``."""
        share = self.remaining(step)
        return self.lambda_parallel * share, self.lambda_finish * share

    def shaped_reward(self, sample: Sample, step: int) -> float:
        """The reward the learner trains ``sample`` on at optimiser step ``step`` (see the module docstring)."""
        if sample.agent is None:
            return sample.reward
        lambda_parallel, lambda_finish = self.at(step)
        return sample.reward + lambda_parallel * sample.agent.r_parallel + lambda_finish * sample.agent.r_finish


class ShapingRecord(BaseModel):
    """What a checkpoint manifest records of the shaping: the schedule and the coefficients at its step."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schedule: ShapingSchedule
    lambda_parallel: float = Field(ge=0.0, description="lambda_parallel at the checkpoint's step.")
    lambda_finish: float = Field(ge=0.0, description="lambda_finish at the checkpoint's step.")

    @classmethod
    def at_step(cls, schedule: ShapingSchedule, step: int) -> ShapingRecord:
        """The record of a checkpoint written after ``step`` optimiser steps of its lineage."""
        lambda_parallel, lambda_finish = schedule.at(step)
        return cls(schedule=schedule, lambda_parallel=lambda_parallel, lambda_finish=lambda_finish)
