"""The loss terms on a fixed tiny batch equal references worked out by hand in plain Python floats.

The batch (B=2, T=3) is chosen so that every branch shows up:

- token (0, 2) is masked out and holds a huge ratio and a far-off reference: counting it would move
  every number below;
- ratio(0, 1) = e^1.0 and ratio(1, 2) = e^4.3 exceed the cap 2 (truncation);
- with clip_eps 0.2: (0, 0) and (0, 1) have A > 0 and r > 1.2, (1, 1) has A < 0 and r < 0.8 (clipped);
  (1, 0) is inside the range, and (1, 2) has A < 0 and r = 2 > 1.2, where the unclipped term is the
  smaller one (not clipped).
"""

from __future__ import annotations

import math

import pytest
import torch

from learner.loss import (
    LossConfig,
    importance_ratio,
    kl_penalty,
    normalise_advantages,
    policy_gradient_loss,
    truncated_importance_weights,
)

LOGP = [[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]]
BEHAVIOUR = [[-1.2, -1.5, -9.0], [-0.2, -0.9, -5.0]]
REF = [[-0.9, -0.7, -6.0], [-0.4, -1.0, -0.6]]
MASK = [[1, 1, 0], [1, 1, 1]]
ADV = [0.8, -1.3]
CAP = 2.0
EPS = 0.2
KL_COEF = 0.1
MASKED = [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]  # the five tokens with mask 1
N = 5.0


def _tensors(requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
    logp = torch.tensor(LOGP, dtype=torch.float64, requires_grad=requires_grad)
    return (
        logp,
        torch.tensor(BEHAVIOUR, dtype=torch.float64),
        torch.tensor(ADV, dtype=torch.float64),
        torch.tensor(MASK, dtype=torch.float64),
        torch.tensor(REF, dtype=torch.float64),
    )


# Hand references: per masked token, with math only.
def _ratio(b: int, t: int) -> float:
    return math.exp(LOGP[b][t] - BEHAVIOUR[b][t])


def _weight(b: int, t: int) -> float:
    return min(_ratio(b, t), CAP)


def _k3(b: int, t: int) -> float:
    delta = REF[b][t] - LOGP[b][t]
    return math.exp(delta) - delta - 1


def _ppo_term(b: int, t: int) -> float:
    r = min(_ratio(b, t), CAP)
    return min(r * ADV[b], min(max(r, 1 - EPS), 1 + EPS) * ADV[b])


HAND_PG = -sum(_weight(b, t) * ADV[b] * LOGP[b][t] for b, t in MASKED) / N
HAND_PPO = -sum(_ppo_term(b, t) for b, t in MASKED) / N
HAND_KL = sum(_k3(b, t) for b, t in MASKED) / N


def test_the_hand_reference_sees_each_branch() -> None:
    # Guards the fixture itself: the numbers below only test something if these hold.
    assert [_ratio(b, t) > CAP for b, t in MASKED] == [False, True, False, False, True]
    assert _ratio(0, 2) > CAP  # the masked-out token would be truncated and weigh in if it counted
    assert _ratio(0, 0) == pytest.approx(math.exp(0.2))
    assert _ratio(1, 1) < 1 - EPS


def test_importance_ratio_and_truncated_weights() -> None:
    logp, behaviour, *_ = _tensors(requires_grad=True)
    ratio = importance_ratio(logp, behaviour)
    weights = truncated_importance_weights(logp, behaviour, CAP)
    for b in range(2):
        for t in range(3):
            assert ratio[b, t].item() == pytest.approx(_ratio(b, t), abs=1e-12)
            assert weights[b, t].item() == pytest.approx(min(_ratio(b, t), CAP), abs=1e-12)
    assert ratio.requires_grad
    assert not weights.requires_grad  # the weight scales the gradient; it is not optimised
    assert weights.grad_fn is None


def test_plain_truncated_is_loss() -> None:
    terms = policy_gradient_loss(*_tensors()[:4], LossConfig(is_cap=CAP))
    # Written out: w = [e^0.2, 2, e^-0.1, e^-0.3, 2], A = [.8, .8, -1.3, -1.3, -1.3], logp = [-1, -.5, -.3, -1.2, -.7]
    written = (
        -(
            math.exp(0.2) * 0.8 * -1.0
            + 2.0 * 0.8 * -0.5
            + math.exp(-0.1) * -1.3 * -0.3
            + math.exp(-0.3) * -1.3 * -1.2
            + 2.0 * -1.3 * -0.7
        )
        / 5
    )
    assert written == pytest.approx(HAND_PG, abs=1e-12)
    assert terms.loss.item() == pytest.approx(HAND_PG, abs=1e-6)
    assert terms.pg_loss.item() == pytest.approx(HAND_PG, abs=1e-6)
    assert terms.kl.item() == 0.0
    assert terms.mean_weight == pytest.approx(sum(_weight(b, t) for b, t in MASKED) / N, abs=1e-6)
    assert terms.truncated_fraction == pytest.approx(2 / 5)
    assert terms.clipped_fraction == 0.0


def test_per_token_advantages_weigh_each_token_with_its_own() -> None:
    logp, behaviour, adv, mask, _ = _tensors()
    per_token = adv.unsqueeze(-1).expand(-1, 3).clone()
    assert policy_gradient_loss(logp, behaviour, per_token, mask, LossConfig(is_cap=CAP)).loss.item() == pytest.approx(
        HAND_PG, abs=1e-9
    )  # the same advantage on every token is the per-sample loss
    per_token[1, 2] += 1.0  # token (1, 2) alone gets credit of its own: w = 2, logp = -0.7
    moved = policy_gradient_loss(logp, behaviour, per_token, mask, LossConfig(is_cap=CAP))
    assert moved.loss.item() == pytest.approx(HAND_PG - 2.0 * 1.0 * -0.7 / N, abs=1e-9)


def test_masked_token_would_change_the_result() -> None:
    logp, behaviour, adv, _, _ = _tensors()
    all_ones = torch.ones_like(logp)
    unmasked = policy_gradient_loss(logp, behaviour, adv, all_ones, LossConfig(is_cap=CAP))
    assert abs(unmasked.loss.item() - HAND_PG) > 1e-2


def test_ppo_clipping() -> None:
    terms = policy_gradient_loss(*_tensors()[:4], LossConfig(is_cap=CAP, clip_eps=EPS))
    # Written out: (0,0) 1.2*.8, (0,1) 1.2*.8, (1,0) e^-0.1*-1.3, (1,1) 0.8*-1.3, (1,2) 2*-1.3
    written = -(1.2 * 0.8 + 1.2 * 0.8 + math.exp(-0.1) * -1.3 + 0.8 * -1.3 + 2.0 * -1.3) / 5
    assert written == pytest.approx(HAND_PPO, abs=1e-12)
    assert terms.loss.item() == pytest.approx(HAND_PPO, abs=1e-6)
    assert terms.clipped_fraction == pytest.approx(3 / 5)
    assert terms.truncated_fraction == pytest.approx(2 / 5)


def test_kl_term() -> None:
    logp, behaviour, adv, mask, ref = _tensors()
    terms = policy_gradient_loss(logp, behaviour, adv, mask, LossConfig(is_cap=CAP, kl_coef=KL_COEF), ref_logp=ref)
    assert terms.kl.item() == pytest.approx(HAND_KL, abs=1e-6)
    assert terms.pg_loss.item() == pytest.approx(HAND_PG, abs=1e-6)
    assert terms.loss.item() == pytest.approx(HAND_PG + KL_COEF * HAND_KL, abs=1e-6)


def test_clipping_and_kl_together() -> None:
    logp, behaviour, adv, mask, ref = _tensors()
    config = LossConfig(is_cap=CAP, clip_eps=EPS, kl_coef=KL_COEF)
    terms = policy_gradient_loss(logp, behaviour, adv, mask, config, ref_logp=ref)
    assert terms.loss.item() == pytest.approx(HAND_PPO + KL_COEF * HAND_KL, abs=1e-6)


def test_gradient_of_the_unclipped_loss_with_kl() -> None:
    logp, behaviour, adv, mask, ref = _tensors(requires_grad=True)
    config = LossConfig(is_cap=CAP, kl_coef=KL_COEF)
    policy_gradient_loss(logp, behaviour, adv, mask, config, ref_logp=ref).loss.backward()
    assert logp.grad is not None
    for b in range(2):
        for t in range(3):
            if MASK[b][t] == 0:
                expected = 0.0
            else:
                # d/dlogp of -w*A*logp/N (w detached) plus kl_coef * d/dlogp k3 / N, k3' = 1 - e^(ref - logp)
                expected = -_weight(b, t) * ADV[b] / N + KL_COEF * (1 - math.exp(REF[b][t] - LOGP[b][t])) / N
            assert logp.grad[b, t].item() == pytest.approx(expected, abs=1e-9)


def test_gradient_of_the_clipped_loss() -> None:
    logp, behaviour, adv, mask, _ = _tensors(requires_grad=True)
    policy_gradient_loss(logp, behaviour, adv, mask, LossConfig(is_cap=CAP, clip_eps=EPS)).loss.backward()
    assert logp.grad is not None
    # Only (1, 0) lets a gradient through: the clipped tokens are flat, (1, 2) sits on the cap (flat too).
    # There d/dlogp of -r*A/N is -r*A/N since dr/dlogp = r.
    expected = [[0.0, 0.0, 0.0], [-math.exp(-0.1) * -1.3 / N, 0.0, 0.0]]
    for b in range(2):
        for t in range(3):
            assert logp.grad[b, t].item() == pytest.approx(expected[b][t], abs=1e-9)


def test_no_masked_token_gives_zero_loss_with_a_graph() -> None:
    logp, behaviour, adv, _, ref = _tensors(requires_grad=True)
    terms = policy_gradient_loss(
        logp, behaviour, adv, torch.zeros_like(logp), LossConfig(kl_coef=KL_COEF, clip_eps=EPS), ref_logp=ref
    )
    assert terms.loss.item() == 0.0
    terms.loss.backward()
    assert logp.grad is not None
    assert logp.grad.abs().sum().item() == 0.0
    assert (terms.mean_weight, terms.truncated_fraction, terms.clipped_fraction) == (0.0, 0.0, 0.0)


def test_overflowing_masked_positions_stay_out_of_the_numbers() -> None:
    logp, behaviour, adv, mask, ref = _tensors(requires_grad=True)
    behaviour = behaviour.clone()
    behaviour[0, 2] = -1e6  # exp(logp - behaviour) overflows to inf at a masked position
    terms = policy_gradient_loss(logp, behaviour, adv, mask, LossConfig(is_cap=CAP, kl_coef=KL_COEF), ref_logp=ref)
    terms.loss.backward()
    assert terms.loss.item() == pytest.approx(HAND_PG + KL_COEF * HAND_KL, abs=1e-6)
    assert logp.grad is not None
    assert torch.isfinite(logp.grad).all()


def test_kl_needs_a_reference_and_shapes_must_match() -> None:
    logp, behaviour, adv, mask, _ = _tensors()
    with pytest.raises(ValueError, match="no ref_logp"):
        policy_gradient_loss(logp, behaviour, adv, mask, LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="mask has shape"):
        policy_gradient_loss(logp, behaviour, adv, mask[:, :2], LossConfig())
    with pytest.raises(ValueError, match="advantages has shape"):
        policy_gradient_loss(logp, behaviour, adv[:1], mask, LossConfig())
    with pytest.raises(ValueError, match="clip_eps"):
        LossConfig(clip_eps=1.5)


def test_normalise_advantages() -> None:
    result = normalise_advantages(torch.tensor([1.0, 2.0, 3.0, 6.0], dtype=torch.float64))
    mean = 3.0
    std = math.sqrt(((1 - 3) ** 2 + (2 - 3) ** 2 + 0 + (6 - 3) ** 2) / 4)  # population std = sqrt(3.5)
    expected = [(value - mean) / (std + 1e-6) for value in (1.0, 2.0, 3.0, 6.0)]
    assert result.tolist() == pytest.approx(expected, abs=1e-9)
    assert normalise_advantages(torch.tensor([5.0])).tolist() == [0.0]
    # Equal advantages carry no signal: zeros, not nan.
    assert normalise_advantages(torch.tensor([2.0, 2.0])).tolist() == [0.0, 0.0]
    # Weighted: three samples of weight 1/3 count as one against the fourth; one unit's worth gives zeros.
    values = torch.tensor([1.0, 1.0, 1.0, 3.0], dtype=torch.float64)
    weighted = normalise_advantages(values, weights=torch.tensor([1 / 3, 1 / 3, 1 / 3, 1.0], dtype=torch.float64))
    assert weighted.tolist() == pytest.approx([-1.0, -1.0, -1.0, 1.0], abs=1e-5)
    one_unit = torch.tensor([0.5, 0.5], dtype=torch.float64)
    assert normalise_advantages(values[:2] + torch.tensor([0.0, 1.0]), weights=one_unit).tolist() == [0.0, 0.0]


def test_kl_penalty_values() -> None:
    same = torch.tensor([-1.0, -0.2, -3.0])
    assert kl_penalty(same, same).tolist() == [0.0, 0.0, 0.0]
    logp = torch.tensor([-1.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-0.5, -1.5], dtype=torch.float64)
    values = kl_penalty(logp, ref).tolist()
    assert values == pytest.approx([math.exp(0.5) - 0.5 - 1, math.exp(-1.0) + 1.0 - 1], abs=1e-12)
    assert all(value > 0 for value in values)
