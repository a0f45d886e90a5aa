"""The model's per-token logprobs and entropies for a micro-batch, padded or packed.

Padded: rows right-padded to one [B, T] tensor. Packed: the rows' real tokens
laid end to end in one [1, N] sequence with position ids restarting at each row
and a block-diagonal causal mask, so no token attends across samples; N is the
number of real tokens, so no compute goes to padding. Either way the result is
returned in the padded [B, T] layout (0 at t = 0 and on padding), so the losses
are the same functions on the same shapes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.data import MicroBatch
from trainer.loss import next_token_log_softmax, pick_token_logprobs, token_entropy

Forward = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def padded_forward(
    model, batch: MicroBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    log_probs = next_token_log_softmax(logits, temperature)  # once, for the loss and the entropy
    entropy = token_entropy(log_probs.detach()) if with_entropy else None
    return pick_token_logprobs(log_probs, batch.input_ids), entropy


def packing_layout(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For right-padded rows: position ids [1, N], the block-diagonal causal mask [1, 1, N, N]
    and which packed positions start a row [N]."""
    lengths = attention_mask.sum(dim=1)
    device = attention_mask.device
    row = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(len(row), device=device) - starts[row]
    causal = torch.ones(len(row), len(row), dtype=torch.bool, device=device).tril()
    mask = (row[:, None] == row[None, :]) & causal
    return positions[None], mask[None, None], positions == 0


def packed_forward(
    model, batch: MicroBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    real = batch.attention_mask.bool()
    ids = batch.input_ids[real][None]
    positions, mask, row_start = packing_layout(batch.attention_mask)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    log_probs = next_token_log_softmax(logits, temperature)
    # a row's first token would be "predicted" from the previous row's last: drop it, as t = 0 is
    keep = (~row_start).to(log_probs.dtype)
    logprobs = pick_token_logprobs(log_probs, ids)[0] * keep
    zeros = torch.zeros(batch.input_ids.shape, dtype=log_probs.dtype, device=ids.device)
    if not with_entropy:
        return zeros.masked_scatter(real, logprobs), None
    entropy = token_entropy(log_probs.detach())[0] * keep
    return zeros.masked_scatter(real, logprobs), zeros.masked_scatter(real, entropy)
