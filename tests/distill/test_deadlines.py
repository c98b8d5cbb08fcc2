"""The deadline index the ticks read: only what is due comes out, once, and it stays right however
often sessions move (updates, forgets, rebuilds of its heap)."""

from __future__ import annotations

import random

from distill.deadlines import DeadlineIndex
from distill.sessions import SessionState
from distill.spec import load_spec

SPEC = load_spec()
LONGEST = SPEC.windows_s.longest


def quiet(touched_at: float) -> SessionState:
    """A session with nothing pending: due when it expires, ``LONGEST`` seconds after its last event."""
    return SessionState(touched_at=touched_at)


def test_due_returns_only_what_is_due_once_and_earliest_first() -> None:
    index = DeadlineIndex(SPEC, settled_after_s=60)
    for n in (5, 1, 3):
        index.update(f"s{n}".encode(), 0, quiet(n))
    index.update(b"other-partition", 1, quiet(0))
    assert index.due(0, LONGEST + 0.5) == []
    assert index.due(0, LONGEST + 3) == [b"s1", b"s3"]
    assert index.due(0, LONGEST + 3) == []  # handed out: the tick updates or forgets them
    assert index.due(0, LONGEST + 10) == [b"s5"]
    assert index.due(1, LONGEST + 10) == [b"other-partition"]
    assert len(index) == 0


def test_an_update_moves_a_session_and_a_forget_drops_it() -> None:
    index = DeadlineIndex(SPEC, settled_after_s=60)
    index.update(b"moved", 0, quiet(0))
    index.update(b"moved", 0, quiet(100))  # a later event: the old deadline no longer counts
    index.update(b"gone", 0, quiet(0))
    index.forget(b"gone", 0)
    assert index.due(0, LONGEST + 50) == []
    assert index.due(0, LONGEST + 100) == [b"moved"]


def test_many_random_moves_match_a_plain_scan() -> None:
    """Against the obvious model (a dict scanned on every tick), through enough updates to rebuild the heap."""
    rng = random.Random(7)
    index = DeadlineIndex(SPEC, settled_after_s=60)
    model: dict[bytes, float] = {}
    now = 0.0
    for step in range(20_000):
        key = f"s{rng.randrange(500)}".encode()
        if rng.random() < 0.1:
            index.forget(key, 0)
            model.pop(key, None)
        else:
            touched = now + rng.uniform(-LONGEST, 10)
            index.update(key, 0, quiet(touched))
            model[key] = touched + LONGEST
        if step % 50 == 0:
            now += 5
            expected = sorted((at, k) for k, at in model.items() if at <= now)
            assert index.due(0, now) == [k for _, k in expected]
            for _, k in expected:
                del model[k]
    assert len(index) == len(model)
