"""Counting an agent scenario's trajectories by the policy version that served them, for the summary and report.

Each scenario's session runner returns one record per trajectory (``policy_version`` set to the version that served
its first model turn); a :class:`VersionTally` keeps them and hands each version's records to the scenario's own
figures function (rates and means with 95 % intervals, :func:`~liveloop.demo.simulator.stats.rate_figure` and
:func:`~liveloop.demo.simulator.stats.mean_figure`), so the three tallies differ only in what they count.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar


class Versioned(Protocol):
    """A trajectory's record: the policy version it is counted under (``None``: no model turn, not counted)."""

    @property
    def policy_version(self) -> int | None: ...


R = TypeVar("R", bound=Versioned)


class VersionTally(Generic[R]):
    """Records by policy version and their figures (thread-safe: sessions run on threads)."""

    def __init__(self, figures: Callable[[int, list[R]], dict[str, Any]]) -> None:
        self._figures = figures
        self._lock = threading.Lock()
        self._by_version: dict[int, list[R]] = defaultdict(list)

    def add(self, record: R) -> None:
        """Count one trajectory (not one that no model served: it says nothing of any version)."""
        if record.policy_version is None:
            return
        with self._lock:
            self._by_version[record.policy_version].append(record)

    def versions(self) -> list[dict[str, Any]]:
        """The figures of each policy version seen, oldest first (each starts with ``policy_version`` and
        ``trajectories``)."""
        with self._lock:
            snapshot = {version: list(records) for version, records in self._by_version.items()}
        return [self._figures(version, records) for version, records in sorted(snapshot.items())]
