"""completion_logprobs on the tiny model equals a per-sequence log_softmax without padding."""

from __future__ import annotations

import pytest
import torch

from learner.logprobs import completion_logprobs
from learner.tiny_model import build_tiny_model

PROMPTS = [[5, 6, 7, 8, 9], [10], [11, 12, 13]]
COMPLETIONS = [[20, 21], [30, 31, 32, 33], []]


def _reference(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    """Logprobs of one sequence alone: no padding, no attention mask."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logprobs = model(input_ids=ids).logits[0].float().log_softmax(-1)
    return [logprobs[len(prompt) - 1 + t, token].item() for t, token in enumerate(completion)]


def test_batch_equals_one_sequence_at_a_time() -> None:
    model = build_tiny_model()
    with torch.no_grad():
        logp, valid = completion_logprobs(model, PROMPTS, COMPLETIONS)
    assert logp.shape == (3, 4)
    assert valid.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]]
    for row, (prompt, completion) in enumerate(zip(PROMPTS, COMPLETIONS, strict=True)):
        expected = _reference(model, prompt, completion)
        got = logp[row, : len(completion)].tolist()
        assert got == pytest.approx(expected, abs=1e-5)
        assert all(value < 0 for value in got)
        # Padding is reported as 0.0, so a caller that forgets the mask cannot pick up a pad logprob.
        assert logp[row, len(completion) :].tolist() == [0.0] * (4 - len(completion))


def test_gradients_flow_to_the_model() -> None:
    model = build_tiny_model()
    logp, valid = completion_logprobs(model, PROMPTS[:2], COMPLETIONS[:2])
    (logp * valid).sum().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads
    assert any(grad.abs().sum().item() > 0 for grad in grads)


def test_pad_id_does_not_change_the_result() -> None:
    model = build_tiny_model()
    with torch.no_grad():
        first, _ = completion_logprobs(model, PROMPTS, COMPLETIONS, pad_id=0)
        second, _ = completion_logprobs(model, PROMPTS, COMPLETIONS, pad_id=99)
    assert torch.allclose(first, second, atol=1e-5)


def test_bad_input_is_refused() -> None:
    model = build_tiny_model()
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        completion_logprobs(model, [[1], []], [[2], [3]])
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        completion_logprobs(model, [[1], [2]], [[3]])
    with pytest.raises(ValueError, match="empty batch"):
        completion_logprobs(model, [], [])


def test_all_empty_completions_give_an_empty_tensor() -> None:
    logp, valid = completion_logprobs(build_tiny_model(), [[1, 2], [3]], [[], []])
    assert logp.shape == (2, 0)
    assert valid.shape == (2, 0)
