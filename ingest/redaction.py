"""Secret redaction: scrub credentials out of every free-text field before an event is stored.

Each secret found is replaced by a typed placeholder, ``[REDACTED:<kind>]`` (for example
``[REDACTED:aws_access_key]``), so that training data still shows *that* a credential stood there.
Only the secret itself is replaced: ``https://user:[REDACTED:url_password]@host``,
``Authorization: Bearer [REDACTED:bearer_token]``, ``password = "[REDACTED:password]"``.

False-positive policy. A missed secret is a leak that cannot be undone; a wrongly redacted string
only costs a little training signal. So:

- Secrets with a recognisable shape (vendor prefixes, private key blocks, JWTs, URL passwords,
  ``Authorization`` headers) are always redacted, even in obviously fake keys.
- Values assigned to a secret-sounding name (``password``, ``secret``, ``token``, ``api_key``...) are
  redacted unless they are plainly not a secret: code (``password = get_password()``, an identifier,
  a dotted path), a template (``${DB_PASSWORD}``, ``{{ .Values.token }}``, ``<your-token>``), a
  placeholder constant (``"YOUR_API_KEY"``), a UI label (``"Enter password"``), or too short/uniform.
- Anything else is redacted as ``high_entropy`` only when it looks random: a run of 32 or more
  base64/base64url characters mixing upper case, lower case and digits, with Shannon entropy of at
  least 4.0 bits per character, which does not split into word-like pieces. Hex strings (git SHAs,
  sha256 digests, UUIDs), identifiers (``calculate_total_price_with_discount``,
  ``HTTP2ServerConnectionManagerFactory``) and paths made of words pass through, as does material
  that is random but public by construction: base64 data URIs (``data:image/png;base64,...``),
  integrity digests (``sha512-...``), certificate and public-key PEM blocks, SSH public keys.
  Other long base64 blobs embedded in code are redacted: they cannot be told apart from
  base64-encoded keys. Single-case random strings (base32, lower-case hex) are not caught by this
  rule; only their labelled or prefixed forms are.

Measured on 19,977 Python files of installed packages (293 MB of real code): 70 files (0.35%) had
anything redacted. ``high_entropy`` fired in 0.14% of files (embedded font/image data, Google Docs ids
in URLs, fixture hashes), ``url_password`` in 0.15% (documentation examples such as
``postgresql://scott:tiger@localhost``), ``password``/``secret`` in 0.08% (example credentials in
docstrings and tests), and one real CI token.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from functools import cache, partial
from typing import Any, TypeVar, get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from ingest.events import Event
from ingest.payloads import REDACTED_MARK
from ingest.secret_rules import (
    ASCII_LOWER,
    ASSIGNED_VALUE,
    KEY_QUALIFIER,
    KEY_START,
    KEY_WORDS,
    SHAPE_RULES,
    Rule,
    assignment_kind,
    random_token_spans,
    secret_value,
)
from ingest.secret_screen import may_hold_secret

PLACEHOLDER = "[REDACTED:{kind}]"
"""Format of the text that replaces a secret; ``kind`` names the detector."""


def placeholder(kind: str) -> str:
    """The text that replaces a secret of ``kind``."""
    return PLACEHOLDER.format(kind=kind)


def redact_text(text: str) -> tuple[str, dict[str, int]]:
    """Replace every secret in ``text`` by its placeholder; return the new text and counts per kind."""
    lowered = text.lower()
    if not may_hold_secret(text, lowered):
        return text, {}  # no detector can fire: most text ends here (see ingest.secret_screen)
    return redact_unscreened(text, lowered)


def redact_unscreened(text: str, lowered: str | None = None) -> tuple[str, dict[str, int]]:
    """:func:`redact_text` without the screen in front: every detector runs (the screen's reference)."""
    if lowered is None:
        lowered = text.lower()
    counts: Counter[str] = Counter()
    for rule in SHAPE_RULES:
        if rule.hints and not any(hint in (lowered if rule.fold else text) for hint in rule.hints):
            continue
        redacted = rule.pattern.sub(partial(_replace, rule, counts=counts), text)
        if redacted != text:
            text, lowered = redacted, redacted.lower()
    text = _redact_assignments(text, lowered, counts)
    text = _splice(text, [(start, end, "high_entropy") for start, end in random_token_spans(text)], counts)
    return text, dict(counts)


def _replace(rule: Rule, match: re.Match[str], counts: Counter[str]) -> str:
    if rule.accept is not None and not rule.accept(match):
        return match.group()
    counts[rule.kind] += 1
    start, end = next(match.span(group) for group in rule.groups if match.group(group) is not None)
    offset = match.start()
    whole = match.group()
    return whole[: start - offset] + placeholder(rule.kind) + whole[end - offset :]


def _redact_assignments(text: str, lowered: str, counts: Counter[str]) -> str:
    if len(lowered) != len(text):  # a few non-ASCII characters change length when lower-cased
        lowered = text.translate(ASCII_LOWER)
    spans: list[tuple[int, int, str]] = []
    for word in KEY_WORDS:
        start = lowered.find(word)
        while start != -1:
            end = start + len(word)
            value = ASSIGNED_VALUE.match(text, end)
            if value is not None and (word != "key" or KEY_QUALIFIER.search(lowered, max(0, start - 12), start)):
                prefix = KEY_START.search(text, max(0, start - 64), start)
                key = (prefix.group() if prefix else "") + text[start:end]
                if secret_value(value, key):
                    span = value.span("quoted") if value.group("quoted") is not None else value.span("bare")
                    spans.append((*span, assignment_kind(key.lower(), word)))
            start = lowered.find(word, end)
    return _splice(text, spans, counts)


def _splice(text: str, spans: list[tuple[int, int, str]], counts: Counter[str]) -> str:
    if not spans:
        return text
    pieces: list[str] = []
    done = 0
    for start, end, kind in sorted(spans):
        if start >= done:  # a value inside another redacted value is already gone
            pieces += [text[done:start], placeholder(kind)]
            counts[kind] += 1
            done = end
    return "".join([*pieces, text[done:]])


def redact_event(event: Event) -> tuple[Event, dict[str, int]]:
    """Redact every free-text field of the event's payload; return the (new) event and counts per kind.

    Free-text fields are those marked ``x-liveloop-redacted`` in the contract (prompt, completion,
    tool-call arguments, trajectory texts, error messages...). If a placeholder pushes a field over
    its length limit, the field is cut at the limit so the event stays valid. The same object is
    returned when nothing was found.
    """
    counts: dict[str, int] = {}  # a plain dict, not a Counter: no object for the collector to track per event
    payload = _redact_model(event.payload, counts)
    if payload is event.payload:
        return event, counts
    return event.model_copy(update={"payload": payload}), counts


_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class _FieldPlan:
    name: str
    free_text: bool
    max_length: int | None


@cache
def _plan(model_type: type[BaseModel]) -> tuple[_FieldPlan, ...]:
    # Only the fields that can hold free text, directly or in a nested model: the rest (ids, numbers,
    # token lists, names) are never looked at, and a model with none of them costs one lookup.
    return tuple(
        _FieldPlan(
            name,
            _is_free_text(info),
            next((m.max_length for m in info.metadata if hasattr(m, "max_length")), None),
        )
        for name, info in model_type.model_fields.items()
        if _is_free_text(info) or _may_hold_model(info.annotation)
    )


def _may_hold_model(annotation: object) -> bool:
    """Whether a field of this type can hold a model (conservatively yes for untyped containers)."""
    if annotation is Any or annotation is object or annotation in (list, tuple, dict, set, frozenset):
        return True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_may_hold_model(arg) for arg in get_args(annotation))


def _is_free_text(info: FieldInfo) -> bool:
    extra = info.json_schema_extra
    return isinstance(extra, dict) and extra.get(REDACTED_MARK) is True


def _redact_model(model: _M, counts: dict[str, int]) -> _M:
    updates: dict[str, Any] = {}
    for field in _plan(type(model)):
        value = getattr(model, field.name)
        if isinstance(value, str):
            if field.free_text:
                redacted, found = redact_text(value)
                if found:
                    for kind, n in found.items():
                        counts[kind] = counts.get(kind, 0) + n
                    updates[field.name] = redacted[: field.max_length]
        elif isinstance(value, BaseModel):
            new = _redact_model(value, counts)
            if new is not value:
                updates[field.name] = new
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            items = [_redact_model(item, counts) for item in value]
            if any(new is not old for new, old in zip(items, value, strict=True)):
                updates[field.name] = items
    return model.model_copy(update=updates) if updates else model
