"""The per-user cap as the admit stage applies it: one small state per user.

The admit stage sees every scored sample once more (a repeat after a restart, too), keyed by user.
:class:`UserAdmissions` is the value of its table: the user's sliding window
(:func:`distill.guards.admit_user`) and the ids of the samples it admitted lately, so that a repeat
is passed on again without spending the user's cap twice.

The stage reads of each sample only what the cap needs (:class:`ScoredSample`); the sample itself
passes on as the JSON that ``sessionize`` wrote from a validated :class:`distill.samples.Sample`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from distill.guards import UserWindow, admit_user
from distill.spec import Guards


class Admissible(Protocol):
    """What the per-user cap reads of a sample (a :class:`distill.samples.Sample` has it too)."""

    @property
    def sample_id(self) -> str: ...

    @property
    def generated_at(self) -> datetime: ...


class ScoredSample(BaseModel):
    """The fields of a scored sample's JSON that the admit stage reads; the others are left unread.

    The scored topic is the distiller's own: its samples were validated when ``sessionize`` built them,
    and validating each again in full cost the admit stage more than the cap itself.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    sample_id: str
    user_id: str
    generated_at: AwareDatetime


class UserAdmissions(BaseModel):
    """One user's admission state: the sliding window and the samples admitted lately."""

    model_config = ConfigDict(extra="forbid")

    window: UserWindow | None = None
    admitted_ids: list[str] = Field(default_factory=list, description="The newest admitted sample ids, oldest first.")

    def admit(self, sample: Admissible, guards: Guards) -> bool:
        """Whether the sample goes on to the samples topic; updates the state.

        A sample admitted before (published again from an outbox after a start) is passed on again
        and spends nothing; any other counts against the user's cap (:func:`distill.guards.admit_user`).
        """
        if sample.sample_id in self.admitted_ids:
            return True
        admitted, self.window = admit_user(self.window, sample.generated_at, guards)
        if admitted:
            self.admitted_ids = [*self.admitted_ids, sample.sample_id][-guards.max_samples_per_user_per_window :]
        return admitted

    def dump(self) -> bytes:
        """The state as compact JSON bytes (the table's value)."""
        return self.model_dump_json().encode()

    @classmethod
    def load(cls, data: bytes | None) -> UserAdmissions:
        """The state from its JSON bytes; a user never seen starts empty."""
        return cls() if not data else cls.model_validate_json(data)
