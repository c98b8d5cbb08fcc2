"""The reward baseline: an exponential moving average of rewards per bucket (task kind, else surface).

Rewards differ by surface and task (an accepted tab completion is not an agent run passing its tests),
so each bucket keeps its own baseline and the advantage is ``reward - baseline(bucket)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from distill.samples import Sample


def bucket_of(sample: Sample) -> str:
    """The sample's baseline bucket: ``"task:<task_kind>"``, or ``"surface:<surface>"`` without a task kind.

    The prefix keeps a task kind and a surface that happen to share a name in separate buckets.
    """
    if sample.task_kind is not None:
        return f"task:{sample.task_kind}"
    return f"surface:{sample.surface}"


class EmaBaseline:
    """Per-bucket exponential moving average of rewards.

    Two choices, both about a bucket's first batch:

    - :meth:`value` of a bucket never seen is 0.0, the neutral reward (rewards are clipped around 0):
      its first samples' advantage is then their raw reward, which the per-batch normalisation centres
      anyway; any other guess would be a reward we never observed.
    - The first observation initialises the average (``b = r``) rather than decaying from 0: starting at
      0 would drag a bucket's baseline toward 0 for its first ~1/(1-decay) rewards, a bias that
      Adam-style correction would also remove but with more state to checkpoint.
    """

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay {decay} must be in [0, 1); 0.9 averages over about 10 rewards")
        self.decay = decay
        self._values: dict[str, float] = {}

    def value(self, bucket: str) -> float:
        """The bucket's baseline; 0.0 for a bucket never seen (see the class docstring)."""
        return self._values.get(bucket, 0.0)

    def advantages(self, rewards: Sequence[float], buckets: Sequence[str]) -> list[float]:
        """``reward - baseline(bucket)`` per sample, with the baselines as they were before this batch."""
        _check_lengths(rewards, buckets)
        return [reward - self.value(bucket) for reward, bucket in zip(rewards, buckets, strict=True)]

    def update(self, rewards: Sequence[float], buckets: Sequence[str]) -> None:
        """Fold the rewards in, in order: ``b <- decay * b + (1 - decay) * r``; a bucket's first reward sets ``b``."""
        _check_lengths(rewards, buckets)
        for reward, bucket in zip(rewards, buckets, strict=True):
            previous = self._values.get(bucket)
            self._values[bucket] = (
                float(reward) if previous is None else self.decay * previous + (1 - self.decay) * reward
            )

    def state_dict(self) -> dict[str, float]:
        """The baselines of every bucket seen, for the checkpoint (a copy)."""
        return dict(self._values)

    def load_state_dict(self, state: Mapping[str, float]) -> None:
        """Replace the baselines with those of a checkpoint; buckets absent from it count as never seen."""
        self._values = {str(bucket): float(value) for bucket, value in state.items()}


def _check_lengths(rewards: Sequence[float], buckets: Sequence[str]) -> None:
    if len(rewards) != len(buckets):
        raise ValueError(f"{len(rewards)} rewards for {len(buckets)} buckets; pass one bucket per reward")
