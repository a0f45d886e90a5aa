import math

import pytest
import torch

from shared.config import LossConfig
from tests.reference import entropy, token_logprobs
from trainer.loss import BatchTotals, policy_loss


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
    # two tokens of one sequence with advantage +1 and one of one with -1, eps 0.2
    lp = torch.tensor([[math.log(1.5), math.log(0.9)], [math.log(0.5), math.log(1.1)]])
    mask = torch.tensor([[True, True], [True, False]])
    parts = policy_loss(
        lp, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), mask, LossConfig(), BatchTotals(2, 3)
    )
    # A=+1: ratio 1.5 -> min(1.5, 1.2) = 1.2; ratio 0.9 -> 0.9.  A=-1: ratio 0.5 -> min(-0.5, -0.8) = -0.8
    assert parts.loss.item() == pytest.approx((-1.2 - 0.9 + 0.8) / 3, abs=1e-6)
    assert parts.clipped_tokens.item() == 2


def test_clip_higher_is_asymmetric():
    lp = torch.tensor([[math.log(1.25)]])
    mask = torch.ones(1, 1, dtype=torch.bool)
    one = BatchTotals(1, 1)
    assert policy_loss(
        lp, torch.zeros(1, 1), torch.ones(1), mask, LossConfig(), one
    ).loss.item() == pytest.approx(-1.2)
    dapo = LossConfig(eps_low=0.2, eps_high=0.28)
    assert policy_loss(lp, torch.zeros(1, 1), torch.ones(1), mask, dapo, one).loss.item() == pytest.approx(
        -1.25
    )


# -- an independent float64 reference, one scalar at a time ---------------------------------------


def clip(x, spec):
    return torch.clamp(x, 1 - spec.eps_low, 1 + spec.eps_high)


def kl(lp, lq, estimator):
    d = lp - lq
    return {"k1": d, "k2": 0.5 * d * d, "k3": torch.exp(-d) - 1 + d}[estimator]


def reference_loss(lp, lq, adv, mask, spec: LossConfig, prox=None, ref=None):
    """`prox`: the proximal policy (default: the current weights, detached); `ref`: the KL target
    (default: the sampler)."""
    B, T = lp.shape
    prox = lp.detach() if prox is None else prox
    ref = lq if ref is None else ref
    n_seq, n_tok = B, int(mask.sum())
    pg_terms, kl_terms = [], []  # per sequence: list of per-token scalars
    total = torch.zeros((), dtype=torch.float64)
    for i in range(B):
        toks = [t for t in range(T) if mask[i, t]]
        a = adv[i]
        if spec.kind == "gspo" and toks:
            s = torch.exp(sum(lp[i, t] - lq[i, t] for t in toks) / len(toks))
            total = total - torch.minimum(s * a, clip(s, spec) * a) / n_seq
        seq_w = torch.exp(sum((prox[i, t] - lq[i, t] for t in toks), torch.zeros((), dtype=torch.float64)))
        pg, kls = [], []
        for t in toks:
            if spec.kind == "cispo":
                pg.append(-clip(torch.exp(lp[i, t] - lq[i, t]), spec).detach() * a * lp[i, t])
            elif spec.kind == "ppo_clip" and spec.importance != "none":
                r = torch.exp(lp[i, t] - prox[i, t])
                w = torch.exp(prox[i, t] - lq[i, t])
                if spec.importance == "tis":
                    w = torch.clamp(w, max=spec.importance_cap)
                elif spec.importance == "mis_token":
                    w = w if w <= spec.importance_cap else w * 0
                else:
                    w = w if seq_w <= spec.importance_cap else w * 0
                pg.append(-torch.minimum(r * a, clip(r, spec) * a) * w)
            elif spec.kind == "ppo_clip":
                r = torch.exp(lp[i, t] - lq[i, t])
                pg.append(-torch.minimum(r * a, clip(r, spec) * a))
            kls.append(kl(lp[i, t], ref[i, t], spec.kl_estimator))
        pg_terms.append(pg)
        kl_terms.append(kls)

    def agg(per_seq):
        if spec.aggregation == "token_mean":
            return sum((x for seq in per_seq for x in seq), torch.zeros((), dtype=torch.float64)) / n_tok
        out = torch.zeros((), dtype=torch.float64)
        for seq in per_seq:
            if seq:
                denom = len(seq) if spec.aggregation == "seq_mean_token_mean" else spec.norm_length
                out = out + sum(seq) / denom
        return out / n_seq

    if spec.kind != "gspo":
        total = total + agg(pg_terms)
    if spec.kl_coef:
        total = total + spec.kl_coef * agg(kl_terms)
    return total


SPECS = [
    LossConfig(),
    LossConfig(eps_high=0.28, aggregation="seq_mean_token_mean"),
    LossConfig(aggregation="seq_mean_token_sum_norm", norm_length=7),
    LossConfig(kind="cispo", eps_low=1.0, eps_high=0.3),
    LossConfig(kind="gspo", eps_low=3e-3, eps_high=4e-3),
    LossConfig(importance="tis", importance_cap=1.5),
    LossConfig(importance="mis_token", importance_cap=1.2),
    LossConfig(importance="mis_seq", importance_cap=1.3),
    LossConfig(kl_coef=0.1, kl_estimator="k1"),
    LossConfig(kl_coef=0.1, kl_estimator="k2", aggregation="seq_mean_token_mean"),
    LossConfig(kind="gspo", kl_coef=0.05, kl_estimator="k3"),
]


def random_batch(seed: int, scale: float = 0.4):
    gen = torch.Generator().manual_seed(seed)
    lp = (torch.randn(5, 7, generator=gen, dtype=torch.float64) * scale - 1).requires_grad_()
    lq = lp.detach() + torch.randn(5, 7, generator=gen, dtype=torch.float64) * scale
    adv = torch.randn(5, generator=gen, dtype=torch.float64)
    mask = torch.rand(5, 7, generator=gen) > 0.3
    mask[3] = False  # an all-masked row
    return lp, lq, adv, mask


@pytest.mark.parametrize(
    "spec", SPECS, ids=lambda s: f"{s.kind}-{s.aggregation}-{s.importance}-kl{s.kl_coef}"
)
@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradient_against_float64_reference(spec, seed):
    lp, lq, adv, mask = random_batch(seed)
    got = policy_loss(lp, lq, adv, mask, spec, BatchTotals(lp.shape[0], int(mask.sum()))).loss
    (grad,) = torch.autograd.grad(got, lp)
    want = reference_loss(lp, lq, adv, mask, spec)
    (want_grad,) = torch.autograd.grad(want, lp)
    assert got.item() == pytest.approx(want.item(), abs=1e-10)
    assert torch.allclose(grad, want_grad, atol=1e-10)
    assert torch.all(grad[~mask] == 0)  # masked tokens get no gradient


DECOUPLED = [
    LossConfig(importance="tis", importance_cap=1.5, kl_coef=0.1, kl_estimator="k3"),
    LossConfig(importance="mis_token", importance_cap=1.2, eps_high=0.28, kl_coef=0.2, kl_estimator="k2"),
    LossConfig(importance="mis_seq", importance_cap=1.3, aggregation="seq_mean_token_mean", kl_coef=0.1),
    LossConfig(kind="gspo", eps_low=3e-3, eps_high=4e-3, kl_coef=0.05, kl_estimator="k1"),
    LossConfig(kind="cispo", eps_low=1.0, eps_high=0.3, kl_coef=0.1),
]


@pytest.mark.parametrize("spec", DECOUPLED, ids=lambda s: f"{s.kind}-{s.importance}-{s.kl_estimator}")
@pytest.mark.parametrize("seed", [0, 1])
def test_proximal_policy_and_reference_kl_against_float64_reference(spec, seed):
    """AReaL's decoupled objective with a proximal policy apart from the current weights (as
    after an earlier optimizer step on the same batch), and the KL penalty to a reference model."""
    lp, lq, adv, mask = random_batch(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    prox = lp.detach() + torch.randn(lp.shape, generator=gen, dtype=torch.float64) * 0.2
    ref = lp.detach() + torch.randn(lp.shape, generator=gen, dtype=torch.float64) * 0.3
    totals = BatchTotals(lp.shape[0], int(mask.sum()))
    parts = policy_loss(lp, lq, adv, mask, spec, totals, logp_prox=prox, logp_ref=ref)
    (grad,) = torch.autograd.grad(parts.loss, lp)
    want = reference_loss(lp, lq, adv, mask, spec, prox=prox, ref=ref)
    (want_grad,) = torch.autograd.grad(want, lp)
    assert parts.loss.item() == pytest.approx(want.item(), abs=1e-10)
    assert torch.allclose(grad, want_grad, atol=1e-10)
    d = lp.detach() - ref
    assert parts.ref_kl_sum.item() == pytest.approx(((torch.exp(-d) - 1 + d) * mask).sum().item(), abs=1e-10)
    # the proximal policy matters exactly where the objective uses it
    plain = policy_loss(lp, lq, adv, mask, spec, totals, logp_ref=ref).loss
    if spec.importance != "none":
        assert abs(plain.item() - parts.loss.item()) > 1e-3
    else:
        assert plain.item() == parts.loss.item()


def test_reference_kl_penalty_pulls_towards_the_reference_not_the_sampler():
    lp = torch.zeros(1, 2, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(1, 2, dtype=torch.bool)
    spec = LossConfig(kl_coef=1.0, kl_estimator="k2")
    lq, ref = torch.zeros(1, 2, dtype=torch.float64), torch.full((1, 2), -0.5, dtype=torch.float64)
    # zero advantage: only the penalty, k2 = (logp - ref)^2 / 2 = 0.125 on each of the 2 tokens
    parts = policy_loss(
        lp, lq, torch.zeros(1, dtype=torch.float64), mask, spec, BatchTotals(1, 2), logp_ref=ref
    )
    (grad,) = torch.autograd.grad(parts.loss, lp)
    assert parts.loss.item() == pytest.approx(0.125)
    assert grad[0].tolist() == pytest.approx([0.25, 0.25])  # d/dlogp of (logp + 0.5)^2 / 2, over 2 tokens
    assert parts.ref_kl_sum.item() == pytest.approx(2 * (math.exp(-0.5) - 1 + 0.5))


def test_clip_fractions_split_by_side():
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.7]]))
    adv = torch.tensor([[1.0, -1.0, 1.0, 1.0]])  # per token
    mask = torch.ones(1, 4, dtype=torch.bool)
    parts = policy_loss(lp, torch.zeros(1, 4), adv, mask, LossConfig(), BatchTotals(1, 4))
    # 1.5 with A>0 is clipped above; 0.5 with A<0 below; 1.1 is inside; 0.7 with A>0 is not clipped
    assert (parts.clipped_low.item(), parts.clipped_high.item()) == (1.0, 1.0)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.kind}-{s.aggregation}-{s.importance}")
def test_extreme_ratios_stay_finite(spec):
    lp, lq, adv, mask = random_batch(2)
    lq = lp.detach() + torch.where(torch.rand(lp.shape) > 0.5, 20.0, -20.0).double()  # ratios e^+-20
    parts = policy_loss(lp, lq, adv, mask, spec, BatchTotals(5, int(mask.sum())))
    (grad,) = torch.autograd.grad(parts.loss, lp)
    assert torch.isfinite(parts.loss) and torch.isfinite(grad).all()


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_kl_to_the_sampler_ignores_prompt_positions_in_float32(estimator):
    """Prompt and padding positions carry a sampler logprob of 0; an unlikely prompt token
    (logp -100 at a low temperature) made k3's exp(logq - logp) overflow: inf * 0 = NaN."""
    lp = torch.tensor([[-100.0, -1.0, -2.0]], requires_grad=True)
    lq = torch.tensor([[0.0, -1.5, -1.0]])
    mask = torch.tensor([[False, True, True]])
    spec = LossConfig(kl_coef=0.1, kl_estimator=estimator)
    parts = policy_loss(lp, lq, torch.ones(1), mask, spec, BatchTotals(1, 2))
    (grad,) = torch.autograd.grad(parts.loss, lp)
    assert torch.isfinite(parts.loss) and torch.isfinite(grad).all() and grad[0, 0] == 0
    assert torch.isfinite(parts.mismatch_kl_sum)
    plain = policy_loss(lp[:, 1:], lq[:, 1:], torch.ones(1), mask[:, 1:], spec, BatchTotals(1, 2))
    assert parts.loss.item() == pytest.approx(plain.loss.item(), rel=1e-6)


def test_zero_advantages_and_all_masked_give_zero():
    lp = torch.randn(2, 3, requires_grad=True)
    for spec in (
        LossConfig(),
        LossConfig(kind="gspo"),
        LossConfig(kind="cispo"),
        LossConfig(importance="tis"),
    ):
        zero = policy_loss(
            lp, torch.zeros(2, 3), torch.zeros(2), torch.ones(2, 3, dtype=torch.bool), spec, BatchTotals(2, 6)
        )
        none = policy_loss(
            lp, torch.zeros(2, 3), torch.ones(2), torch.zeros(2, 3, dtype=torch.bool), spec, BatchTotals(2, 0)
        )
        assert zero.loss.item() == 0.0 and none.loss.item() == 0.0


def test_shares_add_up_across_ranks():
    """Each rank's share, summed, equals the loss of the whole batch on one rank."""
    lp, lq, adv, mask = random_batch(3)
    for spec in SPECS:
        totals = BatchTotals(5, int(mask.sum()))
        whole = policy_loss(lp, lq, adv, mask, spec, totals).loss
        shares = sum(
            policy_loss(lp[s], lq[s], adv[s], mask[s], spec, totals).loss for s in (slice(0, 2), slice(2, 5))
        )
        assert shares.item() == pytest.approx(whole.item(), abs=1e-12)


def test_cispo_counts_every_truncated_weight_whatever_the_advantage():
    """CISPO truncates the ratio itself: 1.5 with A<0 and 0.5 with A>0 are clipped too (the
    PPO count, which asks whether the clipped term was taken, misses both)."""
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5, 1.1]]))
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0, -1.0]])
    mask = torch.ones(1, 5, dtype=torch.bool)
    spec = LossConfig(kind="cispo", eps_low=0.2, eps_high=0.2)
    parts = policy_loss(lp, torch.zeros(1, 5), adv, mask, spec, BatchTotals(1, 5))
    assert (parts.clipped_low.item(), parts.clipped_high.item()) == (2.0, 2.0)


def test_mismatch_kl_is_to_the_proximal_policy_where_given():
    """With proximal logprobs (the weights the update started from), the sampler is compared with
    them, not with the current weights an earlier optimizer step of the batch moved."""
    start = torch.randn(2, 3)
    moved = start + 0.5
    mask = torch.ones(2, 3, dtype=torch.bool)
    args = (torch.ones(2), mask, LossConfig(importance="tis"), BatchTotals(2, 6))
    parts = policy_loss(moved, start.clone(), *args, logp_prox=start)
    assert parts.mismatch_kl_sum.item() == pytest.approx(0.0, abs=1e-7)
    without = policy_loss(moved, start.clone(), *args)
    assert without.mismatch_kl_sum.item() == pytest.approx(6 * (math.exp(0.5) - 1 - 0.5), rel=1e-5)


def test_mismatch_kl_is_zero_when_policies_agree():
    lp = torch.randn(2, 3)
    parts = policy_loss(
        lp, lp.clone(), torch.ones(2), torch.ones(2, 3, dtype=torch.bool), LossConfig(), BatchTotals(2, 6)
    )
    assert parts.mismatch_kl_sum.item() == pytest.approx(0.0, abs=1e-7)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kind", "ppo", "unknown loss kind 'ppo'"),
        ("aggregation", "mean", "unknown loss aggregation 'mean'"),
        ("importance", "is", "unknown importance correction 'is'"),
        ("kl_estimator", "k4", "unknown KL estimator 'k4'"),
    ],
)
def test_unknown_loss_settings_are_refused(field, value, message):
    """The config refuses them; a spec built around validation fails in the loss, not silently."""
    with pytest.raises(ValueError, match=field):
        LossConfig(**{field: value})
    spec = LossConfig.model_construct(**{field: value}, kl_coef=0.1)
    lp, mask = torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match=message):
        policy_loss(lp, lp.clone(), torch.ones(1), mask, spec, BatchTotals(1, 2))


ALL_OPTIONS = (
    SPECS
    + DECOUPLED
    + [
        LossConfig(importance="tis", importance_cap=2.0, kl_coef=0.1, kl_estimator="k3"),
        LossConfig(importance="mis_token", importance_cap=2.0, kl_coef=0.1, kl_estimator="k3"),
        LossConfig(importance="mis_seq", importance_cap=2.0, kl_coef=0.1, kl_estimator="k3"),
    ]
)


@pytest.mark.parametrize("spec", ALL_OPTIONS, ids=lambda s: f"{s.kind}-{s.importance}-{s.kl_estimator}")
@pytest.mark.parametrize("with_prox", [False, True])
def test_float32_overflowing_behaviour_weights_and_minus_9999_give_finite_gradients(spec, with_prox):
    """Behaviour weights e^+-100 (overflow float32: inf, and inf * 0 = NaN when masked by a
    product) on loss tokens, and a masked position holding vLLM's -9999 for an impossible token."""
    gen = torch.Generator().manual_seed(7)
    lp = (torch.randn(3, 6, generator=gen) * 0.3 - 1).requires_grad_()
    mask = torch.tensor([[False, True, True, True, False, False]] * 3)
    shift = torch.tensor([[0.0, 100.0, -100.0, 0.1, 0.0, 0.0]] * 3)
    prox = lp.detach() + 0.05 if with_prox else None
    lq = lp.detach() - shift
    lq[:, 0] = -9999.0  # a prompt position
    lq[:, 5] = -9999.0  # a padding position
    adv = torch.tensor([1.0, -1.0, 0.5])
    parts = policy_loss(lp, lq, adv, mask, spec, BatchTotals(3, int(mask.sum())), logp_prox=prox)
    (grad,) = torch.autograd.grad(parts.loss, lp)
    assert torch.isfinite(parts.loss), spec
    assert torch.isfinite(grad).all(), spec
    assert torch.all(grad[~mask] == 0)
    assert torch.isfinite(parts.mismatch_kl_sum)


@pytest.mark.parametrize("importance", ["mis_token", "mis_seq"])
def test_masked_importance_drops_an_overflowing_weight_and_keeps_the_rest(importance):
    """mis_token masks only the token with w = e^100; mis_seq its whole sequence: the loss equals
    that of the batch without them."""
    spec = LossConfig(importance=importance, importance_cap=2.0)
    lp = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -0.7, -1.1]], requires_grad=True)
    lq = lp.detach().clone()
    lq[0, 1] = lp[0, 1].item() - 100.0
    mask = torch.ones(2, 3, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0])
    got = policy_loss(lp, lq, adv, mask, spec, BatchTotals(2, 6)).loss
    kept = mask.clone()
    if importance == "mis_token":
        kept[0, 1] = False
    else:
        kept[0] = False
    want = policy_loss(
        lp, lq, adv, kept, LossConfig(importance="tis", importance_cap=2.0), BatchTotals(2, 6)
    ).loss
    assert torch.isfinite(got) and got.item() == pytest.approx(want.item(), abs=1e-6)
