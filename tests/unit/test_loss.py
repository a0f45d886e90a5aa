import math

import pytest
import torch

from trainer.loss import clipped_pg_loss, entropy, token_logprobs


def test_token_logprobs_match_a_hand_softmax():
    logits = torch.tensor([[[1.0, 2.0, 0.0], [0.5, 0.5, 3.0], [0.0, 0.0, 0.0]]])
    ids = torch.tensor([[0, 1, 2]])
    for temperature in (1.0, 0.5):
        out = token_logprobs(logits, ids, temperature)

        def logp(row, tok, temperature=temperature):
            z = [x / temperature for x in row]
            return z[tok] - math.log(sum(math.exp(v) for v in z))

        expected = [0.0, logp([1.0, 2.0, 0.0], 1), logp([0.5, 0.5, 3.0], 2)]
        assert out[0].tolist() == pytest.approx(expected, abs=1e-6)


def test_entropy_of_uniform_is_log_vocab():
    logits = torch.zeros(1, 3, 4)
    assert entropy(logits, 1.0)[0].tolist() == pytest.approx([0.0, math.log(4), math.log(4)], abs=1e-6)


def test_clipped_loss_hand_computed():
    # two tokens of one sequence with advantage +1 and two of one with -1, eps 0.2
    lp = torch.tensor([[math.log(1.5), math.log(0.9)], [math.log(0.5), math.log(1.1)]])
    old = torch.zeros(2, 2)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[True, True], [True, False]])
    parts = clipped_pg_loss(lp, old, adv, mask, clip_eps=0.2, normalizer=3)
    # A=+1: ratio 1.5 -> min(1.5, 1.2) = 1.2; ratio 0.9 -> 0.9.  A=-1: ratio 0.5 -> min(-0.5, -0.8) = -0.8
    expected = (-1.2 - 0.9 + 0.8) / 3
    assert parts.loss.item() == pytest.approx(expected, abs=1e-6)
    assert parts.clipped_tokens.item() == 2  # 1.5 clipped at 1.2 and 0.5 clipped at 0.8


def reference_loss(lp, old, adv, mask, eps, normalizer):
    """Float64, loop-by-loop PPO-clip as in the paper."""
    total = 0.0
    for b in range(len(lp)):
        for t in range(len(lp[b])):
            if mask[b][t]:
                r = math.exp(lp[b][t] - old[b][t])
                total += -min(r * adv[b], max(min(r, 1 + eps), 1 - eps) * adv[b])
    return total / normalizer


def test_clipped_loss_and_gradient_against_float64_reference():
    gen = torch.Generator().manual_seed(0)
    lp = (torch.randn(4, 6, generator=gen, dtype=torch.float64) * 0.5).requires_grad_()
    old = torch.randn(4, 6, generator=gen, dtype=torch.float64) * 0.5
    adv = torch.randn(4, generator=gen, dtype=torch.float64)
    mask = torch.rand(4, 6, generator=gen) > 0.3
    parts = clipped_pg_loss(lp, old, adv, mask, clip_eps=0.2, normalizer=int(mask.sum()))
    want = reference_loss(lp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, int(mask.sum()))
    assert parts.loss.item() == pytest.approx(want, abs=1e-10)
    parts.loss.backward()
    # gradient: -A * r / N where unclipped term is the minimum, else 0; masked tokens get 0
    r = torch.exp(lp.detach() - old)
    a = adv.unsqueeze(-1)
    active = (r * a) <= (torch.clamp(r, 0.8, 1.2) * a)
    expected = torch.where(mask & active, -a * r / mask.sum(), torch.zeros_like(r))
    assert torch.allclose(lp.grad, expected, atol=1e-10)


def test_edge_cases_all_masked_and_zero_advantage():
    lp = torch.randn(2, 3, requires_grad=True)
    none = clipped_pg_loss(lp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3, dtype=torch.bool), 0.2, 1)
    assert none.loss.item() == 0.0
    zero = clipped_pg_loss(lp, torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool), 0.2, 6)
    zero.loss.backward()
    assert zero.loss.item() == 0.0 and torch.all(lp.grad == 0)


def test_mismatch_kl_is_zero_when_policies_agree():
    lp = torch.randn(2, 3)
    parts = clipped_pg_loss(lp, lp.clone(), torch.ones(2), torch.ones(2, 3, dtype=torch.bool), 0.2, 6)
    assert parts.mismatch_kl_sum.item() == pytest.approx(0.0, abs=1e-7)
