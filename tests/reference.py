"""The whole-vocabulary logprobs and entropies, every position: what the trainer's forward
(`trainer/forward.py`, logits only where they predict a loss token) is checked against, and what
the plain loops of the tests and benches train with."""

from __future__ import annotations

import torch

from trainer.loss import distribution_entropy, log_softmax_at


def next_token_log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(. | input_ids[:t+1]) at temperature T, for t = 0..len-2 (float32)."""
    return log_softmax_at(logits[:, :-1], temperature)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(input_ids[t] | input_ids[:t]) at temperature T, aligned to tokens; 0 at t = 0."""
    log_probs = next_token_log_softmax(logits, temperature)
    picked = log_probs.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(picked, (1, 0))


def entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-token entropy of the next-token distribution, aligned like `token_logprobs`."""
    return torch.nn.functional.pad(distribution_entropy(next_token_log_softmax(logits, temperature)), (1, 0))
