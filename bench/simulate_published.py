"""`triad simulate` against published results: each paper's stated setup, everything else one
shared set of assumptions (simulate/hardware.py's Gpu, simulate/scenario.py's lengths), never
tuned per target. Writes bench/results/simulate_published.{json,md}: predicted against published
with the ratio, the inputs, and one sensitivity line per assumption.

    python -m bench.simulate_published"""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from simulate.pipeline import simulate
from simulate.scenario import Scenario

RESULTS = Path(__file__).with_name("results")
TOLERANCE = 0.15
STEPS = 30  # steps per simulation: the first fifth is the pipeline filling and is not counted

# what each paper states; the rest are the shared assumptions
AREAL_15B = Scenario(gpus=128, params=1.5e9, max_tokens=27648, batch_prompts=512, group_size=16, steps=STEPS)
AREAL_7B = replace(AREAL_15B, params=7e9)
AREAL_SCALING = Scenario(gpus=16, params=7e9, max_tokens=16384, batch_prompts=512, group_size=16, steps=STEPS)
VERL = Scenario(gpus=128, params=7e9, max_tokens=20480, batch_prompts=512, group_size=16, steps=STEPS)
NEMO = Scenario(gpus=16, params=8e9, max_tokens=8192, batch_prompts=128, group_size=16, steps=STEPS)
AREAL_SPLIT, AREAL_ETA = 0.75, 4  # AReaL: 3/4 of the GPUs generate, η = 4, interruptible


def speedup(sc: Scenario, fraction: float, eta: int, mode: str) -> float:
    sync = simulate(sc.colocated_sync()).samples_per_s()
    return simulate(sc.split(int(sc.gpus * fraction), eta, mode)).samples_per_s() / sync


def areal_speedup(sc: Scenario) -> float:
    return speedup(sc, AREAL_SPLIT, AREAL_ETA, "abort")


def scaling(gpus: int, synchronous: bool) -> float:
    """Throughput at `gpus` over that at 16, the global batch fixed."""

    def rate(n: int) -> float:
        sc = replace(AREAL_SCALING, gpus=n)
        setup = sc.colocated_sync() if synchronous else sc.split(int(n * AREAL_SPLIT), AREAL_ETA, "abort")
        return simulate(setup).samples_per_s()

    return rate(gpus) / rate(16)


def eta_balance() -> dict[int, float]:
    """Throughput at each η over that at η = 16 (AReaL 1.5B)."""
    rates = {
        eta: simulate(AREAL_15B.split(int(128 * AREAL_SPLIT), eta, "abort")).samples_per_s()
        for eta in (0, 1, 2, 4, 8, 16)
    }
    return {eta: r / rates[16] for eta, r in rates.items()}


def nemo_step_s(asynchronous: bool) -> float:
    setup = NEMO.split(NEMO.gpus // 2, 1, "keep") if asynchronous else NEMO.colocated_sync()
    return simulate(setup).step_s()


TARGETS: list[tuple[str, str, float, Callable[[], float]]] = [
    ("AReaL 1.5B async / sync", "128 H800, 27k tokens, 512x16, 3/4 generate, η=4", 2.77,
     lambda: areal_speedup(AREAL_15B)),
    ("AReaL 7B async / sync", "as 1.5B", 2.27, lambda: areal_speedup(AREAL_7B)),
    ("AReaL sync 64 / 16 GPUs", "7B, 16k, 512x16, batch fixed", 3.2, lambda: scaling(64, True)),
    ("AReaL sync 256 / 16 GPUs", "", 8.1, lambda: scaling(256, True)),
    ("AReaL async 64 / 16 GPUs", "", 3.8, lambda: scaling(64, False)),
    ("AReaL async 256 / 16 GPUs", "", 12.5, lambda: scaling(256, False)),
    ("AReaL async 1024 / 16 GPUs", "", 38.0, lambda: scaling(1024, False)),
    ("verl fully-async / colocated sync", "7B, 128 GPUs, 20k, 3/4 generate, η=1, abort (2.35-2.67)", 2.51,
     lambda: speedup(VERL, 0.75, 1, "abort")),
    ("NeMo-RL sync step (s)", "8B, 16 GPUs, 8k, 128x16", 111.0, lambda: nemo_step_s(False)),
    ("NeMo-RL one-step-off step (s)", "8/8 split, η=1, pause and keep", 64.0, lambda: nemo_step_s(True)),
]  # fmt: skip


def sensitivity() -> list[str]:
    """The AReaL 1.5B speedup with each shared assumption moved."""
    base = areal_speedup(AREAL_15B)
    lines = [f"AReaL 1.5B speedup with the assumptions as tabled: {base:.2f}"]
    gpu = AREAL_15B.gpu
    moves = [
        ("length mean 0.25 of max (0.35)", replace(AREAL_15B, mean_fraction=0.25)),
        ("truncated 0.15 (0.05)", replace(AREAL_15B, truncated=0.15)),
        ("trainer MFU 0.2 (0.35)", replace(AREAL_15B, gpu=replace(gpu, mfu=0.2))),
        ("HBM efficiency 0.8 (0.6)", replace(AREAL_15B, gpu=replace(gpu, hbm_efficiency=0.8))),
        ("launch 8 ms (4 ms)", replace(AREAL_15B, gpu=replace(gpu, launch_s=0.008))),
        ("max_seqs 512 (256)", replace(AREAL_15B, gpu=replace(gpu, max_seqs=512))),
        ("load 2 s (0.5 s)", replace(AREAL_15B, gpu=replace(gpu, load_s=2.0))),
        ("prompt 2k tokens (512)", replace(AREAL_15B, prompt_tokens=2048)),
    ]
    for name, sc in moves:
        lines.append(f"{name}: {areal_speedup(sc):.2f} ({areal_speedup(sc) / base - 1:+.0%})")
    return lines


def unstated() -> list[str]:
    """Inputs a paper does not state that move its figure most: verl's staleness, NeMo-RL's split."""
    lines = [f"verl at η={eta} (η=1 tabled): {speedup(VERL, 0.75, eta, 'abort'):.2f}" for eta in (2, 4)]
    for fraction in (0.625, 0.75):
        inference = int(NEMO.gpus * fraction)
        step = simulate(NEMO.split(inference, 1, "keep")).step_s()
        split = f"{inference}:{NEMO.gpus - inference}"
        lines.append(f"NeMo-RL one-step-off with {split} (8:8 tabled): {step:.0f} s")
    return lines


def main() -> None:
    started = time.perf_counter()
    rows = []
    for name, setup, published, predict in TARGETS:
        predicted = predict()
        ratio = predicted / published
        rows.append({"target": name, "setup": setup, "published": published, "predicted": predicted,
                     "ratio": ratio, "within_15pct": abs(ratio - 1) <= TOLERANCE})  # fmt: skip
        print(f"{name}: predicted {predicted:.2f}, published {published}, ratio {ratio:.2f}", flush=True)
    balance = eta_balance()
    lines = sensitivity() + unstated()
    made = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    out = {"made_at": made, "rows": rows, "eta_over_eta16": balance, "sensitivity": lines,
           "assumptions": {"gpu": AREAL_15B.gpu.__dict__, "mean_fraction": AREAL_15B.mean_fraction,
                           "truncated": AREAL_15B.truncated, "prompt_tokens": AREAL_15B.prompt_tokens},
           "seconds": time.perf_counter() - started}  # fmt: skip
    (RESULTS / "simulate_published.json").write_text(json.dumps(out, indent=1) + "\n")
    md = [f"# triad simulate against published results ({made})", "",
          "| target | setup | published | predicted | predicted / published | within 15% |",
          "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    md += [f"| {r['target']} | {r['setup']} | {r['published']:g} | {r['predicted']:.2f} | {r['ratio']:.2f} | "
           f"{'yes' if r['within_15pct'] else 'no'} |" for r in rows]  # fmt: skip
    md += ["", "AReaL 1.5B throughput at η over η=16 (published: η=4 is the best balance): "
           + ", ".join(f"η={k}: {v:.2f}" for k, v in balance.items()), "", "Sensitivity:", ""]  # fmt: skip
    md += [f"- {line}" for line in lines]
    (RESULTS / "simulate_published.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
