"""Small statistics the simulator's summary and the demo report share."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any


def wilson_interval(successes: int, trials: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95 % for the default ``z``).

    Better than the normal approximation at the small counts and extreme rates a young policy version has;
    ``(0.0, 1.0)`` when there are no trials (nothing is known).
    """
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes ({successes}) <= trials ({trials})")
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # At 0 or all successes the bound is exactly 0 or 1; the formula leaves rounding dust there.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two closed intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]


def mean_interval(
    values: Sequence[float], z: float = 1.959963984540054
) -> tuple[float | None, float | None, float | None]:
    """The mean of ``values`` and its normal-approximation interval (95 % for the default ``z``); ``None`` for
    what is not known: the mean without values, the interval with fewer than two (no spread to go by)."""
    if not values:
        return None, None, None
    mean = math.fsum(values) / len(values)
    if len(values) < 2:
        return mean, None, None
    spread = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))
    half = z * spread / math.sqrt(len(values))
    return mean, mean - half, mean + half


def rate_figure(flags: Iterable[bool]) -> dict[str, Any]:
    """A rate as the simulator's summary and the demo report carry it: ``{"rate", "n", "low", "high"}``, with the
    95 % Wilson interval; ``rate`` is ``None`` without values (nothing is known, and the interval is ``[0, 1]``)."""
    values = list(flags)
    hits = sum(values)
    low, high = wilson_interval(hits, len(values))
    return {"rate": hits / len(values) if values else None, "n": len(values), "low": low, "high": high}


def mean_figure(numbers: Iterable[float]) -> dict[str, Any]:
    """A mean as the summary and the report carry it: ``{"mean", "n", "low", "high"}``, with the 95 % normal
    interval of :func:`mean_interval` (``None`` where it is not known)."""
    values = list(numbers)
    mean, low, high = mean_interval(values)
    return {"mean": mean, "n": len(values), "low": low, "high": high}
