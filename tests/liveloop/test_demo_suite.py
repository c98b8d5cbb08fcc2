"""The demo suite's well-formedness regex is the simulator language's ``Parsed.well_formed``, written for the gate.

The gate (serving) cannot import the simulator (liveloop, a floor above), so the demo's suite file spells
the language's grammar as a regex; this test keeps the two from drifting apart.
"""

from __future__ import annotations

import random
from pathlib import Path

from liveloop.demo.simulator.language import DEFAULT_MIX, CorpusMix, make_line, parse
from serving.regression import load_suite

DEMO_SUITE = Path(__file__).resolve().parents[2] / "serving" / "suites" / "code-demo.yaml"


def _variants(completion: str, rng: random.Random) -> list[str]:
    # What a drifting model writes: cut short, a character dropped or doubled, extra spaces, a newline.
    i = rng.randrange(len(completion))
    return [
        completion,
        completion[:i],
        completion[:i] + completion[i + 1 :],
        completion[:i] + completion[i] + completion[i:],
        " " + completion,
        completion + ";",
        completion + "\nlet x =",
        completion.strip(),
        completion.replace(" ", "  ", 1),
        completion + " 1",
    ]


def test_the_regex_agrees_with_the_language_on_corpus_lines_and_their_mutations() -> None:
    well_formed = load_suite(DEMO_SUITE).diversity.well_formed
    assert well_formed is not None
    rng = random.Random(3)
    tools = CorpusMix(tool=0.5, malformed_tool=0.5)  # many tool calls, half of them malformed
    texts = [
        v for mix in (DEFAULT_MIX, tools) for _ in range(1500) for v in _variants(make_line(rng, mix).completion, rng)
    ]
    texts += ["", " ", ";", " ;", " @fmt(x)", " @fmt(x", " @foo(x)", " @fmt()", " 123", " a_b_c", " get(put(1))"]
    disagree = [t for t in texts if well_formed.matches(t) != parse(t).well_formed]
    assert not disagree, disagree[:10]
    shares = [parse(t).well_formed for t in texts]
    assert 0.2 < sum(shares) / len(shares) < 0.8  # both kinds are well represented
