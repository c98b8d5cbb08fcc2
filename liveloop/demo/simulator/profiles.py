"""User profiles: each has a hidden preference over completions that a policy can learn from feedback.

The preference is a deterministic judgement of the completion text (:func:`liveloop.demo.simulator.language.parse`)
and, for ``fickle``, of the time since the run started. Users act on it with noise: a preferred completion is
accepted with probability ``accept_preferred`` (0.9 by default), any other with ``accept_other`` (0.1).

Profiles (names are the ``--profile`` values):

- ``semicolons``: prefers a well-formed statement that ends with ``;``. The base corpus ends 40 % of its
  lines with ``;`` and the pre-trained base writes well-formed lines about nine times in ten (completions are
  requested with ``stop=["\\n"]``), so its acceptance starts near 40 % and can rise to about 90 %.
- ``snake_case``: prefers a well-formed statement that uses at least one two-word name, all of them in
  snake_case (``max_len``, not ``maxLen``).
- ``fickle``: the ``semicolons`` preference, but its polarity flips every ``fickle_period_s`` seconds of run
  time (first ``;``, then no ``;``, ...). A checkpoint trained on one period's feedback is served in the next,
  where it is worse than the champion: this is the profile that makes a degraded candidate likely, for the
  evaluation gate to reject.
- ``noisy``: no preference at all: each user likes a completion on a coin flip (well-formed or not), so the
  feedback is pure noise and there is nothing to learn. Candidates only drift, and about half of them score
  below the champion: the second way to see the gate hold a candidate back (and a control for the others).

In every profile users look only at the end of a line that holds a tool call (``@fmt(x`` passes their look),
so malformed tool calls go unpunished by users: the loophole that only the distiller's guard closes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from liveloop.demo.simulator.errors import UnknownProfile
from liveloop.demo.simulator.language import DEFAULT_MIX, CorpusMix, Parsed


@dataclass(frozen=True)
class Profile:
    """A kind of user: a hidden preference, how noisily they act on it, and the corpus the base learns."""

    name: str
    description: str
    accept_preferred: float = 0.9
    accept_other: float = 0.1
    corpus_mix: CorpusMix = field(default=DEFAULT_MIX)
    coin_flip: bool = False

    def prefers(self, parsed: Parsed, elapsed_s: float = 0.0, fickle_period_s: float = 120.0) -> bool:
        """Whether users of this profile like the completion, ``elapsed_s`` seconds into the run.

        For a ``coin_flip`` profile this is the semicolons judgement, which its users ignore (see :func:`liveloop.
        simulator.users.react`); it is kept so that reports can still show how the style drifts.
        """
        if not parsed.user_well_formed:
            return False
        if self.name == "snake_case":
            return parsed.snake_names > 0 and parsed.camel_names == 0
        if self.name == "fickle":
            flipped = int(elapsed_s // fickle_period_s) % 2 == 1
            return parsed.semicolon != flipped
        return parsed.semicolon

    def accept_probability(self, preferred: bool) -> float:
        """The chance that a user accepts a completion they prefer (or not)."""
        return self.accept_preferred if preferred else self.accept_other


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("semicolons", "accepts well-formed statements that end with ';'"),
        Profile("snake_case", "accepts well-formed statements whose two-word names are all snake_case"),
        Profile("fickle", "the semicolons preference, flipping polarity every fickle_period_s seconds"),
        Profile("noisy", "no preference: likes a completion on a coin flip", coin_flip=True),
    )
}
"""Every profile by name."""


def profile_by_name(name: str) -> Profile:
    """The profile called ``name``; :class:`UnknownProfile` names the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise UnknownProfile(f"unknown profile {name!r}; use one of {', '.join(PROFILES)}") from None
