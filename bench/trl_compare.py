"""triad against TRL's GRPOTrainer, side by side on the same model and task.

    python -m bench.trl_compare WORKDIR      (prints one JSON line)

TRL runs in its own virtual environment (`bench/.trl-venv`, made on first use:
`pip install torch==2.13.0 trl`, a CPU build here) with `use_cpu=True,
use_vllm=False`; triad runs `triad up`. Both: the addition task, 16 prompts x
8 samples per step, temperature 1, lr 3e-4, no KL. Models: the embedded tiny
model (0.5M parameters, warmed up to a reward of about 0.3; 8 completion
tokens), for samples/s and wall time to a mean reward of THRESHOLD over 10
steps; and a 50M-parameter model (random weights, so no learning: samples/s
only; 32 completion tokens), where generation rather than process overhead
dominates. triad runs as the suite's asynchrony figure does: inference and a
1-rank trainer on separate cores, the trainer borrowing inference's while it
bounds the step (`trainer.borrow_cpus`).
Samples/s is over the steps after each run's warm-up (`RUNS`); wall time counts from each launch.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from shared.rundir import ORCHESTRATOR, RunDir
from trainer.cores import DECIDED

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "bench" / ".trl-venv"
PEER = REPO / "bench" / "peers" / "trl_grpo.py"
THRESHOLD, WINDOW = 0.5, 10


@dataclass(frozen=True)
class Run:
    steps: int
    max_tokens: int  # completion tokens
    warmup: int  # steps before samples/s is counted, on both sides
    kv_cache_gib: float | None  # inference's on the CPU build; None: the embedded default's, the tiny model's


# The 50M run's warm-up covers its trainer's choice of cores (`trainer/cores.py`: made after its
# step DECIDED at the latest), so its samples/s is a long run's steady rate. Its 40 KiB of KV a
# token: a GiB holds its two batches of 128 samples (the embedded default's 0.125 GiB would not).
RUNS = {"tiny (0.5M)": Run(100, 8, 3, None), "50M": Run(DECIDED + 6, 32, DECIDED + 1, 1.0)}


def ensure_trl_venv() -> Path:
    python = VENV / "bin" / "python"
    if not (VENV / ".ready").exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0", "trl"], check=True)
        (VENV / ".ready").touch()
    return python


def time_to_threshold(times: list[float], rewards: list[float], start: float) -> float | None:
    for i in range(WINDOW, len(rewards) + 1):
        if statistics.mean(rewards[i - WINDOW : i]) >= THRESHOLD:
            return times[i - 1] - start
    return None


def run_trl(python: Path, model: str, run: Run, out: Path) -> dict:
    launched = time.time()
    cmd = [str(python), str(PEER), model, str(run.steps), str(out), str(run.max_tokens)]
    subprocess.run(cmd, check=True, capture_output=True)
    r = json.loads(out.read_text())
    times = r["step_end_times"]
    rate = r["samples_per_step"] * (len(times) - 1 - run.warmup) / (times[-1] - times[run.warmup])
    return {
        "samples_per_s": rate,
        "to_threshold_s": time_to_threshold(times, r["rewards"], launched),
        "reward_first_last": [r["rewards"][0], r["rewards"][-1]],
    }


def run_triad(model: str, run: Run, run_dir: Path, extra: tuple[str, ...] = ()) -> dict:
    """`triad up` (the embedded default's placement: a 1-rank trainer, inference and trainer on
    their own cores, the trainer borrowing inference's while it bounds the step, unless `extra`
    settings say otherwise)."""
    sets = [
        f"run_dir={run_dir}",
        f"model={model}",
        f"max_steps={run.steps}",
        "orchestrator.eval.every=0",
        f"orchestrator.sampling.max_tokens={run.max_tokens}",
        "trainer.checkpoint.every=0",
        "inference.port=8421",
        *([f"inference.kv_cache_gib={run.kv_cache_gib}"] if run.kv_cache_gib else []),
        *extra,
    ]
    launched = time.time()
    subprocess.run(
        [sys.executable, "-m", "services.cli", "up", *[f"--set={s}" for s in sets]],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    rows = RunDir(run_dir).metrics.rows(ORCHESTRATOR)
    times, rewards = [row["time"] for row in rows], [row["reward_mean"] for row in rows]
    rate = sum(row["samples"] for row in rows[run.warmup + 1 :]) / (times[-1] - times[run.warmup])
    return {
        "samples_per_s": rate,
        "to_threshold_s": time_to_threshold(times, rewards, launched),
        "reward_first_last": [rewards[0], rewards[-1]],
    }


def main() -> None:
    from bench.weight_transport import SIZES, build_model
    from services.models import resolve_model

    workdir = Path(sys.argv[1])
    python = ensure_trl_venv()
    models = {"tiny (0.5M)": resolve_model("builtin:tiny-addition")}
    models["50M"] = str(workdir / "model-50M")
    if not (workdir / "model-50M" / "config.json").exists():
        build_model(Path(models["50M"]), *SIZES["50M"])
    results = {}
    for name, run in RUNS.items():
        triad = run_triad(models[name], run, workdir / f"triad-{name.split()[0]}")
        trl = run_trl(python, models[name], run, workdir / f"trl-{name.split()[0]}.json")
        results[name] = {
            "steps": run.steps,
            "warmup": run.warmup,
            "completion_tokens": run.max_tokens,
            "triad": triad,
            "trl": trl,
            "samples_per_s_ratio": triad["samples_per_s"] / trl["samples_per_s"],
        }
    results["threshold"] = THRESHOLD
    print(json.dumps(results))


if __name__ == "__main__":
    main()
