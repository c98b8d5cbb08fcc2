"""A value computed in the background every ``period_s`` seconds, so that readers never wait for it.

The dashboard's pages show what MLflow (the champion and candidate aliases), the components' status
endpoints and Kafka (consumer lag) say. Asked on each request, those answers cost a page seconds on a busy
machine (1.3-1.5 s at p95 for MLflow's aliases alone), and a hung service would cost it its timeouts.
So a thread owned by the app's lifespan computes them every ``period_s``, and a page renders the latest
snapshot with its age. An operator's action refreshes it at once (:meth:`Snapshot.refresh`), so that
what they did shows on the next page without waiting for the period.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import Histogram

T = TypeVar("T")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Taken(Generic[T]):
    """One computed value and when its computation started (``time.monotonic()``)."""

    value: T
    started: float

    def age_s(self) -> float:
        """Seconds since the computation of this value started: how old, at most, what it says is."""
        return max(0.0, time.monotonic() - self.started)


class Snapshot(Generic[T]):
    """The latest ``compute()``, refreshed every ``period_s`` by :meth:`start`'s thread or on demand."""

    def __init__(
        self, compute: Callable[[], T], period_s: float, name: str, durations: Histogram | None = None
    ) -> None:
        self._compute = compute
        self.period_s = period_s
        self._name = name
        self._durations = durations
        self._lock = threading.Lock()
        self._taken: Taken[T] | None = None
        self._first = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def latest(self, wait_s: float = 0.0) -> Taken[T] | None:
        """The latest value; before the first one exists, wait up to ``wait_s`` for it, then None."""
        if self._taken is None:
            self._first.wait(wait_s)
        return self._taken

    def refresh(self) -> Taken[T] | None:
        """Compute now and keep the result, unless a computation that started later has already been kept.

        The guard matters when a background refresh, begun before an operator's action, ends after the
        refresh that the action asked for: its older view must not replace the newer one.
        Returns what is kept afterwards; a computation that raises keeps the previous value (and is logged).
        """
        started = time.monotonic()
        try:
            value = self._compute()
        except Exception:
            # The thread must outlive one bad computation; the pages keep the last good value and its age.
            log.exception("refreshing the %s failed; the pages keep the previous one", self._name)
            return self._taken
        finally:
            if self._durations is not None:
                self._durations.observe(time.monotonic() - started)
        with self._lock:
            if self._taken is None or self._taken.started <= started:
                self._taken = Taken(value, started)
                self._first.set()
            return self._taken

    def start(self) -> None:
        """Refresh now and then every ``period_s`` in a daemon thread, until :meth:`stop`."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"refresh-{self._name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (it finishes a computation under way first, for at most ``timeout_s``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            # The period runs from the end of one computation: a slow service never stacks computations up.
            self._stop.wait(self.period_s)
