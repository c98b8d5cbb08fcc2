"""A value recomputed at most once per period, however many requests ask for it at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Recent(Generic[T]):
    """``compute()``'s result, reused while younger than ``max_age_s`` (0: computed on every call).

    The dashboard's pages and its polling overview read MLflow and every component's status: a few hundred
    milliseconds on a busy machine. Reusing a second-old answer keeps pages fast however many operators have
    them open; actions never read through it (the promoter reads the aliases itself, under its lock).
    """

    def __init__(self, compute: Callable[[], T], max_age_s: float) -> None:
        self._compute = compute
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._cached: tuple[float, T] | None = None

    def get(self) -> T:
        """The latest value, recomputed when older than ``max_age_s``."""
        with self._lock:  # one computation at a time; callers arriving meanwhile share its result
            now = time.monotonic()
            if self._cached is None or now - self._cached[0] > self.max_age_s:
                self._cached = (now, self._compute())
            return self._cached[1]
