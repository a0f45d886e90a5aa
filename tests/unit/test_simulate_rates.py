"""The fits of the shared decode and trainer rates to stated rates, on closed forms, and what
NeMo-RL's stated Tokens/sec/GPU column is."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.simulate_rates import (
    NEMO_V05,
    OLD,
    V03,
    V03_GENERATION_S,
    fit_v03,
    implied_tokens_per_sample,
    mean_sequence,
    v03_generation_s,
)
from shared.errors import TriadError
from simulate.hardware import (
    H20,
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
    guessed = published.Rates(OLD, replace(H20, hbm_efficiency=OLD.hbm_efficiency, mfu=OLD.mfu))
    alone = published.table(fitted, targets)
    old = published.table(guessed, targets)
    after = published.table(fitted, targets[::-1])[::-1]
    assert after == alone
    assert [r["predicted"] for r in old][:2] != [r["predicted"] for r in alone][:2]
    # 64K-token sequences, activations recomputed: 8 x (N + 36 layers x 32 heads x 128 x 65,536) a token
    assert alone[1]["predicted"] == pytest.approx(
        8 * 989e12 * Gpu().mfu / (8 * (4e9 + 36 * 32 * 128 * 65536))
    )
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
