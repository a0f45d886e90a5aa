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

The output layer runs only where its logits predict a loss token; the result is 0 where no loss
token is (every use of it is masked by the loss mask). With a vocabulary of 151,936 rows and a
small model, the output layer over a chat episode's prompt and tool results is most of a step's
compute. For model types whose output is that layer on the final hidden states and nothing more
(`PLAIN_HEAD_TYPES`), the layer runs with the log-softmax, chunk by chunk, each chunk recomputed in
the backward pass: the logits of a long micro-batch and their gradient are never whole in memory
(at 64K tokens of Qwen3-0.6B, 18 GiB each in bf16). Other types (which soft-cap or scale their
logits) run their own forward, with `logits_to_keep`.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule, register_fsdp_forward_method
from torch.utils.checkpoint import checkpoint

from trainer.data import MicroBatch
from trainer.loss import distribution_entropy, log_softmax_at

Forward = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]

# logits (positions x vocabulary) whose float32 log-softmax is taken at once: 1 GiB
LOGIT_CHUNK_ELEMENTS = 2**28
# causal-LM types whose forward is `lm_head(final hidden states)` and nothing more at the pinned
# transformers (no soft-capping or scaling of the logits); test_forward checks each against its
# own forward
PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"})
# the method FSDP2 gathers the root's parameters for, as for `forward` (`attach_kept_logprobs`)
KEPT_LOGPROBS = "triad_kept_logprobs"


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


def in_chunks(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor]],
    inputs: torch.Tensor,
    targets: torch.Tensor,
    vocabulary: int,
    *args,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`fn(inputs, targets, *args)` over positions (dimension 1) in chunks of about
    `LOGIT_CHUNK_ELEMENTS` logits, each recomputed in the backward pass rather than kept (one
    chunk is kept). The results are new tensors, not views (which FSDP2 warns of)."""
    per_chunk = max(1, LOGIT_CHUNK_ELEMENTS // (inputs.shape[0] * vocabulary))
    if inputs.shape[1] <= per_chunk:
        parts = [fn(inputs, targets, *args)]
    else:
        parts = []
        for a in range(0, inputs.shape[1], per_chunk):
            chunk = (inputs[:, a : a + per_chunk], targets[:, a : a + per_chunk])
            parts.append(checkpoint(fn, *chunk, *args, use_reentrant=False))
    return torch.cat([p[0] for p in parts], 1), torch.cat([p[1] for p in parts], 1)


def chunked_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_logprobs` of [B, K, V] logits in chunks: the float32 log-softmax of a long
    micro-batch (63K positions x 151,936 tokens: 38 GB) is never whole in memory."""
    return in_chunks(chunk_logprobs, logits, targets, logits.shape[2], temperature, with_entropy)


def head_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Module, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """`chunk_logprobs` of the output layer `head` on [B, C, H] final hidden states."""
    return chunk_logprobs(head(hidden), targets, temperature, with_entropy)


def base_of(model: torch.nn.Module) -> torch.nn.Module:
    """The Hugging Face causal LM (of the one peft wraps)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def has_plain_head(model: torch.nn.Module) -> bool:
    return base_of(model).config.model_type in PLAIN_HEAD_TYPES


@dataclass(frozen=True)
class Scoring:
    """What a forward scores: the positions `keep` ([K]), the [B, K] token each of them predicts,
    the sampling temperature, and whether the entropies are wanted too."""

    keep: torch.Tensor
    targets: torch.Tensor
    temperature: float
    with_entropy: bool


def hidden_logprobs(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], scoring: Scoring
) -> tuple[torch.Tensor, torch.Tensor]:
    """For a model of `PLAIN_HEAD_TYPES`: the decoder's final hidden states at the kept positions,
    through the output layer and the log-softmax in chunks, to the [B, K] logprobs of the targets
    (and the entropies)."""
    base = base_of(model)
    hidden = base.model(**inputs, use_cache=False).last_hidden_state[:, scoring.keep]
    head = base.get_output_embeddings()
    return in_chunks(
        head_logprobs,
        hidden,
        scoring.targets,
        head.weight.shape[0],
        head,
        scoring.temperature,
        scoring.with_entropy,
    )


def attach_kept_logprobs(model: torch.nn.Module) -> None:
    """Give the FSDP-sharded `model` `hidden_logprobs` as a method that FSDP2 treats as a forward
    (it gathers the root's parameters, the output layer's among them, and registers the backward
    hooks), so that the output layer may run outside the model's own forward."""
    if isinstance(model, FSDPModule) and has_plain_head(model):
        setattr(model, KEPT_LOGPROBS, types.MethodType(hidden_logprobs, model))
        register_fsdp_forward_method(model, KEPT_LOGPROBS)


def target_logprobs(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], scoring: Scoring
) -> tuple[torch.Tensor, torch.Tensor]:
    """The [B, K] logprobs of the targets predicted at the kept positions (and the entropies)."""
    if not has_plain_head(model):
        logits = model(**inputs, logits_to_keep=scoring.keep, use_cache=False).logits
        return chunked_logprobs(logits, scoring.targets, scoring.temperature, scoring.with_entropy)
    method = getattr(model, KEPT_LOGPROBS, None)
    if method is None:
        if isinstance(model, FSDPModule):
            raise RuntimeError(
                f"{type(model).__name__} is sharded by FSDP but has no {KEPT_LOGPROBS}: "
                "call trainer.forward.attach_kept_logprobs(model) after fully_shard"
            )
        return hidden_logprobs(model, inputs, scoring)
    return method(inputs, scoring)


def kept_logprobs(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    input_ids: torch.Tensor,
    loss: torch.Tensor,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The [B, T] logprobs of the loss tokens of `input_ids` (and the entropies), 0 where no
    loss token is, from the logits only at the positions that predict one."""
    keep = predicting(loss)
    targets = (keep + 1).clamp(max=input_ids.shape[1] - 1)  # clamped only for predicting()'s masked 0
    scoring = Scoring(keep, input_ids[:, targets], temperature, with_entropy)
    picked, entropies = target_logprobs(model, inputs, scoring)
    zeros = torch.zeros(input_ids.shape, dtype=picked.dtype, device=input_ids.device)
    logprobs = zeros.index_copy(1, targets, picked) * loss
    if not with_entropy:
        return logprobs, None
    return logprobs, zeros.index_copy(1, targets, entropies) * loss


def padded_forward(
    model, batch: MicroBatch, temperature: float, with_entropy: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    return kept_logprobs(model, inputs, batch.input_ids, batch.loss_mask, temperature, with_entropy)


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
    inputs = dict(input_ids=ids, position_ids=positions)
    logprobs, entropy = kept_logprobs(model, inputs, ids, loss, temperature, with_entropy)
    zeros = torch.zeros(batch.input_ids.shape, dtype=logprobs.dtype, device=ids.device)
    if entropy is None:
        return zeros.masked_scatter(real, logprobs[0]), None
    return zeros.masked_scatter(real, logprobs[0]), zeros.masked_scatter(real, entropy[0])
