"""The shared decode and trainer rates, fitted to a stated run's phase times.

The rates (simulate/hardware.py's `Gpu`: `hbm_efficiency`, `mfu`) were guesses. NeMo-RL's
performance summary (v0.4-v0.6), which issue 35's rows come from, defines per-stage Tokens/sec/GPU
and a training MFU but tabulates one Tokens/sec/GPU per row and no MFU; `implied_tokens_per_sample`
shows that column to be the whole step's tokens over the step time and all GPUs (the same
~130-token prompt falls out of every Llama-3.1-8B row): it restates the step time the published
table checks. NeMo-RL's v0.3 blog states phase times of another run (`V03`): `fit_v03` fits
`hbm_efficiency` to its generation time and the MFU to its training and log-prob times, the
other decode costs kept; `fit_prime_rl` fits prime-rl's trainer to its own rows.
`step_bound_rates` gives the floors that v0.5's one-step-off step puts under both (each phase
fits in the step), a check of the fit. Writes bench/results/simulate_rates.{json,md}: the stated
rows, the fits, the floors, and the published table under the guessed and the fitted rates side by
side, with the phase-time checks.

    python -m bench.simulate_rates"""

from __future__ import annotations

import datetime
import json
import random
import time
from collections.abc import Callable
from dataclasses import replace

from bench import simulate_published as published
from simulate.hardware import Gpu, mfu_for
from simulate.pipeline import simulate
from simulate.scenario import Scenario
from simulate.setup import Setup

# NeMo-RL performance summary v0.5 (docs/about/performance-summary.md at tag v0.5.0), Llama-3.1-8B,
# G-GBS 2048: (table, policy, GPUs, G-Average Seq len, Tokens / sec / GPU, Total Step time (s))
NEMO_V05 = (
    ("H100 BF16", "on policy", 16, 1019, 1581, 92.8),
    ("H100 BF16", "1-step off", 16, 1123, 2478, 64.8),
    ("H100 FP8", "1-step off", 16, 1128, 3052, 53.0),
    ("GB200 BF16", "on policy", 8, 1066, 3359, 91.0),
    ("GB200 BF16", "1-step off", 8, 1107, 4463, 71.1),
)
SAMPLES = 2048
ASYNC_STEP_S = 64.8  # H100 BF16, one-step-off: 8 GPUs generate, 8 train
ASYNC_GPUS = 8


# NeMo-RL v0.3 blog (<https://nvidia-nemo.github.io/blog/2025/07/21/nemo-rl-v0.3/>), its table as
# quoted in NVIDIA-NeMo/RL issue 959: Llama 3.1-8B Instruct, Megatron, 1 node x 8 GPUs (H100): total
# step 112 s = policy training 28 + refit 5 + generation 58 + get logprobs 18; 795 generated tokens
# per sample. Its setup, `examples/configs/grpo_math_8B_megatron.yaml` at tag v0.3.0: 64 prompts x
# 32 generations, max_total_sequence_length 4096, 1 node of 8, generation and training colocated.
V03_GENERATION_S, V03_TRAINING_S, V03_LOGPROBS_S = 58.0, 28.0, 18.0
V03 = replace(published.NEMO, gpus=8, mean_tokens=795.0)  # NeMo-RL's rules (its prompt), 8 GPUs
OLD = Gpu(hbm_efficiency=0.6, mfu=0.35)  # the guesses before the fit, for the side-by-side table


def hbm_efficiency_at(base: Gpu, seconds_at: Callable[[Gpu], float], seconds: float, rounds: int) -> float:
    """The `hbm_efficiency` at which `seconds_at` (a generation time, falling as the efficiency
    rises) is `seconds`, the rest of `base` kept: a geometric bisection over 0.05-20 (the
    generation tail makes it no closed form)."""
    lo, hi = 0.05, 20.0
    for _ in range(rounds):
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if seconds_at(replace(base, hbm_efficiency=mid)) > seconds else (lo, mid)
    return (lo * hi) ** 0.5


def v03_generation_s(gpu: Gpu, steps: int = published.STEPS) -> float:
    """The model's generation of one v0.3 batch on its 8 colocated servers (a trainer that takes no
    time; the batch write and the weight load taken off the step)."""
    setup = replace(V03, gpu=gpu, steps=steps).colocated_sync()
    instant = replace(setup.trainer, mfu=1e12, overhead_s=0.0, publish_overhead_s=0.0)
    return simulate(setup.with_(trainer=instant)).step_s() - setup.batch_overhead_s - setup.inference.load_s


def fit_v03(base: Gpu, steps: int = published.STEPS) -> Gpu:
    """`base` with the two rates NeMo-RL's v0.3 run states: `hbm_efficiency` at which the model
    generates its batch in the stated 58 s (the other decode costs kept), and the MFU at which the
    model's trainer (prompt and completion tokens, one log-prob pass) takes the stated policy
    training + get logprobs, 28 + 18 s, on its 8 GPUs."""
    hbm = hbm_efficiency_at(base, lambda gpu: v03_generation_s(gpu, steps), V03_GENERATION_S, rounds=30)
    trainer = V03.colocated_sync().trainer
    tokens = V03.batch_prompts * V03.group_size * (V03.prompt_tokens + V03.mean_tokens)
    seconds = V03_TRAINING_S + V03_LOGPROBS_S - trainer.overhead_s
    attention = trainer.attention * mean_sequence(V03)
    mfu = mfu_for(tokens / (V03.gpus * seconds), V03.params, base, V03.logprob_passes, attention)
    return replace(base, hbm_efficiency=hbm, mfu=mfu)


def fit_prime_rl(base: Gpu) -> Gpu:
    """`base` with prime-rl's trainer rates: the MFU and the cost a step per parameter held at
    which the model's step (`published.trainer_tokens_per_s`: two sequences a GPU, recompute)
    takes each of prime-rl's five H100 baseline rows' stated time, by least squares on the relative
    error. A step's time is linear in 1 / MFU and in that cost, so the fit is the 2 x 2 normal
    equations. One MFU alone leaves its 16K rows 2.6-3x and its mixture 11x fast (the held-out
    sets): their steps take seconds that grow with the parameters held, not with the FLOPs."""
    flops_s, held_s = [], []  # per row, over the stated step time: at MFU 1, and per unit of the cost
    for (params, gpus, sequence, rate), shape, active in published.PRIME_H100:
        tokens = published.PRIME_MICRO_BATCHES * gpus * sequence
        unit = replace(base, mfu=1.0, step_s_per_param=0.0)
        at_peak = tokens / published.trainer_tokens_per_s(unit, params, gpus, sequence, shape, active)
        stated = tokens / rate
        flops_s.append(at_peak / stated)
        held_s.append(params / stated)
    uu = sum(u * u for u in flops_s)
    uv = sum(u * v for u, v in zip(flops_s, held_s, strict=True))
    vv = sum(v * v for v in held_s)
    inv_mfu = (sum(flops_s) * vv - sum(held_s) * uv) / (uu * vv - uv * uv)
    per_param = (sum(held_s) * uu - sum(flops_s) * uv) / (uu * vv - uv * uv)
    return replace(base, mfu=1 / inv_mfu, step_s_per_param=per_param)


def mean_sequence(sc: Scenario) -> float:
    """A token's mean sequence length (prompt and completion) over the scenario's length
    distribution: sum of S**2 over sum of S, what attention's FLOPs per token grow with."""
    sequences = [sc.prompt_tokens + n for n in sc.lengths().table]
    return sum(s * s for s in sequences) / sum(sequences)


def implied_tokens_per_sample(gpus: int, rate: float, step_s: float, samples: int = SAMPLES) -> float:
    """Tokens per sample if the row's Tokens/sec/GPU is the whole step's: rate x step x GPUs / samples."""
    return rate * step_s * gpus / samples


def generation_step_s(gpu: Gpu) -> float:
    """The model's one-step-off step with a trainer that takes no time: its 8 servers' generation."""
    sc = replace(published.NEMO, mean_tokens=published.NEMO_MEAN[True], gpu=gpu)
    setup = sc.split(ASYNC_GPUS, 1, "keep")
    instant = replace(
        setup.trainer, mfu=1e12, overhead_s=0.0, publish_overhead_s=0.0, handoff_bytes_per_s=1e30
    )
    return simulate(setup.with_(trainer=instant)).step_s()


def trainer_cycle_s(setup: Setup, draws: int = 20000) -> float:
    """The model's trainer on one batch of the setup's mean sample: train (a sample's tokens and,
    for attention, their square, as the pipeline sums them over a batch), then publish."""
    sequences = [setup.prompt_tokens + n for n in setup.lengths.draws(random.Random(1), draws)]
    samples = setup.batch_size * setup.group_size
    tokens = samples * sum(sequences) / draws
    sq_tokens = samples * sum(s * s for s in sequences) / draws
    return setup.trainer.train_s(round(tokens), setup.train_gpus, sq_tokens) + setup.trainer.publish_s()


def step_bound_rates(base: Gpu, step_s: float = ASYNC_STEP_S) -> tuple[float, float]:
    """The slowest rates consistent with NeMo-RL's one-step-off step: the `hbm_efficiency` at which
    the model's 8 servers generate a step in `step_s` and the `mfu` at which its 8-GPU trainer (with
    the log-prob pass) trains and publishes one in `step_s`. Each phase fits in the step, so
    NeMo-RL's rates are at least these."""
    hbm = hbm_efficiency_at(base, generation_step_s, step_s, rounds=24)
    sc = replace(published.NEMO, mean_tokens=published.NEMO_MEAN[True], gpu=base)
    setup = sc.split(ASYNC_GPUS, 1, "keep")
    fixed = setup.trainer.overhead_s + setup.trainer.publish_s()
    return hbm, base.mfu * (trainer_cycle_s(setup) - fixed) / (step_s - fixed)


def checks(rates: published.Rates) -> dict[str, float]:
    """Phase times the sources state that the fit did not use: verl's colocated generation (177.85 s
    on 128 H20, lengths from its stated update_actor time) and NeMo-RL's synchronous step."""
    mean = published.verl_7b(rates).mean_tokens
    sc = rates.on(replace(published.VERL, mean_tokens=mean, logprob_passes=1))
    setup = sc.colocated_sync()
    step = simulate(setup).step_s()
    generation = step - trainer_cycle_s(setup) - setup.batch_overhead_s
    nemo = rates.on(replace(published.NEMO, mean_tokens=published.NEMO_MEAN[True]))
    return {
        "verl_mean_tokens": mean,
        "verl_generation_s": generation,
        "nemo_sync_step_s": published.nemo_step_s(rates, False),
        "nemo_generation_s": generation_step_s(rates.h100),
        "nemo_trainer_s": trainer_cycle_s(nemo.split(ASYNC_GPUS, 1, "keep")),
    }


def markdown(out: dict) -> list[str]:
    old, new = out["guessed"], out["fitted"]
    md = [f"# Shared rates: fitted to NeMo-RL v0.3's stated phase times ({out['made_at']})", ""]
    md += [
        f"Fitted (`fit_v03`: 2048 samples of 795 tokens generated in {V03_GENERATION_S} s, trained and "
        f"log-probs in {V03_TRAINING_S} + {V03_LOGPROBS_S} s, on 8 H100): hbm_efficiency "
        f"{new['gpu']['hbm_efficiency']:.3f} (guessed {old['gpu']['hbm_efficiency']}), mfu "
        f"{new['gpu']['mfu']:.3f} (guessed {old['gpu']['mfu']})",
        "",
    ]
    md += ["NeMo-RL performance summary v0.5, Llama-3.1-8B, 2048 samples a step (no stage rate, no MFU):", ""]
    md += [
        "| table | policy | GPUs | mean completion | Tokens/sec/GPU | step (s) | tokens per sample "
        "(rate x step x GPUs / 2048) | less the completion |"
    ]
    md.append("| --- " * 8 + "|")
    for r in out["stated"]:
        per_sample = r["tokens_per_sample"]
        cells = [r[k] for k in ("table", "policy", "gpus", "mean", "rate", "step_s")]
        cells += [f"{per_sample:.0f}", f"{per_sample - r['mean']:.0f}"]
        md.append("| " + " | ".join(str(c) for c in cells) + " |")
    prime = out["prime_rl"]
    md += [
        "",
        f"prime-rl's trainer (`fit_prime_rl`, least squares on its five H100 baseline rows, two "
        f"sequences a GPU a step): mfu {prime['mfu']:.4f}, {prime['step_s_per_param'] * 1e9:.3f} s a step "
        f"per billion parameters held; predicted / stated: "
        + ", ".join(f"{name} {ratio:.2f}" for name, ratio in prime["rows"].items()),
    ]
    floors = f"hbm_efficiency at least {out['hbm_efficiency_bound']:.3f}, mfu at least {out['mfu_bound']:.3f}"
    md += ["", f"Floors from v0.5's one-step-off step ({ASYNC_STEP_S} s, 8 + 8 GPUs): {floors}", ""]
    md += [
        "| target | published | guessed rates | ratio | fitted rates | ratio |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for a, b in zip(old["rows"], new["rows"], strict=True):
        md.append(
            f"| {a['target']} | {a['published']:g} | {a['predicted']:.2f} | {a['ratio']:.2f} | "
            f"{b['predicted']:.2f} | {b['ratio']:.2f} |"
        )
    for name, run in (("guessed", old), ("fitted", new)):
        within = sum(r["within_15pct"] for r in run["rows"])
        others = [r["within_15pct"] for r in run["rows"] if not r["target"].startswith("NeMo")]
        checks = ", ".join(f"{k} {v:.1f}" for k, v in run["checks"].items())
        md.append(
            f"\n{name} rates: {within} of {len(run['rows'])} fitted-on rows within 15%, {sum(others)} of "
            f"{len(others)} without NeMo-RL's rows; {checks}"
        )
    return md


def main() -> None:
    started = time.perf_counter()
    keys = ("table", "policy", "gpus", "mean", "rate", "step_s")
    stated = [dict(zip(keys, row, strict=True)) for row in NEMO_V05]
    for r in stated:
        r["tokens_per_sample"] = implied_tokens_per_sample(r["gpus"], r["rate"], r["step_s"])
    fitted = fit_v03(Gpu())
    hbm_bound, mfu_bound = step_bound_rates(fitted)
    made = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    out: dict[str, object] = {
        "made_at": made,
        "stated": stated,
        "hbm_efficiency_bound": hbm_bound,
        "mfu_bound": mfu_bound,
    }
    prime = fit_prime_rl(Gpu())
    out["prime_rl"] = {
        "mfu": prime.mfu,
        "step_s_per_param": prime.step_s_per_param,
        "rows": {
            f"{params / 1e9:g}B on {gpus} at {sequence // 1024}K": published.trainer_tokens_per_s(
                prime, params, gpus, sequence, shape, active
            )
            / rate
            for (params, gpus, sequence, rate), shape, active in published.PRIME_H100
        },
    }
    for name, gpu in (("guessed", OLD), ("fitted", fitted)):
        rates = published.Rates(gpu)
        h20 = rates.h20
        out[name] = {
            "gpu": gpu.__dict__,
            "h20": h20.__dict__,
            "rows": published.table(rates, published.FITTED_ON),
            "checks": checks(rates),
        }
    out["seconds"] = time.perf_counter() - started
    (published.RESULTS / "simulate_rates.json").write_text(json.dumps(out, indent=1) + "\n")
    md = markdown(out)
    (published.RESULTS / "simulate_rates.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
