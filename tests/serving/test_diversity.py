"""Diversity and validity of sampled completions, and the gate policy's rules on them (no stack needed)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from pydantic import ValidationError

from learner.tiny_model import TinyModelSpec, build_tiny_model, byte_tokenizer
from serving.diversity import (
    DiversityProbe,
    WellFormed,
    completion_entropy,
    distinct_share,
    probe,
    sample_completions,
    summarize,
    well_formed_share,
)
from serving.gate_policy import GatePolicy, decide
from serving.regression import InvalidSuite, load_suite
from tests.serving.gate_metrics import HEALTHY

NUMBER = WellFormed(name="number", version="1", regex=r" [0-9]+;?")


def test_measures_of_a_list_of_completions() -> None:
    assert distinct_share([" 1;", " 2;", " 1;", " 58;"]) == 0.75
    assert distinct_share([" 1;"] * 4) == 0.25
    assert math.isnan(distinct_share([]))
    assert completion_entropy([" 1;"] * 4) == 0.0
    assert completion_entropy(["a", "b", "c", "d"]) == pytest.approx(math.log(4))
    assert well_formed_share([" 1;", " x", " 22"], NUMBER) == pytest.approx(2 / 3)
    assert math.isnan(well_formed_share([" 1;"], None))
    stats = summarize([" 1;", " 1;", " 58;", " x"], NUMBER)
    assert (stats.completions, stats.distinct_share, stats.well_formed_share) == (4, 0.75, 0.75)
    assert stats.top[0] == (" 1;", 2)
    assert math.isnan(stats.token_entropy)


def test_a_collapsed_candidate_is_rejected_with_both_figures() -> None:
    collapsed = HEALTHY.model_copy(update={"candidate_distinct_share": 0.21, "champion_distinct_share": 0.86})
    decision, reasons = decide(GatePolicy(auto_promote=True), collapsed)
    assert decision == "reject"
    assert reasons[0] == (
        "FAIL distinct share 0.210 vs champion 0.860 (256 sampled completions each): ratio 0.24 >= 0.70"
    )
    assert [r for r in reasons if r.startswith("FAIL")] == reasons[:1]


def test_a_healthy_candidate_that_narrowed_a_little_passes() -> None:
    decision, reasons = decide(GatePolicy(auto_promote=True), HEALTHY)
    assert decision == "promote", reasons
    assert "ok well-formed share (number@1) 0.800 vs champion 0.830: drop +0.030 <= 0.100" in reasons


def test_entropy_well_formedness_floor_and_unmeasured_diversity() -> None:
    policy = GatePolicy(auto_promote=True)
    flat = HEALTHY.model_copy(update={"candidate_token_entropy": 0.2})
    assert decide(policy, flat)[1][0].startswith("FAIL token entropy 0.200 vs champion 1.300 nats: ratio 0.15")
    broken = HEALTHY.model_copy(update={"candidate_well_formed_share": 0.70})
    assert decide(policy, broken)[1][0] == (
        "FAIL well-formed share (number@1) 0.700 vs champion 0.830: drop +0.130 <= 0.100"
    )
    unchecked = HEALTHY.model_copy(update={"candidate_well_formed_share": math.nan, "well_formed_validator": None})
    decision, reasons = decide(policy, unchecked)
    assert decision == "promote"
    assert "ok well-formed share not checked: the suite defines no well_formed validator" in reasons
    floor = GatePolicy(auto_promote=True, min_distinct_share=0.75)
    assert decide(floor, HEALTHY)[1][0] == "FAIL distinct share 0.700 >= floor 0.750"
    # Nothing sampled (no prompts): the gate cannot judge, so it rejects, as for a missing held-out set.
    unmeasured = HEALTHY.model_copy(update={"candidate_distinct_share": math.nan, "champion_distinct_share": math.nan})
    assert decide(policy, unmeasured)[0] == "reject"
    # A champion without any diversity cannot be narrowed further.
    fixed = HEALTHY.model_copy(update={"candidate_token_entropy": 0.0, "champion_token_entropy": 0.0})
    assert decide(policy, fixed)[0] == "promote"


def test_thresholds_and_validators_are_bounded(tmp_path: Path) -> None:
    for field, value in (("min_distinct_share_ratio", 1.5), ("min_entropy_ratio", -0.1), ("max_well_formed_drop", 2)):
        with pytest.raises(ValidationError, match=field):
            GatePolicy.model_validate({field: value})
    with pytest.raises(ValidationError, match="does not compile"):
        WellFormed(name="x", version="1", regex="(")
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: t\nversion: '1'\ncases: [{id: c, prompt: p, checks: [{kind: max_length, value: 3}]}]\n"
        "diversity: {samples_per_prompt: 1}\n"
    )
    with pytest.raises(InvalidSuite, match="samples_per_prompt"):
        load_suite(bad)
    assert load_suite().diversity == DiversityProbe()  # the default suite probes held-out prompts only


def test_sampling_is_seeded_counts_every_sample_and_cuts_at_stop_strings() -> None:
    model, tokenizer = build_tiny_model(TinyModelSpec(seed=0)).eval(), byte_tokenizer()
    settings = DiversityProbe(samples_per_prompt=4, max_tokens=8, seed=5)
    prompts = ["let x =", "return", "let y ="]  # two of one length: one batch
    first = sample_completions(model, tokenizer, prompts, settings)
    assert first == sample_completions(model, tokenizer, prompts, settings)
    assert len(first.completions) == 12
    assert first != sample_completions(model, tokenizer, prompts, settings.model_copy(update={"seed": 6}))
    # An untrained model over 384 tokens: close to uniform, so nearly every sample differs.
    stats = probe(model, tokenizer, prompts, settings)
    assert stats.distinct_share > 0.9
    assert stats.token_entropy > 0.8 * math.log(384)
    # One prompt (one batch, one random stream): with a stop string, each text is the free one cut before it.
    free = sample_completions(model, tokenizer, ["let x ="], settings).completions
    mark = next(ch for text in free for ch in text if ch.isprintable())
    cut = sample_completions(model, tokenizer, ["let x ="], settings.model_copy(update={"stop": [mark]}))
    assert cut.completions == [text.split(mark)[0] for text in free]
