"""The fits of the shared decode and trainer rates to stated rates, on closed forms, and what
NeMo-RL's stated Tokens/sec/GPU column is."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench import simulate_published as published
from bench.simulate_rates import (
    NEMO_V05,
    OLD,
    V03,
    V03_GENERATION_S,
    fit_prime_rl,
    fit_v03,
    implied_tokens_per_sample,
    mean_sequence,
    v03_generation_s,
)
from shared.errors import TriadError
from simulate.hardware import (
    B200,
    GB200,
    H20,
    H200,
    Gpu,
    decode_tokens_per_s_per_gpu,
    hbm_efficiency_for,
    inference_for,
    mfu_for,
    trainer_for,
)


def test_decode_rate_is_the_model_iteration_by_hand() -> None:
    gpu, params = OLD, 8e9
    inf = inference_for(params, gpu)
    kv = 64 * 1500.0
    iteration = inf.iter_base_s + 64 * inf.iter_per_seq_s + kv * inf.iter_per_kv_token_s
    assert decode_tokens_per_s_per_gpu(params, gpu, 64, 1500) == pytest.approx(64 / iteration)
    # 4 ms launch + 16 GB of weights and 12.6 GB of KV at 0.6 x 3.35 TB/s + 64 x 32.4 us of compute
    # + attention's 4 x 32 layers x 32 heads x 128 FLOPs a KV token
    compute = 64 * 16e9 + kv * 4 * 32 * 32 * 128
    assert 64 / iteration == pytest.approx(64 / (0.004 + 28.58e9 / 2.01e12 + compute / 494.5e12), rel=1e-3)


@pytest.mark.parametrize("gpu, params, tp", [(Gpu(), 8e9, 0), (H20, 7e9, 0), (Gpu(), 70e9, 4)])
@pytest.mark.parametrize("efficiency", [0.3, 0.6, 0.95])
def test_hbm_efficiency_for_inverts_the_decode_rate(
    gpu: Gpu, params: float, tp: int, efficiency: float
) -> None:
    rate = decode_tokens_per_s_per_gpu(params, replace(gpu, hbm_efficiency=efficiency), 96, 2000, tp)
    assert hbm_efficiency_for(rate, params, gpu, 96, 2000, tp) == pytest.approx(efficiency, rel=1e-9)


def test_a_rate_beyond_launch_and_compute_is_refused() -> None:
    gpu = Gpu()
    ceiling = 32 / (gpu.launch_s + 32 * 2 * 8e9 / (gpu.peak_flops * gpu.compute_efficiency))
    with pytest.raises(TriadError, match="beyond the model's launch and compute costs"):
        hbm_efficiency_for(ceiling * 1.01, 8e9, gpu, 32, 1000)


def test_mfu_for_gives_the_trainer_the_stated_rate() -> None:
    gpu, params, rate = Gpu(), 8e9, 5000.0
    mfu = mfu_for(rate, params, gpu, logprob_passes=1)
    assert mfu == pytest.approx(8 * 8e9 * 5000 / 989e12)
    trainer = trainer_for(params, replace(gpu, mfu=mfu), logprob_passes=1)
    assert trainer.train_s(2_000_000, 8) - trainer.overhead_s == pytest.approx(2_000_000 / (8 * rate))


def test_nemo_tokens_per_gpu_is_the_whole_step_with_a_130_token_prompt() -> None:
    """rate x step x GPUs / samples less the mean completion: the same ~130 tokens in every row,
    so the column is the step's tokens over the step time and all GPUs, not a stage's rate."""
    prompts = [implied_tokens_per_sample(g, r, s) - m for _, _, g, m, r, s in NEMO_V05]
    assert [round(p) for p in prompts[:2]] == [127, 131]
    assert all(120 < p < 140 for p in prompts)


def test_the_shared_rates_are_the_fit_to_nemo_rl_v03() -> None:
    """The defaults are what `fit_v03` computes from the stated 58 s of generation and 28 + 18 s
    of training and log-probs, whatever rates it starts from; the fitted model generates the
    stated batch in the stated time."""
    fitted = fit_v03(OLD)
    assert fitted.hbm_efficiency == pytest.approx(Gpu().hbm_efficiency, abs=0.005)
    assert fitted.mfu == pytest.approx(Gpu().mfu, abs=0.0005)
    # each sample's 130 prompt tokens trained as well as its 795 completion tokens (NeMo-RL's prompt),
    # with attention's FLOPs: Llama-3.1-8B's 32 layers x 32 query heads x 128 at the lengths' mean
    # sequence per token (sum of S**2 over sum of S)
    per_token = 8e9 + 32 * 32 * 128 * mean_sequence(V03)
    assert fitted.mfu == pytest.approx(10 * per_token * 2048 * (130 + 795) / (8 * 45 * 989e12))
    assert 2000 < mean_sequence(V03) < 2150  # the capped lognormal's long tail: mean 925 a sample
    assert v03_generation_s(fitted) == pytest.approx(V03_GENERATION_S, rel=1e-6)
    assert fit_v03(replace(OLD, hbm_efficiency=0.3, mfu=0.9)) == fitted


def test_the_published_table_is_the_same_whichever_targets_and_rates_ran_before() -> None:
    """The rates are an argument: a table at the fitted rates after one at the guessed rates, and
    with its targets in the other order, gives the same rows (the bench used to rebind its
    scenarios' GPU as module state, so a table depended on what ran before it)."""
    from bench import simulate_published as published

    small = replace(published.NEMO, gpus=8, batch_prompts=4, group_size=8, steps=6)
    targets = [
        published.Target(
            "small sync step",
            "",
            10.0,
            lambda r: published.nemo_result(r, small, False, published.NEMO_MEAN).step_s(),
            absolute=True,
        ),
        published.Target(
            "prime-rl 4B",
            "",
            published.PRIME_4B[3],
            published.prime_rl_rate(published.PRIME_4B, published.QWEN3_4B_SHAPE),
            published.SET_2,
            True,
        ),
        published.Target(
            "weight sync", "", 1.0, lambda r: published.verl_sync_s(r, 7e9), published.SET_2, True
        ),
    ]
    fitted = published.Rates()
    guessed = published.Rates(OLD)
    alone = published.table(fitted, targets)
    old = published.table(guessed, targets)
    after = published.table(fitted, targets[::-1])[::-1]
    assert after == alone
    assert [r["predicted"] for r in old][:2] != [r["predicted"] for r in alone][:2]
    # prime-rl's step, two 64K-token sequences a GPU, activations recomputed: 8 x (N + 36 layers x 32
    # heads x 128 x 65,536) FLOPs a token at prime-rl's MFU, and its cost per parameter held
    tokens, prime = 2 * 8 * 65536, published.PRIME_RL
    flops_s = tokens * 8 * (4e9 + 36 * 32 * 128 * 65536) / (8 * 989e12 * prime.mfu)
    assert alone[1]["predicted"] == pytest.approx(tokens / (flops_s + prime.step_s_per_param * 4e9))
    assert published.counts(alone)["held out 2, absolute"] == (sum(r["within_15pct"] for r in alone[1:]), 2)


def test_held_out_set_3_is_twelve_stated_figures_from_three_sources() -> None:
    """verl's one-step-off page (4 steps, 2 total-time ratios), SkyRL's trainer table (5), NeMo-RL
    v0.6's 8-step-off row (1): what the bench's headline counts."""
    from bench import simulate_published as published

    rows = published.HELD_OUT_3
    assert len(rows) == 12 and all(t.split == published.SET_3 for t in rows)
    assert sorted({t.name.split()[0] for t in rows}) == ["NeMo-RL", "SkyRL", "verl"]
    assert sum(t.absolute for t in rows) == 10
    assert [round(t.published, 2) for t in rows if not t.absolute] == [1.24, 1.4]


def test_a_trainer_step_costs_its_flops_and_each_parameter_it_holds() -> None:
    """A mixture's experts are all held: the cost per parameter is by its total, the FLOPs by its
    active parameters."""
    gpu = replace(Gpu(), mfu=0.5, step_s_per_param=1e-9)
    trainer = trainer_for(30e9, gpu, active=3e9)
    assert trainer.train_s(1000, 4) == pytest.approx(1.0 + 30.0 + 6 * 3e9 * 1000 / (4 * 989e12 * 0.5))
    assert trainer_for(30e9, Gpu(), active=3e9).train_s(1000, 4) == pytest.approx(
        1.0 + 6 * 3e9 * 1000 / (4 * 989e12 * Gpu().mfu)
    )


def test_a_kind_of_gpu_takes_the_fitted_efficiencies_on_its_own_peaks() -> None:
    fitted = replace(Gpu(), mfu=0.3, hbm_efficiency=0.7, step_s_per_param=2e-9)
    for kind in (H20, H200, B200, GB200):
        on = fitted.on(kind)
        assert (on.name, on.peak_flops, on.hbm_bytes_per_s, on.memory_bytes) == (
            kind.name,
            kind.peak_flops,
            kind.hbm_bytes_per_s,
            kind.memory_bytes,
        )
        assert (on.mfu, on.hbm_efficiency, on.step_s_per_param) == (0.3, 0.7, 2e-9)
    rates = published.Rates()
    assert rates.kind(H20) == rates.h20
    assert rates.kind(GB200) == rates.h100.on(GB200)
    assert rates.kind(H200, rates.prime_rl).mfu == rates.prime_rl.mfu


def test_prime_rl_rates_are_the_least_squares_fit_to_its_h100_rows() -> None:
    """PRIME_RL is what fit_prime_rl gives, and moving either of its rates makes the fit worse."""
    fitted = fit_prime_rl(Gpu())
    assert published.PRIME_RL.mfu == pytest.approx(fitted.mfu, abs=5e-5)
    assert published.PRIME_RL.step_s_per_param == pytest.approx(fitted.step_s_per_param, rel=1e-3)

    def error(gpu: Gpu) -> float:
        out = 0.0
        for (params, gpus, sequence, rate), shape, active in published.PRIME_H100:
            model = published.trainer_tokens_per_s(gpu, params, gpus, sequence, shape, active)
            out += (rate / model - 1) ** 2  # the stated step time over the model's, less one
        return out

    best = error(fitted)
    for moved in (
        replace(fitted, mfu=fitted.mfu * 1.02),
        replace(fitted, mfu=fitted.mfu / 1.02),
        replace(fitted, step_s_per_param=fitted.step_s_per_param * 1.05),
        replace(fitted, step_s_per_param=fitted.step_s_per_param / 1.05),
    ):
        assert error(moved) > best


def test_verl_lengths_are_those_at_which_the_trainer_takes_the_stated_update() -> None:
    rates = published.Rates()
    sc = published.verl_7b(rates, 32)
    trainer = rates.on(sc).colocated_sync().trainer
    tokens = sc.batch_prompts * sc.group_size * (sc.prompt_tokens + sc.mean_tokens)
    update = trainer.overhead_s + 6 * sc.params * tokens / (32 * H20.peak_flops * rates.h20.mfu)
    assert update == pytest.approx(published.VERL_UPDATE_S[32])
    with pytest.raises(TriadError, match="update_actor 0.5 s gives a mean"):
        published.verl_mean(rates, sc, 0.5)


def test_held_out_set_4_is_every_unused_row_of_the_three_sources_on_their_gpus() -> None:
    """prime-rl's H200 and B200 trainer rows (5), NeMo-RL's GB200 rows (13 steps, 7 on-policy over
    one-step-off ratios), verl's staleness ablation (3 steps, 3 total-time ratios)."""
    rows = published.HELD_OUT_4
    assert len(rows) == 31 and all(t.split == published.SET_4 for t in rows)
    assert sorted({t.name.split()[0] for t in rows}) == ["NeMo-RL", "prime-rl", "verl"]
    assert sum(t.absolute for t in rows) == 21
    assert {t.name.split()[0] for t in rows if not t.absolute} == {"NeMo-RL", "verl"}
    assert [round(t.published, 3) for t in rows if t.name.startswith("verl") and not t.absolute] == [
        1.576,
        2.042,
        2.354,
    ]
