"""Policy-gradient losses as small pure functions on tensors.

Notation, per token t of sequence i: `logp` is the trainer's log-probability
(with gradient), `logq` the sampler's (the behaviour policy), `logp_prox` the
*proximal* policy's (AReaL's decoupled PPO: the trainer's weights before this
batch's first optimizer step, from a no-grad forward pass; with one optimizer
step per batch that is the current weights, `stop_grad(logp)`, and the caller
may leave it out), `A_i` the sequence's advantage, `m` the loss mask.

Per-token objectives (`kind`):
- ppo_clip (GRPO; DAPO's clip-higher with eps_high > eps_low):
      r = exp(logp - logq);  l_t = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A)
- cispo (MiniMax-M1): a clipped, stop-gradient importance weight on the log-prob:
      l_t = -stop_grad(clip(r, 1 - eps_low, 1 + eps_high)) * A * logp
- gspo (sequence-level ratio): s_i = exp(mean_t(logp - logq)) over the sequence,
      l_i = -min(s_i A, clip(s_i, 1 - eps_low, 1 + eps_high) A), one term per sequence.

Importance correction against the sampler (`importance`, for ppo_clip): the
decoupled form r = exp(logp - logp_prox) in the clipped objective, times a
behaviour weight w = exp(logp_prox - logq) that is
- none:     not used (r is taken against the sampler directly, as above);
- tis:      truncated, min(w, cap);
- mis_token: tokens with w > cap are masked out;
- mis_seq:  sequences whose w_i = exp(sum_t(logp_prox - logq)) > cap are masked out.

Aggregation (`aggregation`), over the whole batch (all ranks):
- token_mean:               sum_{i,t} m l / sum_{i,t} m
- seq_mean_token_mean:      mean_i( sum_t m l / sum_t m )
- seq_mean_token_sum_norm:  mean_i( sum_t m l / L )   (Dr. GRPO; L a constant length)

Optional KL penalty, beta * k(logp, logr) per token, aggregated as above, to a
reference policy `logp_ref` (a frozen copy of the base model) when given, else
to the sampler (logr = logq); k1 = logp - logr, k2 = (logp - logr)^2 / 2,
k3 = exp(logr - logp) - 1 - (logr - logp).

Robustness (float32, vLLM reporting an impossible token as -9999): at positions outside
the loss mask the sampler's logprob is replaced by the trainer's own (detached), so
nothing there can overflow; every log-ratio is clamped to +-MAX_LOG_RATIO before `exp`
(as verl does), and masking uses `torch.where`, never `w * keep` (inf * 0 = NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import get_args

import torch

from shared.config import KLEstimator, LossConfig, LossKind

MAX_LOG_RATIO = 20.0  # exp(20) ~ 5e8: finite in float32 with room for sums


def _exp_ratio(log_ratio: torch.Tensor) -> torch.Tensor:
    return torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


@dataclass(frozen=True)
class BatchTotals:
    """Batch-wide counts (all ranks), so that each rank's share adds up to the whole."""

    sequences: int
    tokens: int


@dataclass(frozen=True)
class LossParts:
    """The loss (this rank's share) and masked token sums for logging (no gradient)."""

    loss: torch.Tensor
    clipped_low: torch.Tensor  # the clipped term was taken (CISPO: the weight truncated), ratio below 1
    clipped_high: torch.Tensor  # ... above 1
    mismatch_kl_sum: torch.Tensor  # k3 of KL(sampler || trainer), the proximal policy where given
    ref_kl_sum: torch.Tensor  # k3 of KL(trainer || reference); 0 without a reference

    @property
    def clipped_tokens(self) -> torch.Tensor:
        return self.clipped_low + self.clipped_high


def log_softmax_at(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(.) of each position's logits at temperature T (float32)."""
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def distribution_entropy(log_probs: torch.Tensor) -> torch.Tensor:
    """The entropy of each distribution over the last dimension, from its log-probabilities."""
    return -(log_probs.exp() * log_probs).sum(-1)


def kl_penalty(logp: torch.Tensor, logq: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    diff = logp - logq
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "k3":
        return _exp_ratio(-diff) - 1 + diff
    raise ValueError(f"unknown KL estimator {estimator!r}")


def masked_kl(
    logp: torch.Tensor, target: torch.Tensor, mask: torch.Tensor, estimator: KLEstimator
) -> torch.Tensor:
    """`kl_penalty` on loss tokens, 0 elsewhere. Prompt and padding positions carry a sampler
    logprob of 0, where k3's exp(logq - logp) overflows float32 (inf * 0 = NaN) if masked after."""
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    keep = mask.bool()
    return kl_penalty(torch.where(keep, logp, zero), torch.where(keep, target, zero), estimator)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, spec: LossConfig, totals: BatchTotals
) -> torch.Tensor:
    """This rank's share of the batch aggregate of masked per-token losses."""
    masked = per_token * mask
    if spec.aggregation == "token_mean":
        return masked.sum() / max(totals.tokens, 1)
    per_seq = masked.sum(-1)
    if spec.aggregation == "seq_mean_token_mean":
        per_seq = per_seq / mask.sum(-1).clamp(min=1)
    elif spec.aggregation == "seq_mean_token_sum_norm":
        per_seq = per_seq / spec.norm_length
    else:
        raise ValueError(f"unknown loss aggregation {spec.aggregation!r}")
    return per_seq.sum() / max(totals.sequences, 1)


def _clip(ratio: torch.Tensor, spec: LossConfig) -> torch.Tensor:
    return torch.clamp(ratio, 1 - spec.eps_low, 1 + spec.eps_high)


def _behaviour_weight(
    logp_prox: torch.Tensor, logq: torch.Tensor, mask: torch.Tensor, spec: LossConfig
) -> torch.Tensor:
    """w = pi_prox / pi_sampler per token, truncated or masked as `spec.importance` says.
    Decided in log space, so an overflowing w (e^100 in float32) is masked, not NaN."""
    keep_mask = mask.bool()
    log_w = torch.where(keep_mask, logp_prox - logq, torch.zeros_like(logq))
    log_cap = math.log(spec.importance_cap)
    zero = torch.zeros_like(log_w)
    if spec.importance == "tis":
        return torch.exp(torch.clamp(log_w, max=log_cap))
    if spec.importance == "mis_token":
        return torch.where(log_w <= log_cap, _exp_ratio(log_w), zero)
    if spec.importance == "mis_seq":
        seq_ok = log_w.sum(-1, keepdim=True) <= log_cap
        return torch.where(seq_ok, _exp_ratio(log_w), zero)
    raise ValueError(f"unknown importance correction {spec.importance!r}")


def policy_loss(
    logp: torch.Tensor,
    logq: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    spec: LossConfig,
    totals: BatchTotals,
    logp_prox: torch.Tensor | None = None,
    logp_ref: torch.Tensor | None = None,
) -> LossParts:
    """`advantages` per sequence [B] or per token [B, T]; `mask` bool [B, T]; the optional
    `logp_prox` (no gradient) and `logp_ref` are [B, T] like `logp`."""
    if spec.kind not in get_args(LossKind):
        raise ValueError(f"unknown loss kind {spec.kind!r}")
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    m = mask.to(logp.dtype)
    keep = mask.bool()
    logq = torch.where(keep, logq, logp.detach())  # prompt, padding, -9999: no overflow, no gradient
    prox = logp.detach() if logp_prox is None else torch.where(keep, logp_prox.detach(), logp.detach())
    log_ratio = logp - logq
    if spec.kind == "gspo":
        seq_log_ratio = (log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1)
        ratio = _exp_ratio(seq_log_ratio).expand_as(logp)
    elif spec.importance != "none":
        ratio = _exp_ratio(logp - prox)
    else:
        ratio = _exp_ratio(log_ratio)
    unclipped, clipped = ratio * adv, _clip(ratio, spec) * adv
    if spec.kind == "cispo":
        pg = -_clip(ratio, spec).detach() * adv * logp
    else:
        pg = -torch.minimum(unclipped, clipped)
    if spec.kind == "ppo_clip" and spec.importance != "none":
        pg = pg * _behaviour_weight(prox, logq, m, spec)
    if spec.kind == "gspo":  # one term per sequence (the ratio is the same on all its tokens)
        loss = (pg[:, 0] * (m.sum(-1) > 0)).sum() / max(totals.sequences, 1)
    else:
        loss = aggregate(pg, m, spec, totals)
    if spec.kl_coef:
        target = logq if logp_ref is None else logp_ref.detach()
        penalty = masked_kl(logp, target, mask, spec.kl_estimator)
        loss = loss + spec.kl_coef * aggregate(penalty, m, spec, totals)
    with torch.no_grad():
        if spec.kind == "cispo":  # the weight is truncated whatever the advantage's sign
            was_clipped = (_clip(ratio, spec) != ratio).to(m.dtype) * m
        else:
            was_clipped = (clipped < unclipped).to(m.dtype) * m
        below = (ratio < 1).to(m.dtype)
        mismatch = masked_kl(logq, prox, mask, "k3").sum()
        ref_kl = torch.zeros_like(mismatch)
        if logp_ref is not None:
            ref_kl = masked_kl(logp, logp_ref, mask, "k3").sum()
    return LossParts(
        loss=loss,
        clipped_low=(was_clipped * below).sum(),
        clipped_high=(was_clipped * (1 - below)).sum(),
        mismatch_kl_sum=mismatch,
        ref_kl_sum=ref_kl,
    )
