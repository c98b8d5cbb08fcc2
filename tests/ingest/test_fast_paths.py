"""The fast paths change nothing but speed: the secret screen and the API's one-call batch validation.

Each fast path is checked against the exact path it stands in front of, on the same input: the
screen (:mod:`ingest.secret_screen`) against every detector run unconditionally, and the API's
batch validation (:mod:`ingest.api_fast`) against decoding and judging item by item. Both must give
identical answers, byte for byte, on realistic input, on adversarial input (duplicate keys,
whitespace before colons, escapes, odd numbers, other tenants, repeated ids), and on generated input.
"""

from __future__ import annotations

import json
import string
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.api_batch import BodyTooLarge, Limits, dead_letter, decode_body, judge_body, judge_items
from ingest.api_fast import parse_clean_event, validate_clean_body
from ingest.errors import InvalidEvent
from ingest.events import EVENT_TYPES, event_to_json, parse_event
from ingest.redaction import redact_text, redact_unscreened
from ingest.secret_rules import KEY_WORDS, SHAPE_RULES
from ingest.secret_screen import may_hold_secret
from tests.ingest.event_samples import sample_event
from tests.ingest.test_redaction import ORDINARY_CODE, SECRETS

PROPERTIES = settings(max_examples=200, deadline=None, database=None)
LIMITS = Limits(max_items=1000, record_limit=(1 << 20) - 4096, dlq_keep=1 << 19)
TENANT = "acme"


# -- the secret screen ---------------------------------------------------------------------------------


def test_every_hint_and_key_word_passes_the_screen() -> None:
    needles = [hint for rule in SHAPE_RULES for hint in rule.hints] + list(KEY_WORDS)
    for needle in needles:
        for text in (needle, f"x = {needle}(y)", f"{needle.upper()}", f"prefix{needle.title()}suffix"):
            if text.lower().find(needle.lower()) == -1:
                continue
            folded = needle in KEY_WORDS or any(rule.fold and needle in rule.hints for rule in SHAPE_RULES)
            if folded or needle in text:
                assert may_hold_secret(text), text


@pytest.mark.parametrize("text", [case[1] for case in SECRETS] + ORDINARY_CODE)
def test_the_screen_changes_no_answer_on_the_corpus(text: str) -> None:
    assert redact_text(text) == redact_unscreened(text)


def test_ordinary_code_is_screened_out_and_a_long_random_run_is_not() -> None:
    assert not may_hold_secret("def total_price(items: list[Item], discount: float) -> Decimal:\n" * 6)
    assert may_hold_secret("blob = " + "aB3dE5gH" * 5)


# Fragments of every needle, of real secrets and of ordinary code, glued at random: the screen sees the
# near misses (half a hint, a hint split by one character, odd Unicode that lower-cases to ASCII).
_FRAGMENTS = [
    *(hint for rule in SHAPE_RULES for hint in rule.hints),
    *KEY_WORDS,
    *(case[1][i : i + 12] for case in SECRETS for i in range(0, len(case[1]), 7)),
    " = ",
    ": ",
    '"',
    "'",
    "\n",
    "\u212a",  # KELVIN SIGN, lower-cases to "k"
    "\u0130",  # LATIN CAPITAL LETTER I WITH DOT ABOVE, lower-cases to two characters
    "://",
    "@",
]
_TEXT = st.lists(
    st.sampled_from(_FRAGMENTS) | st.text(alphabet=string.ascii_letters + string.digits + "+/_-=.: ", max_size=40),
    max_size=12,
).map("".join)


@PROPERTIES
@given(_TEXT)
def test_the_screen_never_changes_an_answer(text: str) -> None:
    assert redact_text(text) == redact_unscreened(text)


# -- the API's batch validation ------------------------------------------------------------------------


def _outcome(verdict: Any) -> Any:
    """What a verdict decides, without its dead letters' timestamps."""
    if verdict.judged is None:
        return ("body rejected", verdict.status, verdict.kind, verdict.letter.reason)
    judged = verdict.judged
    letters = [(letter.reason, letter.field, letter.session_id, letter.raw_b64) for letter in judged.letters]
    return (
        verdict.is_batch,
        judged.results,
        judged.records,
        judged.accepted,
        judged.rejected,
        judged.privacy_dropped,
        dict(judged.redactions),
        dict(judged.rejected_by_class),
        letters,
        json.loads(verdict.body),
    )


def _exact(raw: bytes, tenant: str) -> Any:
    """The exact path alone: decode the body, then judge item by item."""
    try:
        items, is_batch = decode_body(raw, LIMITS.max_items)
    except BodyTooLarge as exc:  # the answer is the dead letter's reason: a private body's values masked
        return ("body rejected", 413, "too_large", _letter_reason(raw, exc.reason))
    except InvalidEvent as exc:
        return ("body rejected", 400, "malformed", _letter_reason(raw, exc.reason))
    judged = judge_items(items, tenant, record_limit=LIMITS.record_limit, dlq_raw_limit=LIMITS.dlq_keep)
    letters = [(letter.reason, letter.field, letter.session_id, letter.raw_b64) for letter in judged.letters]
    return (
        is_batch,
        judged.results,
        judged.records,
        judged.accepted,
        judged.rejected,
        judged.privacy_dropped,
        dict(judged.redactions),
        dict(judged.rejected_by_class),
        letters,
        json.loads(judged.answer()),
    )


def _letter_reason(raw: bytes, reason: str) -> str:
    return dead_letter(raw, reason, tenant=TENANT, keep=LIMITS.dlq_keep).reason


def _event(event_type: str, i: int, **changes: Any) -> dict[str, Any]:
    event = sample_event(event_type)
    event.pop("tenant")
    event["event_id"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"fast-path/{i}"))
    return event | changes


def _batch(*events: dict[str, Any]) -> bytes:
    return json.dumps(list(events)).encode()


BATCH = [_event(name, i) for i, name in enumerate(EVENT_TYPES)]
GENERATION = _event("generation", 100)
CLEAN = _batch(*BATCH)
EDGE_CASES: dict[str, bytes] = {
    "clean batch": CLEAN,
    "one event": json.dumps(GENERATION).encode(),
    "pretty printed": json.dumps(BATCH, indent=2).encode(),
    "spaces before colons": json.dumps(BATCH, separators=(" , ", " : ")).encode(),
    "duplicate key": CLEAN.replace(b'"session_id"', b'"user_id": "u-2", "session_id"', 1),
    "duplicate key after a space": CLEAN.replace(b'"session_id"', b'"user_id" : "u-2", "session_id"', 1),
    "duplicate nested key": CLEAN.replace(b'"model"', b'"model": "m2", "model"', 1),
    "duplicate key hidden by an escaped colon": CLEAN.replace(
        b'"session_id"', b'"user_id": "u\\u003a2", "session_id"', 1
    ),
    "value starting with a colon": _batch(_event("generation", 1, user_id=":u")),
    "escaped quote before a colon": _batch(_event("generation", 1, user_id='u":2')),
    "escaped backslash ending a string": _batch(_event("generation", 1, user_id="u\\")),
    "escaped quotes and backslashes before colons": _batch(_event("generation", 1, user_id='u\\":\\\\":"\\":')),
    "duplicate key beside escaped quotes": _batch(_event("generation", 1, user_id='u":')).replace(
        b'"session_id"', b'"user_id": "v", "session_id"', 1
    ),
    "NaN": CLEAN.replace(b'"latency_ms": ', b'"latency_ms": NaN, "x": ', 1),
    "huge float": _batch(_event("generation", 1, payload={**GENERATION["payload"], "latency_ms": 1e308})).replace(
        b"1e+308", b"1e400"
    ),
    "float for an int": CLEAN.replace(b'"policy_version": 3', b'"policy_version": 3.0', 1),
    "int for a float": _batch(_event("generation", 1, payload={**GENERATION["payload"], "latency_ms": 40})),
    "byte order mark": b"\xef\xbb\xbf" + CLEAN,
    "lone surrogate": _batch(_event("generation", 1, user_id="u\ud800")),
    "control character": CLEAN.replace(b'"sess-1"', b'"sess\x01-1"', 1),
    "NUL in a prompt": _batch(_event("generation", 1, payload={**GENERATION["payload"], "prompt": "a\x00b"})),
    "escaped backslash before u0000": _batch(
        _event("generation", 1, payload={**GENERATION["payload"], "prompt": "a\\u0000b"})
    ),
    "invalid UTF-8": CLEAN.replace(b'"sess-1"', b'"sess\xff-1"', 1),
    "trailing garbage": CLEAN + b" x",
    "empty batch": b"[]",
    "not an event": b"[1]",
    "scalar body": b"1",
    "other tenant": _batch(_event("generation", 1, tenant="other")),
    "same tenant named": _batch(_event("generation", 1, tenant=TENANT)),
    "repeated event id": _batch(GENERATION, GENERATION),
    "privacy mode": _batch(_event("generation", 1, privacy_mode=True)),
    "newer schema": _batch(_event("generation", 1, schema_version=2)),
    "naive timestamp": _batch(_event("generation", 1, ts="2025-01-31T12:00:00")),
    "offset timestamp": _batch(_event("generation", 1, ts="2025-01-31T12:00:00+02:00")),
    "upper-case uuid": _batch(_event("generation", 1, event_id=GENERATION["event_id"].upper())),
    "secret in the prompt": _batch(
        _event("generation", 1, payload={**GENERATION["payload"], "prompt": "key = AKIA" + "IOSFODNN7EXAMPLE"})
    ),
    "deep nesting": b"[" * 100 + b"]" * 100,
    "unknown field in a tool call": CLEAN.replace(b'"valid": true', b'"valid": true, "extra": {}', 1),
}


@pytest.mark.parametrize("tenant", [TENANT, "default", "Not A Tenant"])
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_the_fast_path_gives_the_exact_answer(case: str, tenant: str) -> None:
    raw = EDGE_CASES[case]
    assert _outcome(judge_body(raw, tenant, LIMITS)) == _exact(raw, tenant)


def test_a_clean_batch_takes_the_fast_path_and_a_doubtful_one_does_not() -> None:
    assert validate_clean_body(CLEAN, TENANT, LIMITS.max_items) is not None
    assert validate_clean_body(EDGE_CASES["pretty printed"], TENANT, LIMITS.max_items) is not None
    assert validate_clean_body(EDGE_CASES["escaped quote before a colon"], TENANT, LIMITS.max_items) is not None
    doubtful = ("duplicate key", "duplicate key after a space", "duplicate key hidden by an escaped colon")
    for case in (*doubtful, "duplicate key beside escaped quotes"):
        assert validate_clean_body(EDGE_CASES[case], TENANT, LIMITS.max_items) is None, case


_EDITS = st.sampled_from(
    [
        (b'"session_id"', b'"session_id": "dup", "session_id"'),
        (b'"session_id"', b'"session_id" :"dup", "session_id"'),
        (b'"payload": {', b'"payload": {"generation_id": "6f1c1f5e-8d3e-4d0a-b5a4-2f8e4f1d9c10", '),
        (b'": "', b'":"'),
        (b'": ', b'"\t: '),
        (b", ", b",\n "),
        (b'"sess-1"', b'"sess\\u003a1"'),
        (b'"sess-1"', b'"sess\\"1"'),
        (b'"sess-1"', b'":sess"'),
        (b"true", b"1"),
        (b"0.", b"1e-"),
        (b"}", b', "tenant": "other"}'),
        (b"}", b', "privacy_mode": true}'),
    ]
)


@PROPERTIES
@given(st.lists(st.sampled_from(EVENT_TYPES), max_size=6), st.lists(st.tuples(_EDITS, st.integers(0, 3))), st.data())
def test_edited_batches_get_the_exact_answer(
    types: list[str], edits: list[tuple[tuple[bytes, bytes], int]], data: st.DataObject
) -> None:
    events = [_event(name, data.draw(st.integers(0, 4))) for name in types]
    raw = _batch(*events)
    for (old, new), count in edits:
        raw = raw.replace(old, new, count)
    assert _outcome(judge_body(raw, TENANT, LIMITS)) == _exact(raw, TENANT)


# -- one event, as the distiller reads them -------------------------------------------------------------

SINGLE = json.dumps(GENERATION).encode()
SINGLE_CASES: dict[str, bytes] = {
    "clean": SINGLE,
    "pretty printed": json.dumps(GENERATION, indent=2).encode(),
    "duplicate key": SINGLE.replace(b'"session_id"', b'"user_id": "u-2", "session_id"', 1),
    "duplicate nested key": SINGLE.replace(b'"model"', b'"model": "m2", "model"', 1),
    "NaN": SINGLE.replace(b'"latency_ms": ', b'"latency_ms": NaN, "x": ', 1),
    "lone surrogate": json.dumps(_event("generation", 1, user_id="u\ud800")).encode(),
    "NUL": json.dumps(_event("generation", 1, user_id="u\x00")).encode(),
    "control character": SINGLE.replace(b'"sess-1"', b'"sess\x01-1"', 1),
    "invalid UTF-8": SINGLE.replace(b'"sess-1"', b'"sess\xff-1"', 1),
    "trailing garbage": SINGLE + b" x",
    "a batch": CLEAN,
    "newer schema": json.dumps(_event("generation", 1, schema_version=2)).encode(),
    "naive timestamp": json.dumps(_event("generation", 1, ts="2025-01-31T12:00:00")).encode(),
    "too large": json.dumps(_event("generation", 1, user_id="u" * (1 << 24))).encode(),
    "deep nesting": b'{"a": ' * 100 + b"1" + b"}" * 100,
    **{f"type {name}": json.dumps(_event(name, 1)).encode() for name in EVENT_TYPES},
}


def _read(raw: bytes) -> Any:
    """What the exact reader answers: the event's JSON, or the reason it was refused."""
    try:
        return event_to_json(parse_event(raw))
    except InvalidEvent as exc:
        return ("refused", exc.reason)


@pytest.mark.parametrize("case", list(SINGLE_CASES))
def test_an_event_read_fast_is_the_event_parse_event_reads(case: str) -> None:
    raw = SINGLE_CASES[case]
    fast = parse_clean_event(raw)
    if fast is not None:
        assert event_to_json(fast) == _read(raw)
    elif case == "clean" or case.startswith("type "):
        pytest.fail(f"a clean event ({case}) should take the fast path")


@PROPERTIES
@given(st.sampled_from(EVENT_TYPES), st.lists(st.tuples(_EDITS, st.integers(0, 3))))
def test_an_edited_event_read_fast_is_the_event_parse_event_reads(
    event_type: str, edits: list[tuple[tuple[bytes, bytes], int]]
) -> None:
    raw = json.dumps(_event(event_type, 1)).encode()
    for (old, new), count in edits:
        raw = raw.replace(old, new, count)
    fast = parse_clean_event(raw)
    if fast is not None:
        assert event_to_json(fast) == _read(raw)
