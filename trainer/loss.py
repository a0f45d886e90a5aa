"""Policy-gradient losses as small pure functions on tensors.

Token-level clipped policy gradient (PPO-clip as used by GRPO), against the
sampler's logprobs as the behaviour policy:

    r_t    = exp(logp_t - logp_sampler_t)
    loss_t = -min(r_t * A, clip(r_t, 1 - eps, 1 + eps) * A)
    loss   = sum_t(mask_t * loss_t) / normalizer

`normalizer` is the number of loss tokens in the whole batch (all ranks), so
each rank's share adds up to the batch's token mean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(input_ids[t] | input_ids[:t]) at temperature T, aligned to tokens; 0 at t = 0."""
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-token entropy of the next-token distribution, aligned like `token_logprobs`."""
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    return torch.nn.functional.pad(-(logp.exp() * logp).sum(-1), (1, 0))


@dataclass(frozen=True)
class LossParts:
    loss: torch.Tensor
    clipped_tokens: torch.Tensor
    mismatch_kl_sum: torch.Tensor


def clipped_pg_loss(
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    normalizer: float,
) -> LossParts:
    """`advantages` is per sequence [B] or per token [B, T]; `mask` is bool [B, T]."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    mask = mask.to(logprobs.dtype)
    log_ratio = logprobs - sampler_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        was_clipped = (clipped < unclipped).to(mask.dtype) * mask
        kl_k3 = (ratio - 1 - log_ratio) * mask  # k3 estimate of KL(sampler || trainer)
    return LossParts(
        loss=(per_token * mask).sum() / normalizer,
        clipped_tokens=was_clipped.sum(),
        mismatch_kl_sum=kl_k3.sum(),
    )
