"""Token logprobs of completions under a causal LM, for a whole batch in one forward pass.

The learner needs ``log pi_theta(token | prefix)`` of every completion token of a batch of samples:
for the policy gradient (with gradients), and under the reference policy for the KL penalty (without).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def completion_logprobs(
    model: Any, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]], pad_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logp, valid)``: the logprob of each completion token given its prompt and the completion before it.

    ``logp[b, t] = log pi(completion_ids[b][t] | prompt_ids[b] + completion_ids[b][:t])`` under ``model``
    (a Hugging Face causal LM), shape ``[B, T]`` with ``T`` the longest completion, right-padded with 0.0;
    ``valid[b, t]`` is 1.0 for a real token, else 0.0. Both are float32 on the model's device.

    One forward pass runs over the concatenated sequences, right-padded with ``pad_id`` and an attention
    mask (right padding keeps every real token's position id equal to its index, so the result equals a
    pass over each sequence alone). Gradients flow; wrap the call in ``torch.no_grad()`` when none are needed.

    Raises ``ValueError`` for an empty batch, for lists of different lengths, and for an empty prompt:
    nothing precedes the first completion token of an empty prompt, so its logprob is undefined.
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(
            f"{len(prompt_ids)} prompts for {len(completion_ids)} completions; pass one prompt per completion"
        )
    if not prompt_ids:
        raise ValueError("empty batch: pass at least one prompt and completion")
    for index, prompt in enumerate(prompt_ids):
        if not prompt:
            raise ValueError(
                f"prompt {index} is empty: its first completion token has no position to be predicted from; "
                "start every prompt with at least one token (e.g. a BOS token)"
            )
    device = next(model.parameters()).device
    batch = len(prompt_ids)
    longest_completion = max(len(completion) for completion in completion_ids)
    if longest_completion == 0:
        empty = torch.zeros((batch, 0), dtype=torch.float32, device=device)
        return empty, empty.clone()

    sequences = [list(prompt) + list(completion) for prompt, completion in zip(prompt_ids, completion_ids, strict=True)]
    length = max(len(sequence) for sequence in sequences)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, length), dtype=torch.long)
    # positions[b, t]: where the logits that predict completion token t sit (the token before it);
    # targets[b, t]: that token. Padding points at position 0 and token pad_id, and is masked by `valid`.
    positions = torch.zeros((batch, longest_completion), dtype=torch.long)
    targets = torch.full((batch, longest_completion), pad_id, dtype=torch.long)
    valid = torch.zeros((batch, longest_completion), dtype=torch.float32)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
        sequence = sequences[row]
        input_ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        attention[row, : len(sequence)] = 1
        count = len(completion)
        if count:
            positions[row, :count] = torch.arange(len(prompt) - 1, len(prompt) - 1 + count)
            targets[row, :count] = torch.tensor(list(completion), dtype=torch.long)
            valid[row, :count] = 1.0

    input_ids, attention = input_ids.to(device), attention.to(device)
    positions, targets, valid = positions.to(device), targets.to(device), valid.to(device)
    # Without padding the mask says nothing the causal mask does not, and leaving it out lets attention
    # take its fused causal kernel (flash attention on GPUs).
    mask = None if bool(attention.all()) else attention
    # The output head runs only over the span of positions that predict completion tokens: prompts are
    # usually the longer part, and their [B, L, V] logits would dominate time and memory.
    first = int(positions[valid.bool()].min())
    keep = torch.arange(first, int(positions.max()) + 1, device=device)
    logits = model(input_ids=input_ids, attention_mask=mask, use_cache=False, logits_to_keep=keep).logits
    rows = torch.arange(batch, device=device).unsqueeze(-1)
    picked = logits[rows, (positions - first).clamp(min=0)]
    # cross_entropy is the fused log_softmax + gather: no [B, T, V] log-probability tensor is kept.
    nll = torch.nn.functional.cross_entropy(picked.flatten(0, 1).float(), targets.flatten(), reduction="none")
    return -nll.view(batch, longest_completion) * valid, valid
