"""Credited spans onto tokens: characters of the completion to the tokens that write them."""

from __future__ import annotations

from distill.samples import CreditedSpan
from learner.tiny_model import byte_tokenizer
from learner.token_spans import token_credit


def test_each_token_takes_the_credit_of_the_characters_it_writes_multibyte_ones_included() -> None:
    tokenizer = byte_tokenizer()
    text = "A=1 \u00e9 B=22"  # the accent is two bytes, so two tokens for one character
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text) + 1
    spans = [
        CreditedSpan(start=0, end=3, credit=1.0),
        CreditedSpan(start=4, end=5, credit=0.25),
        CreditedSpan(start=6, end=10, credit=-0.5),
    ]
    credit = token_credit(tokenizer, ids, spans)
    # "A=1" +1; space 0; the accent's first byte writes no character yet, its second writes it; space 0; "B=22" -0.5.
    assert credit == [1.0, 1.0, 1.0, 0.0, 0.0, 0.25, 0.0, -0.5, -0.5, -0.5, -0.5]


def test_no_spans_no_credit_and_tokens_past_the_last_span_are_not_decoded() -> None:
    tokenizer = byte_tokenizer()
    ids = tokenizer("A=1 B=2", add_special_tokens=False)["input_ids"]
    assert token_credit(tokenizer, ids, []) == [0.0] * 7
    assert token_credit(tokenizer, ids, [CreditedSpan(start=0, end=1, credit=2.0)]) == [2.0] + [0.0] * 6
