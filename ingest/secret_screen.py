"""A cheap screen in front of the secret detectors: most text provably holds no secret, and skips them.

:func:`ingest.redaction.redact_text` runs a detector only where a necessary condition holds: a
shape rule needs one of its ``hints`` (a substring, case-folded for ``fold`` rules), an assignment
needs one of the key words in the lower-cased text, and the high-entropy rule needs a run of 32
base64-ish characters. :func:`may_hold_secret` tests all of these conditions at once, so that a
text failing it is returned unchanged without running any detector: the screen may say "maybe" for
ordinary text (it then costs one extra pass), but never "no" where a detector could fire.

Why it is fast: the conditions are one regex over the lower-cased text, and each needle is written to
start at its rarest character in source code (``ken(?<=token)``: ``k`` is rare, ``t`` is not), so the
regex engine's first-character filter skips almost every position in C. Case-sensitive hints whose
every character is common (``ASIA``) are tested on the original text with ``in`` instead.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

from ingest.secret_rules import KEY_WORDS, SHAPE_RULES, Rule, has_token_run

# Lower-cased characters of Python source, rarest first (measured on 400 files of installed packages);
# characters not listed (control characters, non-ASCII) count as the rarest.
_RAREST_FIRST = "&^;?~%!<@$789\\|6+5j4}{3/>qz*#2010`][-wkxvby=:\"'()gh.,umfcp_dlonrias te"
_RANK = {char: rank for rank, char in enumerate(_RAREST_FIRST)}
_COMMON_RANK = _RANK["p"]  # a needle whose rarest character is this common is better tested with `in`


def _rarest(needle: str) -> int:
    """Index of the needle's rarest character (the last one on ties, so that fewer look-behinds are needed)."""
    return min(range(len(needle)), key=lambda i: (_RANK.get(needle[i], -1), -i))


def _anchored(needle: str) -> str:
    """A regex matching exactly where ``needle`` ends, that starts at the needle's rarest character."""
    start = _rarest(needle)
    rest = re.escape(needle[start:])
    return rest if start == 0 else f"{rest}(?<={re.escape(needle)})"


def _minimal(needles: Iterable[str]) -> list[str]:
    """The needles that do not contain another needle (if the shorter one is absent, so is the longer)."""
    unique = set(needles)
    return sorted(n for n in unique if not any(other != n and other in n for other in unique))


def _build(rules: tuple[Rule, ...], key_words: tuple[str, ...]) -> tuple[re.Pattern[str] | None, tuple[str, ...]]:
    if any(not rule.hints for rule in rules):
        return None, ()  # a rule without hints runs on every text: nothing can be screened out
    folded: set[str] = set(key_words)
    exact: set[str] = set()
    for rule in rules:
        for hint in rule.hints:
            # A hint found in the text is found, lower-cased, in the lower-cased text: testing the
            # lower-cased hint there is a necessary condition for both kinds of rule.
            lowered = hint.lower()
            if rule.fold or _RANK.get(lowered[_rarest(lowered)], -1) < _COMMON_RANK:
                folded.add(lowered)
            else:
                exact.add(hint)
    # One branch per first character, so the regex engine tries few alternatives at a candidate position.
    by_first: defaultdict[str, list[str]] = defaultdict(list)
    for needle in _minimal(folded):
        pattern = _anchored(needle)
        by_first[needle[_rarest(needle)]].append(pattern)
    branches = []
    for first, patterns in sorted(by_first.items()):
        head = re.escape(first)  # re.escape works character by character: every pattern starts with it
        rests = [pattern[len(head) :] for pattern in patterns]
        branches.append(patterns[0] if len(patterns) == 1 else f"{head}(?:{'|'.join(rests)})")
    return re.compile("|".join(branches)), tuple(sorted(exact))


_SCREEN, _EXACT_HINTS = _build(SHAPE_RULES, KEY_WORDS)


def may_hold_secret(text: str, lowered: str | None = None) -> bool:
    """False only if no detector of :mod:`ingest.secret_rules` can fire on ``text``; True otherwise.

    ``lowered`` is ``text.lower()`` when the caller has it already.
    """
    if _SCREEN is None:
        return True
    if _SCREEN.search(text.lower() if lowered is None else lowered) is not None:
        return True
    for hint in _EXACT_HINTS:
        if hint in text:
            return True
    # The high-entropy detector starts from a run of 32 base64-ish characters (see random_token_spans).
    return has_token_run(text)
