"""How one simulated user reacts to one completion: a pure function of the profile, the text and a seeded RNG.

The reaction follows the profile's hidden preference (:meth:`Profile.prefers`; a coin flip for a ``coin_flip``
profile) with noise, the way people
react to a code assistant:

- accept (probability ``accept_preferred`` if preferred, else ``accept_other``), otherwise reject or dismiss
  (even odds: an explicit "no" or just typing on);
- an accepted edit is checked later: a preferred one persists (``fraction_remaining`` 0.7-1.0) nine times in
  ten, else is reverted; a disliked one is reverted seven times in ten, else mostly rewritten (0.05-0.4 left);
- a disliked completion that was not accepted gets a dissatisfied follow-up 40 % of the time (half of them
  rephrase), and then the user asks again (:attr:`Reaction.ask_again`);
- one reaction in ten carries a thumbs rating that follows the preference (wrong one time in ten);
- tool calls in the completion are run by the IDE and reported (``tool.result``) valid or not. The user's
  judgement ignores their validity: that is the loophole only the distiller's guard penalises.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal

from liveloop.demo.simulator.language import Parsed, parse
from liveloop.demo.simulator.profiles import Profile

Outcome = Literal["accepted", "rejected", "dismissed"]

RATING_SHARE = 0.1
FOLLOWUP_SHARE = 0.4


@dataclass(frozen=True)
class EditCheck:
    """A later look at an accepted edit: persisted (with the share left) or reverted."""

    persisted: bool
    fraction_remaining: float


@dataclass(frozen=True)
class Followup:
    """The user's next message, as the product classifies it."""

    dissatisfied: bool
    rephrase: bool


@dataclass(frozen=True)
class Reaction:
    """Everything one user does about one completion (the session turns it into feedback events)."""

    preferred: bool
    outcome: Outcome
    edit: EditCheck | None
    followup: Followup | None
    rating: Literal["up", "down"] | None
    tool_results: tuple[tuple[str, bool], ...]

    @property
    def ask_again(self) -> bool:
        """Unhappy users ask again (the same prompt) after a dissatisfied follow-up."""
        return self.followup is not None


def react(
    profile: Profile, completion: str, rng: random.Random, *, elapsed_s: float = 0.0, fickle_period_s: float = 120.0
) -> Reaction:
    """The reaction of a user of ``profile`` to ``completion``, drawing only from ``rng``."""
    parsed: Parsed = parse(completion)
    preferred = rng.random() < 0.5 if profile.coin_flip else profile.prefers(parsed, elapsed_s, fickle_period_s)
    accepted = rng.random() < profile.accept_probability(preferred)
    edit: EditCheck | None = None
    followup: Followup | None = None
    outcome: Outcome
    if accepted:
        outcome = "accepted"
        if preferred:
            edit = EditCheck(True, round(rng.uniform(0.7, 1.0), 3)) if rng.random() < 0.9 else EditCheck(False, 0.0)
        else:
            edit = EditCheck(False, 0.0) if rng.random() < 0.7 else EditCheck(True, round(rng.uniform(0.05, 0.4), 3))
    else:
        outcome = "rejected" if rng.random() < 0.5 else "dismissed"
        if not preferred and rng.random() < FOLLOWUP_SHARE:
            followup = Followup(dissatisfied=True, rephrase=rng.random() < 0.5)
    rating: Literal["up", "down"] | None = None
    if rng.random() < RATING_SHARE:
        happy = preferred != (rng.random() < 0.1)
        rating = "up" if happy else "down"
    return Reaction(preferred, outcome, edit, followup, rating, parsed.tool_calls)
