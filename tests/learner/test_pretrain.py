"""Plain next-token pre-training of the tiny Llama: it learns, and a seed repeats it exactly."""

from __future__ import annotations

import pytest
import torch

from learner.pretrain import EncodedText, Prompted, encode_texts, pretrain
from learner.tiny_model import TinyModelSpec, build_tiny_model, byte_tokenizer

# A small, regular corpus: a model that learns anything drops far below the ~6 nats of a uniform guess.
TEXTS = [f"let x{i % 7} = {i % 13};" for i in range(64)] + [f"return y{i % 5}" for i in range(32)]


def _train(seed: int, steps: int = 60) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = build_tiny_model(TinyModelSpec(seed=3))
    losses = pretrain(model, byte_tokenizer(), TEXTS, steps=steps, lr=3e-3, batch_size=16, seed=seed, threads=1)
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


def test_pretraining_lowers_the_loss() -> None:
    losses, _ = _train(seed=0)
    assert len(losses) == 60
    assert losses[0] > 5.0  # random weights: about ln(384) nats per byte
    assert sum(losses[-10:]) / 10 < losses[0] - 3.0


def test_the_same_seed_gives_the_same_losses_and_weights() -> None:
    losses_a, weights_a = _train(seed=5, steps=15)
    losses_b, weights_b = _train(seed=5, steps=15)
    losses_c, _ = _train(seed=6, steps=15)
    assert losses_a == losses_b
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)
    assert losses_c != losses_a  # the seed picks the batches


def test_the_global_rng_and_thread_count_are_left_alone() -> None:
    torch.manual_seed(123)
    before, threads = torch.random.get_rng_state(), torch.get_num_threads()
    _train(seed=0, steps=2)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.get_num_threads() == threads


def test_texts_end_with_eos_so_the_model_learns_to_stop() -> None:
    tokenizer = byte_tokenizer()
    (encoded,) = encode_texts(tokenizer, ["ab"], max_length=16)
    assert encoded.ids == [ord("a") + 3, ord("b") + 3, tokenizer.eos_token_id]
    assert encoded.read_only == 0  # a plain text is learned whole


def test_a_prompted_text_marks_its_prompt_read_only_and_one_cut_before_its_completion_is_left_out() -> None:
    tokenizer = byte_tokenizer()
    encoded = encode_texts(tokenizer, [Prompted("ab", "c"), Prompted("abcd", "e"), "xy"], max_length=4)
    assert encoded == [
        EncodedText([ord("a") + 3, ord("b") + 3, ord("c") + 3, tokenizer.eos_token_id], read_only=2),
        EncodedText([ord("x") + 3, ord("y") + 3, tokenizer.eos_token_id], read_only=0),
    ]


def test_a_prompted_corpus_is_learned_on_its_completions_only() -> None:
    # Prompts of random bytes nobody can predict, each followed by the same answer: learned on the whole text the
    # loss stays near the noise's entropy; learned on the answers alone it falls to almost nothing.
    rng = torch.Generator().manual_seed(0)
    noise = ["".join(chr(97 + int(c)) for c in torch.randint(26, (24,), generator=rng)) for _ in range(64)]

    def last_loss(texts: list[str] | list[Prompted]) -> float:
        model = build_tiny_model(TinyModelSpec(seed=3))
        losses = pretrain(model, byte_tokenizer(), texts, steps=80, lr=3e-3, batch_size=16, seed=0, threads=1)
        return sum(losses[-10:]) / 10

    prompted = last_loss([Prompted(text, " ok") for text in noise])
    whole = last_loss([text + " ok" for text in noise])
    assert prompted < 0.3
    assert whole > 2.0


def test_bad_arguments_are_refused() -> None:
    model, tokenizer = build_tiny_model(), byte_tokenizer()
    with pytest.raises(ValueError, match="non-empty corpus"):
        pretrain(model, tokenizer, [], steps=1)
    with pytest.raises(ValueError, match="must all be positive"):
        pretrain(model, tokenizer, TEXTS, steps=0)
