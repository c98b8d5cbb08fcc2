"""An in-memory index of when each session next needs a tick: its earliest open window, or its expiry.

Ticks must not read every session's state: with thousands of live sessions that is most of the
distiller's time. Nor may a tick scan every session's deadline: a session stays indexed until it
expires (the longest window, an hour by default), so at a steady 500 sessions/s the index holds
about two million sessions. Each partition keeps a min-heap of deadlines; a tick pops only what is
due. The table stays the source of truth; this index is derived from it, rebuilt by one scan after
start or a rebalance, and kept current as events change sessions.
"""

from __future__ import annotations

import heapq

from distill.sessions import ORPHAN_GRACE_S, SessionState, orphans_due, trajectory_due
from distill.spec import RewardSpec


class DeadlineIndex:
    """Session key -> the wall-clock time (epoch seconds) at which a tick has work for it."""

    def __init__(self, spec: RewardSpec, settled_after_s: float, orphan_grace_s: float = ORPHAN_GRACE_S) -> None:
        self._spec = spec
        self._settled_after_s = settled_after_s
        self._orphan_grace_s = orphan_grace_s
        self._due: dict[int, dict[bytes, float]] = {}
        # Per partition, (deadline, key) with superseded entries left in place: an entry counts only
        # while it matches ``_due``, and the heap is rebuilt when stale entries outnumber live ones.
        self._heaps: dict[int, list[tuple[float, bytes]]] = {}
        self.built = False

    def reset(self) -> None:
        """Forget everything (partitions moved): the next tick rebuilds from the table."""
        self._due.clear()
        self._heaps.clear()
        self.built = False

    def update(self, key: bytes, partition: int, state: SessionState) -> None:
        """Record when ``state`` next needs a tick: a window closes, its outbox settles, its orphans stop
        waiting, a trajectory is due (:func:`distill.sessions.trajectory_due`), or it expires."""
        if state.pending:
            due = min(p.final_at.timestamp() for p in state.pending.values())
        elif state.outbox:
            due = min(at for _, at in state.outbox.values()) + self._settled_after_s
        else:
            due = state.touched_at + self._spec.windows_s.longest
        if state.orphans:
            due = min(due, orphans_due(state, self._spec, self._orphan_grace_s))
        for trajectory in state.trajectories.values():
            due = min(due, trajectory_due(state, trajectory, self._spec, self._orphan_grace_s))
        current = self._due.setdefault(partition, {})
        if current.get(key) == due:
            return
        current[key] = due
        heap = self._heaps.setdefault(partition, [])
        heapq.heappush(heap, (due, key))
        if len(heap) > 2 * len(current) + 1024:
            self._heaps[partition] = [(at, k) for k, at in current.items()]
            heapq.heapify(self._heaps[partition])

    def forget(self, key: bytes, partition: int) -> None:
        """Drop the key (its session was deleted)."""
        self._due.get(partition, {}).pop(key, None)

    def due(self, partition: int, now: float) -> list[bytes]:
        """Keys of ``partition`` with work at ``now``, each once, earliest first.

        They leave the index; the caller updates (or forgets) each after its tick.
        """
        heap = self._heaps.get(partition)
        current = self._due.get(partition, {})
        keys: list[bytes] = []
        while heap and heap[0][0] <= now:
            at, key = heapq.heappop(heap)
            if current.get(key) == at:
                del current[key]
                keys.append(key)
        return keys

    def __len__(self) -> int:
        return sum(len(current) for current in self._due.values())
