"""The model's per-token logprobs and entropies for a micro-batch, padded or packed.

Padded: rows right-padded to one [B, T] tensor. Packed: the rows' real tokens
laid end to end in one [1, N] sequence with position ids restarting at each row
and no attention mask (and no cache): transformers reads the rows' bounds from the position ids
and builds the block-diagonal causal mask its attention implementation takes (a
dense one for SDPA, a block mask for flex attention, none for one row, which then
runs SDPA's causal kernel), so no token attends across samples; N is the
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
from torch.utils.checkpoint import checkpoint

from trainer.data import MicroBatch
from trainer.loss import distribution_entropy, log_softmax_at

Forward = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]

# logits (positions x vocabulary) whose float32 log-softmax is taken at once: 1 GiB
LOGIT_CHUNK_ELEMENTS = 2**28


def predicting(loss: torch.Tensor) -> torch.Tensor:
    """For a [B, T] loss mask: the positions t - 1 whose logits predict a loss token at some t
    (in any row). With no loss token, position 0: its logits are computed (and masked) so that
    every rank's backward reaches every parameter, as FSDP needs."""
    keep = loss[:, 1:].any(dim=0).nonzero().squeeze(1)
    return keep if len(keep) else torch.zeros(1, dtype=torch.long, device=loss.device)


def chunk_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, C, V] logits to the [B, C] logprobs of `targets` [B, C] and the entropies (zeros
    without `with_entropy`), in float32."""
    log_probs = log_softmax_at(logits, temperature)
    picked = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return picked, torch.zeros_like(picked)
    return picked, distribution_entropy(log_probs.detach())


def chunked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_logprobs` over positions in chunks of about `LOGIT_CHUNK_ELEMENTS` logits, each
    recomputed in the backward pass rather than kept: the float32 log-softmax of a long
    micro-batch (63K positions x 151,936 tokens: 38 GB) is never whole in memory."""
    per_chunk = max(1, LOGIT_CHUNK_ELEMENTS // (logits.shape[0] * logits.shape[2]))
    if logits.shape[1] <= per_chunk:
        return chunk_logprobs(logits, targets, temperature, with_entropy)
    parts = []
    for a in range(0, logits.shape[1], per_chunk):
        chunk = (logits[:, a : a + per_chunk], targets[:, a : a + per_chunk])
        parts.append(checkpoint(chunk_logprobs, *chunk, temperature, with_entropy, use_reentrant=False))
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)


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
    picked, entropies = chunked_logprobs(logits, input_ids[:, targets], temperature, with_entropy)
    zeros = torch.zeros(input_ids.shape, dtype=picked.dtype, device=input_ids.device)
    logprobs = zeros.index_copy(1, targets, picked) * loss
    if not with_entropy:
        return logprobs, None
    return logprobs, zeros.index_copy(1, targets, entropies) * loss


def padded_forward(
    model, batch: MicroBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    keep = predicting(batch.loss_mask)
    logits = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep, use_cache=False
    ).logits
    return kept_logprobs(logits, batch.input_ids, batch.loss_mask, keep, temperature, with_entropy)


def packing_layout(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For right-padded rows: the packed position ids [1, N], restarting at 0 with each row
    (which is how transformers finds the rows' bounds), and which packed positions start a row [N]."""
    lengths = attention_mask.sum(dim=1)
    row = torch.repeat_interleave(torch.arange(len(lengths), device=attention_mask.device), lengths)
    starts = torch.cumsum(lengths, 0) - lengths
    positions = torch.arange(len(row), device=attention_mask.device) - starts[row]
    return positions[None], positions == 0


def packed_forward(
    model, batch: MicroBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    real = batch.attention_mask.bool()
    ids = batch.input_ids[real][None]
    positions, row_start = packing_layout(batch.attention_mask)
    # a row's first token would be "predicted" from the previous row's last: never a loss token
    loss = (batch.loss_mask[real] & ~row_start)[None]
    keep = predicting(loss)
    logits = model(input_ids=ids, position_ids=positions, logits_to_keep=keep, use_cache=False).logits
    logprobs, entropy = kept_logprobs(logits, ids, loss, keep, temperature, with_entropy)
    zeros = torch.zeros(batch.input_ids.shape, dtype=logprobs.dtype, device=ids.device)
    if entropy is None:
        return zeros.masked_scatter(real, logprobs[0]), None
    return zeros.masked_scatter(real, logprobs[0]), zeros.masked_scatter(real, entropy[0])
