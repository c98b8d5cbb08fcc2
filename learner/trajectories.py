"""Holding an agent trajectory's samples until all its turns arrived, so that they train as one unit.

The distiller emits one sample per trainable turn of a finished trajectory, each carrying
``agent.trajectory_turns`` (how many there are). Samples are keyed by sample id, so a trajectory's samples
spread over partitions and can straddle two rounds. Training half a trajectory would give it two
optimiser steps and two advantages (its turns one unit no longer), so :class:`TrajectoryHold` keeps
admitted agent samples back until the trajectory's last trainable turn arrived.

Bounded: a trajectory still incomplete ``wait_rounds`` rounds after the round its first turn came in
(a turn lost upstream, or a held-out or stale turn) trains as it is, counted as ``incomplete``.

Every sample intake saw (admitted or dropped, duplicates excepted) counts as an arrived turn, so a turn that
intake drops (held out, stale) does not keep the rest of its trajectory waiting. Frozen turns do not
count: ``trajectory_turns`` counts trainable turns only.

The hold is part of the learner's state: held samples are already admitted (remembered as seen) but not
trained, and their offsets lie behind the checkpoint's positions, so a checkpoint stores them
(:class:`learner.state.TrainingState`) and a restart or a rebase starts from exactly that hold; the
rounds replayed after it then release the same samples in the same order.
"""

from __future__ import annotations

from collections.abc import Iterable
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from distill.samples import Sample
from learner.metrics import TRAJECTORIES_HELD, TRAJECTORIES_RELEASED


class HeldTrajectory(BaseModel):
    """One trajectory waiting for its other turns."""

    model_config = ConfigDict(extra="forbid")

    trajectory_id: UUID
    turns: int = Field(ge=1, description="Its trainable turns, from the samples' agent.trajectory_turns.")
    arrived: list[UUID] = Field(default_factory=list, description="Turn ids seen so far (admitted or dropped).")
    samples: list[Sample] = Field(default_factory=list, description="Its admitted samples, in arrival order.")
    rounds_waited: int = Field(default=0, ge=0, description="Rounds ended since its first turn arrived.")


class TrajectoryHold:
    """Admitted agent samples waiting for their trajectory to complete; see the module docstring.

    ``counts`` holds how many trajectories were released ``complete`` or ``incomplete`` since this hold was
    made (a checkpoint or a rebase starts a new one, as it starts a new intake).
    """

    def __init__(self, wait_rounds: int, held: Iterable[HeldTrajectory] = ()) -> None:
        if wait_rounds < 0:
            raise ValueError(f"wait_rounds {wait_rounds} must be >= 0; 0 releases a trajectory in its own round")
        self.wait_rounds = wait_rounds
        # Copies: the state this came from (a checkpoint's) must stay as it was, for a later rebase to restart from.
        self._held: dict[UUID, HeldTrajectory] = {item.trajectory_id: item.model_copy(deep=True) for item in held}
        self.counts: dict[str, int] = {"complete": 0, "incomplete": 0}
        TRAJECTORIES_HELD.set(len(self._held))

    def __len__(self) -> int:
        return len(self._held)

    def offer(self, sample: Sample, admitted: bool) -> list[Sample]:
        """Take one sample of a round (in the round's order); return what may train now.

        A single-turn sample trains at once if ``admitted``. An agent turn is held if admitted, and counted as
        arrived either way (frozen turns excepted); the turn that completes its trajectory releases all of
        the trajectory's held samples.
        """
        credit = sample.agent
        if credit is None:
            return [sample] if admitted else []
        if credit.frozen:
            return []
        item = self._held.get(credit.trajectory_id)
        if item is None:
            item = HeldTrajectory(trajectory_id=credit.trajectory_id, turns=credit.trajectory_turns)
            self._held[credit.trajectory_id] = item
        if credit.turn_id in item.arrived:
            return []  # a turn arrives once: another sample of it (a replay under another spec) is not another turn
        item.arrived.append(credit.turn_id)
        if admitted:
            item.samples.append(sample)
        released: list[Sample] = []
        if len(item.arrived) >= item.turns:
            del self._held[credit.trajectory_id]
            released = self._release(item, "complete")
        TRAJECTORIES_HELD.set(len(self._held))
        return released

    def end_round(self) -> list[Sample]:
        """Age every held trajectory by one round; return the samples of those that waited long enough."""
        released: list[Sample] = []
        for trajectory_id in list(self._held):
            item = self._held[trajectory_id]
            if item.rounds_waited >= self.wait_rounds:
                del self._held[trajectory_id]
                released += self._release(item, "incomplete")
            else:
                item.rounds_waited += 1
        TRAJECTORIES_HELD.set(len(self._held))
        return released

    def _release(self, item: HeldTrajectory, how: str) -> list[Sample]:
        # A trajectory none of whose turns was admitted (all held out, or a late re-delivery) trains nothing
        # and is no trajectory released.
        if item.samples:
            self.counts[how] += 1
            TRAJECTORIES_RELEASED.labels(how=how).inc()
        return item.samples

    def state(self) -> list[HeldTrajectory]:
        """The held trajectories, for the checkpoint's training state (copies, in arrival order)."""
        return [item.model_copy(deep=True) for item in self._held.values()]

    def held_samples(self) -> int:
        """Admitted samples waiting in the hold."""
        return sum(len(item.samples) for item in self._held.values())
