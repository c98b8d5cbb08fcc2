"""An in-memory index of when each session next needs a tick: its earliest open window, or its expiry.

Ticks must not read every session's state: with thousands of live sessions that is most of the
distiller's time. The table stays the source of truth; this index is derived from it, rebuilt by
one scan after start or a rebalance, and kept current as events change sessions.
"""

from __future__ import annotations

from distill.sessions import SessionState
from distill.spec import RewardSpec


class DeadlineIndex:
    """Session key -> the wall-clock time (epoch seconds) at which a tick has work for it."""

    def __init__(self, spec: RewardSpec, settled_after_s: float) -> None:
        self._spec = spec
        self._settled_after_s = settled_after_s
        self._due: dict[int, dict[str, float]] = {}
        self.built = False

    def reset(self) -> None:
        """Forget everything (partitions moved): the next tick rebuilds from the table."""
        self._due.clear()
        self.built = False

    def update(self, key: str, partition: int, state: SessionState) -> None:
        """Record when ``state`` next needs a tick: a window closes, its outbox settles, or it expires."""
        if state.pending:
            due = min(p.final_at.timestamp() for p in state.pending.values())
        elif state.outbox:
            due = min(at for _, at in state.outbox.values()) + self._settled_after_s
        else:
            due = state.touched_at + self._spec.windows_s.longest
        self._due.setdefault(partition, {})[key] = due

    def forget(self, key: str, partition: int) -> None:
        self._due.get(partition, {}).pop(key, None)

    def due(self, partition: int, now: float) -> list[str]:
        """Keys of ``partition`` with work at ``now``."""
        return [key for key, at in self._due.get(partition, {}).items() if at <= now]
