"""Pure anti-gaming guards the streaming app applies around :func:`distill.reward.score`.

Production RL finds every loophole; these keep one user, one session or one re-delivered event from
steering training, and watch deferral. Each guard is a pure function over a small serialisable
state, which the app keeps in a table; none reads a clock (times are event times), so replay gives
the same decisions. Each has its own counter name; the app registers the metrics.

- Per-user cap (:func:`admit_user`): at most ``max_samples_per_user_per_window`` samples per user in
  any sliding window of ``user_window_s`` seconds, counted in admitted samples. A user sending half
  the traffic thus gets at most that many samples per window, whatever they send. The state is per
  user: the app keeps one :class:`UserWindow` per ``user_id``, in a table partitioned by user.
- Per-session cap (:func:`admit_session`): at most ``max_samples_per_session`` samples per session.
- Duplicates (:func:`dedupe_key`): the app keeps the keys of events it has seen in a table, for at
  least the longest window (a later copy is late anyway); the first copy wins, later copies are
  dropped and counted. :func:`distill.reward.score` dedupes by ``event_id`` too, so a duplicate that
  slips through (a table lost in a crash) cannot change a reward, and the deterministic sample id
  lets consumers drop a re-published sample.
- Deferral (:class:`DeferralStats`): the share of samples per policy version that deferred work
  with a question, so that a checkpoint learning to ask instead of act shows up on the dashboard.

Invalid tool calls need no state: the reward spec forces a negative weight and the loader rejects a
clip that could hide it (:class:`distill.spec.RewardSpec`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from distill.spec import Guards
from ingest.events import EventBase

USER_CAP_COUNTER = "liveloop_distill_user_capped_total"
"""Samples dropped because their user reached the per-user cap."""
SESSION_CAP_COUNTER = "liveloop_distill_session_capped_total"
"""Samples dropped because their session reached the per-session cap."""
DUPLICATE_EVENTS_COUNTER = "liveloop_distill_duplicate_events_total"
"""Events dropped because an event with the same key was seen before."""
DEFERRALS_COUNTER = "liveloop_distill_deferrals_total"
"""Samples flagged as deferrals, labelled by policy version."""
INVALID_TOOL_CALLS_COUNTER = "liveloop_distill_invalid_tool_calls_total"
"""Invalid tool calls penalised, labelled by policy version."""


class UserWindow(BaseModel):
    """One user's admitted sample times within the current sliding window, oldest first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    admitted_at: tuple[AwareDatetime, ...] = ()


def admit_user(state: UserWindow | None, at: datetime, guards: Guards) -> tuple[bool, UserWindow]:
    """Whether a sample of this user at event time ``at`` is admitted, and the user's new state.

    The window is ``(at - user_window_s, at]``; samples the user was refused do not count, so a
    flood cannot keep a user out once it stops. Times at or after ``at`` (events out of order) are
    kept and counted, which errs on the side of capping. ``None`` is a user never seen.
    """
    since = at - timedelta(seconds=guards.user_window_s)
    recent = tuple(t for t in (state.admitted_at if state else ()) if t > since)
    if len(recent) >= guards.max_samples_per_user_per_window:
        return False, UserWindow(admitted_at=recent)
    return True, UserWindow(admitted_at=tuple(sorted((*recent, at))))


def admit_session(admitted: int, guards: Guards) -> tuple[bool, int]:
    """Whether one more sample of a session that already has ``admitted`` samples is admitted, and the new count."""
    if admitted >= guards.max_samples_per_session:
        return False, admitted
    return True, admitted + 1


def dedupe_key(event: EventBase) -> str:
    """The key under which the app remembers an event: ``"<tenant>:<event_id>"``.

    Scoped by tenant so that one tenant reusing another's event ids cannot suppress that tenant's events.
    """
    return f"{event.tenant}:{event.event_id}"


class DeferralCount(BaseModel):
    """Samples and deferrals of one policy version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: int = Field(default=0, ge=0)
    deferrals: int = Field(default=0, ge=0)


class DeferralStats(BaseModel):
    """A mutable accumulator of deferral rates per policy version; serialisable with ``model_dump_json``."""

    model_config = ConfigDict(extra="forbid")

    counts: dict[int, DeferralCount] = Field(default_factory=dict)

    def record(self, policy_version: int, deferral: bool) -> None:
        """Count one sample of ``policy_version``, and whether it was a deferral."""
        old = self.counts.get(policy_version, DeferralCount())
        self.counts[policy_version] = DeferralCount(samples=old.samples + 1, deferrals=old.deferrals + int(deferral))

    def rate(self, policy_version: int) -> float | None:
        """The share of the version's samples that were deferrals; ``None`` before its first sample."""
        count = self.counts.get(policy_version)
        return None if count is None else count.deferrals / count.samples
