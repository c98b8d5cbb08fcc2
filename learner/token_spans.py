"""Which completion tokens write which characters: a turn's credited spans turned into per-token credit.

A product judges parts of an output by their text (a summary's facts, a patch's hunks), in characters of the
completion (:class:`distill.samples.CreditedSpan`); the loss works on tokens. Token ``i`` writes the characters
between the decoded lengths of the first ``i`` and the first ``i + 1`` tokens. Decoding prefixes works for any
tokenizer, a byte-level one included (a token holding part of a UTF-8 character writes no character until the
token that completes it), and only the tokens up to the last span's end are decoded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from distill.samples import CreditedSpan


def token_credit(tokenizer: Any, token_ids: Sequence[int], spans: Sequence[CreditedSpan]) -> list[float]:
    """Per completion token, the sum of the credits of the spans whose characters it writes (0 for the rest)."""
    credit = [0.0] * len(token_ids)
    if not spans:
        return credit
    last_end = max(span.end for span in spans)
    written = 0
    for index in range(len(token_ids)):
        if written >= last_end:
            break
        end = len(tokenizer.decode(list(token_ids[: index + 1]), skip_special_tokens=True))
        for span in spans:
            if written < span.end and end > span.start:
                credit[index] += span.credit
        written = max(written, end)
    return credit
