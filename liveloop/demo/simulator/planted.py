"""What production traffic also carries, planted on purpose: pasted secrets and malformed events.

Secrets are fake but have the exact shapes :mod:`ingest.secret_rules` detects (an AWS access key id, a
GitHub token, a Stripe live key, a GitLab token, a Slack token), drawn from the session's RNG; the runner
records every planted string in its summary, so that a later scan of Kafka, PostgreSQL, MLflow and the
checkpoints can check none of them was stored. Malformed events are what a buggy product sends: each one
must end up in the dead-letter topic, never on the events topic.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Callable
from typing import Any

_UPPER_DIGITS = string.ascii_uppercase + string.digits
_ALNUM = string.ascii_letters + string.digits


def _draw(rng: random.Random, alphabet: str, size: int) -> str:
    # Mixed classes every time: the detectors (rightly) ignore all-letter or all-digit runs.
    while True:
        text = "".join(rng.choice(alphabet) for _ in range(size))
        if any(c.isdigit() for c in text) and any(c.isalpha() for c in text):
            return text


_SHAPES: tuple[tuple[str, Callable[[random.Random], str], str], ...] = (
    ("aws_access_key", lambda r: "AKIA" + _draw(r, _UPPER_DIGITS, 16), 'let aws_key = "{secret}";'),
    ("github_token", lambda r: "ghp_" + _draw(r, _ALNUM, 36), 'let gh_token = "{secret}";'),
    ("stripe_key", lambda r: "sk_live_" + _draw(r, _ALNUM, 24), 'let stripe = "{secret}";'),
    ("gitlab_token", lambda r: "glpat-" + _draw(r, _ALNUM, 20), 'let gl = "{secret}";'),
    ("slack_token", lambda r: "xoxb-" + _draw(r, _ALNUM, 24), 'let slack = "{secret}";'),
)
SECRET_KINDS: tuple[str, ...] = tuple(kind for kind, _, _ in _SHAPES)
"""The kinds of secret the simulator plants (names as :mod:`ingest.secret_rules` reports them)."""


def plant_secret(rng: random.Random) -> tuple[str, str, str]:
    """``(kind, secret, line)``: a fresh fake secret and the line of code a user pasted it in."""
    kind, make, template = _SHAPES[rng.randrange(len(_SHAPES))]
    secret = make(rng)
    return kind, secret, template.format(secret=secret)


def malformed_event(
    rng: random.Random, session_id: str, user_id: str, generation_id: str, private: bool = False
) -> tuple[str, Any]:
    """``(what, body)``: one malformed event (a JSON value, or raw text) of a kind drawn from ``rng``.

    ``private``: the event says ``privacy_mode: true``, so its dead letter must keep nothing of the
    session (the demo's leak scan looks for the session's id everywhere)."""
    base: dict[str, Any] = {
        "type": "suggestion.accepted",
        "ts": "2026-01-01T00:00:00Z",
        "session_id": session_id,
        "user_id": user_id,
        **({"privacy_mode": True} if private else {}),
        "payload": {"generation_id": generation_id},
    }
    kind = rng.randrange(5)
    if kind == 0:
        return "unknown_type", {**base, "type": "suggestion.loved"}
    if kind == 1:
        return "naive_timestamp", {**base, "ts": "2026-01-01T00:00:00"}
    if kind == 2:
        return "bad_generation_id", {**base, "payload": {"generation_id": "not-a-uuid"}}
    if kind == 3:
        return "unknown_field", {**base, "payload": {"generation_id": generation_id, "confidence": 0.9}}
    if private:  # cut after the session id: a body too broken to parse that still says it is private
        return "not_json", json.dumps(base)[: -len(json.dumps(base["payload"])) - 1]
    return "not_json", '{"type": "suggestion.accepted", "session_id": '
