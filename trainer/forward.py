"""The model's per-token logprobs and entropies for a micro-batch, padded or packed.

Padded: rows right-padded to one [B, T] tensor. Packed: the rows' real tokens
laid end to end in one [1, N] sequence with position ids restarting at each row
and a block-diagonal causal mask, so no token attends across samples; N is the
number of real tokens, so no compute goes to padding. Either way the result is
returned in the padded [B, T] layout, so the losses
are the same functions on the same shapes.

The output layer runs only where its logits predict a loss token (the model's
`logits_to_keep`); the result is 0 where no loss token is (every use of it is masked
by the loss mask). With a vocabulary of 151,936 rows and a small model, the output layer
over a chat episode's prompt and tool results is most of a step's compute.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trainer.data import MicroBatch
from trainer.loss import distribution_entropy, log_softmax_at

Forward = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def predicting(loss: torch.Tensor) -> torch.Tensor:
    """For a [B, T] loss mask: the positions t - 1 whose logits predict a loss token at some t
    (in any row). With no loss token, position 0: its logits are computed (and masked) so that
    every rank's backward reaches every parameter, as FSDP needs."""
    keep = loss[:, 1:].any(dim=0).nonzero().squeeze(1)
    return keep if len(keep) else torch.zeros(1, dtype=torch.long, device=loss.device)


def kept_logprobs(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    loss: torch.Tensor,
    keep: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, K, V] logits at positions `keep` to the [B, T] logprobs of the loss tokens they
    predict (and the entropies), 0 where no loss token is."""
    targets = (keep + 1).clamp(max=input_ids.shape[1] - 1)  # clamped only for predicting()'s masked 0
    log_probs = log_softmax_at(logits, temperature)
    picked = log_probs.gather(-1, input_ids[:, targets].unsqueeze(-1)).squeeze(-1)
    zeros = torch.zeros(input_ids.shape, dtype=log_probs.dtype, device=input_ids.device)
    logprobs = zeros.index_copy(1, targets, picked) * loss
    if not with_entropy:
        return logprobs, None
    return logprobs, zeros.index_copy(1, targets, distribution_entropy(log_probs.detach())) * loss


def padded_forward(
    model, batch: MicroBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    keep = predicting(batch.loss_mask)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
    return kept_logprobs(logits, batch.input_ids, batch.loss_mask, keep, temperature, with_entropy)


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
    # a row's first token would be "predicted" from the previous row's last: never a loss token
    loss = (batch.loss_mask[real] & ~row_start)[None]
    keep = predicting(loss)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep).logits
    logprobs, entropy = kept_logprobs(logits, ids, loss, keep, temperature, with_entropy)
    zeros = torch.zeros(batch.input_ids.shape, dtype=logprobs.dtype, device=ids.device)
    if entropy is None:
        return zeros.masked_scatter(real, logprobs[0]), None
    return zeros.masked_scatter(real, logprobs[0]), zeros.masked_scatter(real, entropy[0])
