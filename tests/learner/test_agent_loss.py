"""The learner's loss on agent samples equals a value worked out by hand, with the shaping coefficients at their
start and at their end; frozen sub-agent turns get no gradient; a trajectory's batch is one optimiser step.

The fixed samples: an orchestrator trajectory A of 3 turns, a single-turn sample S and a trajectory B of 2
turns, interleaved as they come off two partitions (A1, S, B1, A2, B2, A3). Each gets its own prompt, so the
fixed "policy" below (a table of logprobs, one row per prompt) gives every sample its own numbers whatever
row the batch puts it in. The hand reference is plain Python floats: shaped reward per unit (trajectory or
single sample), advantages against a fresh baseline (0), normalised over the 3 units (population std + 1e-6),
then ``-sum(min(exp(logp - mu), 2) * A * logp) / masked tokens``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import pytest
import torch

from distill.samples import Sample
from learner.baseline import EmaBaseline
from learner.engine import LearnerEngine, StepBatch, init_distributed
from learner.intake import Intake
from learner.logprobs import completion_logprobs
from learner.loss import LossConfig, policy_gradient_loss
from learner.rounds import plan_round
from learner.settings import LearnerSettings
from learner.shaping import ShapingSchedule
from learner.tiny_model import build_tiny_model
from tests.learner.sample_factory import make_agent_sample, make_sample

SCHEDULE = ShapingSchedule(lambda_parallel=0.6, lambda_finish=0.4, anneal_steps=10)
START, END = 0, SCHEDULE.anneal_steps
CAP = 2.0

# (prompt, completion, behaviour logprobs, loss mask, the fixed policy's logprobs) per sample.
TOKENS = {
    "A1": ([30, 11, 12], [20, 21], [-1.2, -0.8], [1, 1], [-1.0, -0.5]),
    "S": ([31, 11], [22, 23, 24], [-0.4, -2.0, -0.9], [1, 0, 1], [-0.3, -9.0, -1.1]),  # a tool token masked
    "B1": ([32, 11, 12], [25], [-0.7], [1], [-0.2]),
    "A2": ([33, 11], [26, 27, 28], [-1.5, -0.3, -2.2], [1, 1, 0], [-0.6, -1.4, -3.0]),
    "B2": ([34, 11, 12], [29, 30], [-0.9, -0.1], [0, 1], [-0.8, -2.5]),  # (B2, 1): ratio e^-2.4
    "A3": ([35, 11], [31, 32], [-3.0, -0.6], [1, 1], [-0.9, -0.4]),  # (A3, 0): ratio e^2.1 > cap
}
UNITS = {"A": ["A1", "A2", "A3"], "S": ["S"], "B": ["B1", "B2"]}
REWARDS = {"A": (0.5, 1.0, 0.5), "S": (0.1, 0.0, 0.0), "B": (-0.2, 0.0, 1.0)}  # reward, r_parallel, r_finish


def _samples() -> list[Sample]:
    def fields(name: str) -> dict[str, object]:
        prompt, completion, behaviour, mask, _ = TOKENS[name]
        return {
            "prompt_token_ids": prompt,
            "completion_token_ids": completion,
            "behaviour_logprobs": behaviour,
            "loss_mask": mask,
        }

    def turn(name: str, number: int) -> Sample:
        trajectory = 1 if name[0] == "A" else 2
        reward, r_parallel, r_finish = REWARDS[name[0]]
        return make_agent_sample(
            number,
            trajectory,
            int(name[1]),
            len(UNITS[name[0]]),
            reward=reward,
            r_parallel=r_parallel,
            r_finish=r_finish,
            **fields(name),
        )

    single = make_sample(2, reward=REWARDS["S"][0], surface="agent", **fields("S"))
    return [turn("A1", 1), single, turn("B1", 3), turn("A2", 4), turn("B2", 5), turn("A3", 6)]


def _hand_loss(step: int, per_turn: bool = False) -> float:
    """The reference, in plain floats; ``per_turn`` normalises over turns instead (the bug it must not have)."""
    share = max(0.0, 1 - step / SCHEDULE.anneal_steps)
    shaped = {
        unit: reward + SCHEDULE.lambda_parallel * share * r_parallel + SCHEDULE.lambda_finish * share * r_finish
        for unit, (reward, r_parallel, r_finish) in REWARDS.items()
    }
    units = [unit for unit, names in UNITS.items() for _ in (names if per_turn else [None])]
    values = [shaped[unit] for unit in units]
    mean, std = statistics.fmean(values), statistics.pstdev(values)
    advantage = {unit: (shaped[unit] - mean) / (std + 1e-6) for unit in UNITS}
    total, count = 0.0, 0
    for unit, names in UNITS.items():
        for name in names:
            _, _, behaviour, mask, logp = TOKENS[name]
            for m, b, lp in zip(mask, behaviour, logp, strict=True):
                if m:
                    total += min(math.exp(lp - b), CAP) * advantage[unit] * lp
                    count += 1
    return -total / count


def _table_loss(batch: StepBatch) -> torch.Tensor:
    """The loss of ``batch`` under the fixed policy: each row's logprobs looked up by its prompt."""
    by_prompt = {tuple(prompt): logp for prompt, _, _, _, logp in TOKENS.values()}
    width = max(len(c) for c in batch.completion_ids)

    def padded(rows: Sequence[Sequence[float]]) -> torch.Tensor:
        return torch.tensor([list(row) + [0.0] * (width - len(row)) for row in rows], dtype=torch.float64)

    logp = padded([by_prompt[tuple(prompt)] for prompt in batch.prompt_ids])
    mask = padded([[float(m) for m in row] for row in batch.loss_mask])
    behaviour = padded(batch.behaviour_logprobs)
    advantages = torch.tensor(batch.advantages, dtype=torch.float64)
    return policy_gradient_loss(logp, behaviour, advantages, mask, LossConfig(is_cap=CAP)).loss


def test_the_hand_reference_tells_the_schedule_and_per_trajectory_normalisation_apart() -> None:
    # Guards the fixture: the comparisons below only test something if these numbers differ.
    assert abs(_hand_loss(START) - _hand_loss(END)) > 1e-2
    assert abs(_hand_loss(START) - _hand_loss(START, per_turn=True)) > 1e-2
    assert abs(_hand_loss(END) - _hand_loss(END, per_turn=True)) > 1e-2


@pytest.mark.parametrize("step", [START, END, END + 5], ids=["lambda-start", "lambda-end", "past-the-end"])
def test_the_loss_on_agent_samples_matches_the_hand_value(step: int) -> None:
    batches = plan_round(_samples(), EmaBaseline(0.9), token_budget=1000, shaping=SCHEDULE, first_step=step)
    assert len(batches) == 1
    assert float(_table_loss(batches[0])) == pytest.approx(_hand_loss(min(step, END)), abs=1e-9)
    # The trajectory's turns sit together and share one advantage.
    assert batches[0].advantages[0] == batches[0].advantages[1] == batches[0].advantages[2]
    assert batches[0].advantages[4] == batches[0].advantages[5]


@pytest.fixture(scope="module")
def distributed() -> None:
    init_distributed(1)


def test_the_engine_reports_the_hand_value_of_the_tiny_model(distributed: None) -> None:
    settings = LearnerSettings.model_validate({"lr": 1e-3, "is_cap": CAP})
    engine = LearnerEngine(settings, rank=0, world_size=1)
    for step in (START, END):
        batch = plan_round(_samples(), EmaBaseline(0.9), token_budget=1000, shaping=SCHEDULE, first_step=step)[0]
        with torch.no_grad():
            logp, _ = completion_logprobs(engine.module, batch.prompt_ids, batch.completion_ids)
        # The hand formula over the engine's own logprobs (before this step moves the weights).
        rows = {tuple(p): [float(x) for x in logp[i]] for i, p in enumerate(batch.prompt_ids)}
        total, count = 0.0, 0
        for prompt, mask, behaviour, advantage in zip(
            batch.prompt_ids, batch.loss_mask, batch.behaviour_logprobs, batch.advantages, strict=True
        ):
            for m, b, lp in zip(mask, behaviour, rows[tuple(prompt)], strict=False):
                if m:
                    total += min(math.exp(lp - b), CAP) * advantage * lp
                    count += 1
        metrics = engine.train_step(batch, step)
        assert metrics.loss == pytest.approx(-total / count, abs=1e-5)  # float32 model, float64 reference


def test_frozen_sub_agent_turns_get_zero_gradient() -> None:
    a1, a2 = (make_agent_sample(n, 1, n, 2, reward=0.7, r_parallel=1.0) for n in (1, 2))
    frozen = make_agent_sample(3, 1, 3, 2, reward=0.7, frozen=True, agent="subagent", completion_token_ids=[40, 41])
    single = make_sample(4, reward=-0.3, surface="agent")
    schedule = ShapingSchedule(lambda_parallel=0.5, lambda_finish=0.0, anneal_steps=100)

    # Intake drops it by name, and planning leaves it out of the batches and of the advantage statistics.
    assert Intake(0, 4).admit(frozen) == "frozen"
    with_frozen = plan_round([a1, frozen, a2, single], EmaBaseline(), 1000, shaping=schedule, first_step=0)
    without = plan_round([a1, a2, single], EmaBaseline(), 1000, shaping=schedule, first_step=0)
    assert with_frozen == without

    # Even a code path that feeds its row to the loss (all-zero mask, any advantage) moves no gradient.
    batch = without[0]
    forced = StepBatch(
        prompt_ids=[*batch.prompt_ids, list(frozen.prompt_token_ids or ())],
        completion_ids=[*batch.completion_ids, list(frozen.completion_token_ids or ())],
        behaviour_logprobs=[*batch.behaviour_logprobs, list(frozen.behaviour_logprobs or ())],
        loss_mask=[*batch.loss_mask, list(frozen.loss_mask or ())],
        advantages=[*batch.advantages, 5.0],
    )
    model = build_tiny_model().train()

    def gradients(step_batch: StepBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logp, valid = completion_logprobs(model, step_batch.prompt_ids, step_batch.completion_ids)
        logp.retain_grad()
        mask = torch.tensor(step_batch.loss_mask, dtype=torch.float32) * valid
        behaviour = torch.tensor(step_batch.behaviour_logprobs, dtype=torch.float32)
        advantages = torch.tensor(step_batch.advantages, dtype=torch.float32)
        policy_gradient_loss(logp, behaviour, advantages, mask, LossConfig()).loss.backward()
        assert logp.grad is not None
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}, logp.grad

    plain, _ = gradients(batch)
    with_row, logp_grad = gradients(forced)
    assert torch.count_nonzero(logp_grad[-1]) == 0  # the frozen turn's tokens: exactly zero
    assert any(torch.count_nonzero(g) for g in plain.values())
    assert plain.keys() == with_row.keys()
    for name, grad in plain.items():
        assert torch.allclose(grad, with_row[name], rtol=1e-5, atol=1e-8), name


def test_the_optimiser_steps_once_per_trajectory_batch_however_many_turns_it_has(distributed: None) -> None:
    # Six turns of 5 tokens each (30) against a budget of 12: never split, one batch, one step; the single-turn
    # sample after it starts the next batch.
    turns = [make_agent_sample(n, 7, n, 6, reward=0.4 + 0.1 * (n % 2)) for n in range(6)]
    single = make_sample(10, reward=-0.5, surface="agent")
    batches = plan_round([*turns, single], EmaBaseline(), 12, shaping=SCHEDULE, first_step=0)
    assert [len(batch) for batch in batches] == [6, 1]
    engine = LearnerEngine(LearnerSettings.model_validate({"lr": 1e-3}), rank=0, world_size=1)
    engine.train_step(batches[0], 0)
    assert engine.engine.global_steps == 1
    adam = engine.engine.optimizer.optimizer  # ZeRO's wrapper around torch's AdamW
    assert {int(state["step"]) for state in adam.state.values()} == {1}
