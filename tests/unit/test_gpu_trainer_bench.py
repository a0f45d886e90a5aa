"""bench/gpu_trainer.py at a toy size on the CPU: triad's own trainer runs each measured update,
its forward agrees with a plain transformers forward, and its MFU is counted as prime-rl counts it."""

from __future__ import annotations

import math

import pytest

from bench.gpu_trainer import (
    Setting,
    build_model,
    forward_check,
    loss_check,
    measure,
    model_flops,
    peak_flops,
    rows_of,
    table,
)

QWEN3_0_6B_PARAMETERS = 596_049_920  # tests/realsize.py builds this count from the vendored config


@pytest.fixture
def one_rank(monkeypatch):
    """The environment variables a one-rank group sets, restored after the test."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_mfu_is_counted_as_prime_rl_counts_it():
    """prime-rl's published pair for Qwen3-0.6B at 64K on one H100: 10,147 tokens/s is 26.8% MFU."""
    rows = rows_of(65536, "one", vocab=8, seed=0)
    flops = model_flops(rows, QWEN3_0_6B_PARAMETERS, layers=28, attention_width=16 * 128)
    step_s = 65536 / 10_147
    assert flops / step_s / peak_flops("NVIDIA H100 80GB HBM3") == pytest.approx(0.268, abs=0.001)


def test_packed_rows_fill_the_update_and_count_attention_per_row():
    rows = rows_of(8192, "packed", vocab=8, seed=0)
    assert [len(r["input_ids"]) for r in rows] == [2048] * 4
    assert all(not any(r["loss_mask"][:64]) and all(r["loss_mask"][64:]) for r in rows)
    one = rows_of(8192, "one", vocab=8, seed=0)
    # the same tokens, a quarter of the causal attention work
    attention = model_flops(one, 0, 1, 1) - model_flops(rows, 0, 1, 1)
    assert attention == 6 * (8192**2 - 4 * 2048**2)
    assert peak_flops("cpu") is None


def test_the_bench_measures_triads_trainer_and_checks_its_forward_and_losses(tmp_path, one_rank):
    model = build_model("toy", tmp_path)
    rows = measure(Setting("one", checkpointing=True, compile=False), model, tmp_path / "a", [128])
    assert [r["tokens"] for r in rows] == [128]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["mfu"] is None  # no peak is known for a CPU
        assert math.isfinite(r["loss"]) and r["grad_norm"] > 0
    fp32 = forward_check(model, tmp_path / "b", 128, "fp32")
    assert fp32["rows"] == 2 and fp32["max_abs"] < 1e-5
    bf16 = forward_check(model, tmp_path / "c", 128, "bf16")
    assert 1e-5 < bf16["max_abs"] < 0.05  # bf16 parameters: rounded, not wrong
    losses = loss_check("cpu")
    assert losses["cases"] == 32 and losses["float64_max_loss_diff"] < 1e-12
    assert losses["float32_max_grad_diff"] < 1e-6
    out = table(
        dict(size="toy", settings=[dict(setting="s", rows=rows), dict(setting="t", rows={"error": "boom"})])
    )
    assert "| one, AC, eager, sdpa | 128 |" in out and "| t | | boom |" in out
