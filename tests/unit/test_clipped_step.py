"""An optimizer step whose gradient norm is not finite is skipped: one NaN would make every weight NaN."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.main import STAT_NAMES, clipped_step, step_metrics


def model_with_gradient(value: float) -> tuple[torch.nn.Linear, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.full_like(p, value)
    return model, optimizer


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_step_whose_gradient_is_not_finite_leaves_the_weights_as_they_were(bad):
    model, optimizer = model_with_gradient(bad)
    before = [p.detach().clone() for p in model.parameters()]
    norm = clipped_step(model, optimizer, 1.0, step=7)
    assert not math.isfinite(norm)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_a_finite_step_clips_and_moves_the_weights():
    model, optimizer = model_with_gradient(2.0)
    before = [p.detach().clone() for p in model.parameters()]
    norm = clipped_step(model, optimizer, 1.0, step=1)
    assert norm == pytest.approx(2.0 * math.sqrt(4))  # the norm before clipping: 4 entries of 2
    assert all(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_skipped_steps_are_counted_in_the_updates_metrics():
    sums = dict.fromkeys(STAT_NAMES, 0.0)
    rows = [{"input_ids": [1, 2, 3], "loss_mask": [False, True, True]}]
    metrics = step_metrics(sums, rows, [1.0, float("nan"), 2.0], mismatch_tokens=2)
    assert metrics["optimizer_steps"] == 3 and metrics["optimizer_steps_skipped"] == 1
