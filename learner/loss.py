"""The learner's loss: a token-level, truncated-importance-weighted policy gradient with optional terms.

Samples come from the policy that served them (the behaviour policy ``mu``, whose token logprobs ride in
each sample), not from the weights being trained (``pi_theta``). Each term is a small function:

- :func:`importance_ratio` ``pi_theta / mu`` per token, and :func:`truncated_importance_weights`
  ``min(ratio, c)``, detached: truncation bounds the variance a stale sample can add (c = ``is_cap``);
- :func:`normalise_advantages` per batch, so the step size does not follow the reward scale;
- :func:`kl_penalty`, the k3 estimator of KL(pi_theta || ref) per token, ref = the champion at the
  start of the cycle (the one the learner rebased onto, or read before its last checkpoint; see
  :mod:`learner.lineage`), which keeps the learner near what the gate compares it to;
- :func:`policy_gradient_loss` puts them together over the policy's tokens (the loss mask) only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LossConfig:
    """The loss settings.

    ``is_cap`` is c in ``min(pi/mu, c)``; ``clip_eps`` turns on PPO-style ratio clipping; ``kl_coef`` weighs
    the KL penalty to the reference policy (0 = off).
    """

    is_cap: float = 2.0
    clip_eps: float | None = None
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        if not self.is_cap > 0:
            raise ValueError(f"is_cap {self.is_cap} must be > 0; the default is 2.0")
        if self.clip_eps is not None and not 0 < self.clip_eps < 1:
            raise ValueError(f"clip_eps {self.clip_eps} must be in (0, 1) or None (off); 0.2 is usual")
        if not self.kl_coef >= 0:
            raise ValueError(f"kl_coef {self.kl_coef} must be >= 0; 0 turns the KL penalty off")


@dataclass(frozen=True)
class LossTerms:
    """The loss and what to report about it.

    ``loss`` is what ``backward()`` is called on; ``pg_loss`` and ``kl`` are its parts (``kl`` is the
    mean k3 estimate over masked tokens, 0 without a reference). The fractions are shares of the masked
    tokens; all reported floats are 0.0 for a batch with no masked token.
    """

    loss: torch.Tensor
    pg_loss: torch.Tensor
    kl: torch.Tensor
    mean_weight: float
    truncated_fraction: float
    clipped_fraction: float


def importance_ratio(logp: torch.Tensor, behaviour_logp: torch.Tensor) -> torch.Tensor:
    """``pi_theta / mu`` per token, ``exp(logp - behaviour_logp)``; gradients flow through ``logp``."""
    return torch.exp(logp - behaviour_logp)


def truncated_importance_weights(logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """``min(pi_theta / mu, cap)`` per token, detached: the weight scales the gradient, it is not optimised."""
    return torch.clamp(importance_ratio(logp, behaviour_logp), max=cap).detach()


def normalise_advantages(
    advantages: torch.Tensor, eps: float = 1e-6, weights: torch.Tensor | None = None
) -> torch.Tensor:
    """``(a - mean) / (std + eps)`` over the batch, population std; a batch of one (or none) gives zeros.

    A single sample has no batch to be compared with, so it carries no signal after normalisation.
    ``weights`` (one per advantage, positive) weigh the mean and the std: the learner gives each sample of a
    trajectory ``1 / its turns``, so that every trajectory counts once, whatever its length. The batch's size
    is then the weights' sum: under 1.5 (one trajectory, or one sample unweighted) gives zeros too.
    """
    spread = advantage_spread(advantages, eps, weights)
    if spread is None:
        return torch.zeros_like(advantages)
    if weights is None:
        weights = torch.ones_like(advantages)
    return (advantages - (weights * advantages).sum() / weights.sum()) / spread


def advantage_spread(advantages: torch.Tensor, eps: float = 1e-6, weights: torch.Tensor | None = None) -> float | None:
    """What :func:`normalise_advantages` divides by, ``std + eps`` (weighted as there); None where it gives zeros."""
    if weights is None:
        weights = torch.ones_like(advantages)
    total = weights.sum()
    if total < 1.5:
        return None
    centred = advantages - (weights * advantages).sum() / total
    return float(torch.sqrt((weights * centred**2).sum() / total)) + eps


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """The k3 estimator of KL(pi_theta || ref) per token: ``exp(ref - logp) - (ref - logp) - 1``.

    Unbiased on samples from pi_theta, never negative, and 0 exactly where the two logprobs agree.
    """
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1


def _check_shapes(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None,
) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp has shape {tuple(logp.shape)}; pass [batch, tokens]")
    named = {"behaviour_logp": behaviour_logp, "mask": mask}
    if ref_logp is not None:
        named["ref_logp"] = ref_logp
    for name, tensor in named.items():
        if tensor.shape != logp.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, logp {tuple(logp.shape)}; they must match")
    if advantages.shape not in (logp.shape[:1], logp.shape):
        raise ValueError(
            f"advantages has shape {tuple(advantages.shape)}; pass one per sample, ({logp.shape[0]},), "
            f"or one per token, {tuple(logp.shape)}"
        )


def policy_gradient_loss(
    logp: torch.Tensor,
    behaviour_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    ref_logp: torch.Tensor | None = None,
) -> LossTerms:
    """The loss of a batch: ``pg_loss + kl_coef * kl``, token-level means over the masked tokens.

    ``logp``, ``behaviour_logp``, ``mask`` and ``ref_logp`` are ``[B, T]``; ``advantages`` is ``[B]``
    (already normalised), or ``[B, T]`` where some tokens carry credit of their own (a turn's credited spans,
    :mod:`learner.token_spans`). Per token, without clipping the objective is ``w * A * logp`` with ``w`` the
    detached truncated weight (the truncated-IS policy gradient); with ``clip_eps`` it is
    ``min(r * A, clamp(r, 1 - eps, 1 + eps) * A)`` with ``r = min(ratio, is_cap)``, gradient through ``r``.
    ``pg_loss = -sum(mask * objective) / sum(mask)``. Clipping counts as active on a token where the
    clipped term is strictly the smaller one (so its gradient is cut). A batch with no masked token gives
    a zero loss that still backpropagates (to zero gradients). ``kl_coef > 0`` needs ``ref_logp``.
    """
    _check_shapes(logp, behaviour_logp, advantages, mask, ref_logp)
    if config.kl_coef > 0 and ref_logp is None:
        raise ValueError(f"kl_coef is {config.kl_coef} but no ref_logp was given; pass the reference logprobs")
    keep = mask > 0
    weights_mask = keep.to(logp.dtype)
    # Masked-out positions (padding, tool tokens) may hold anything, even logprobs whose ratio overflows;
    # zeroing them first keeps inf/nan out of both the values and the gradients.
    zero = torch.zeros_like(logp)
    logp_kept = torch.where(keep, logp, zero)
    behaviour_kept = torch.where(keep, behaviour_logp.to(logp.dtype), zero)
    count = weights_mask.sum()
    denominator = torch.clamp(count, min=1.0)
    adv = advantages.to(logp.dtype)
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1)

    ratio = importance_ratio(logp_kept, behaviour_kept)
    weights = torch.clamp(ratio, max=config.is_cap).detach()
    if config.clip_eps is None:
        objective = weights * adv * logp_kept
        clipped = torch.zeros_like(keep)
    else:
        capped = torch.clamp(ratio, max=config.is_cap)
        unclipped_term = capped * adv
        clipped_term = torch.clamp(capped, 1 - config.clip_eps, 1 + config.clip_eps) * adv
        objective = torch.minimum(unclipped_term, clipped_term)
        clipped = (clipped_term < unclipped_term).detach() & keep
    pg_loss = -(weights_mask * objective).sum() / denominator

    if ref_logp is None:
        kl = zero.sum()
    else:
        ref_kept = torch.where(keep, ref_logp.to(logp.dtype), zero)
        kl = (weights_mask * kl_penalty(logp_kept, ref_kept)).sum() / denominator
    # kl_coef 0 leaves the KL out entirely, so an overflowing estimate cannot turn the loss into nan.
    loss = pg_loss + config.kl_coef * kl if config.kl_coef > 0 else pg_loss

    tokens = float(count.item())
    if tokens == 0:
        return LossTerms(loss, pg_loss, kl, 0.0, 0.0, 0.0)
    return LossTerms(
        loss=loss,
        pg_loss=pg_loss,
        kl=kl,
        mean_weight=float((weights * weights_mask).sum().item()) / tokens,
        truncated_fraction=float(((ratio.detach() > config.is_cap) & keep).sum().item()) / tokens,
        clipped_fraction=float(clipped.sum().item()) / tokens,
    )
