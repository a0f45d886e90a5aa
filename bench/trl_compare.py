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
1-rank trainer on separate cores.
Samples/s is over the steps after WARMUP; wall time counts from each launch.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from shared.rundir import ORCHESTRATOR, RunDir

REPO = Path(__file__).resolve().parent.parent
VENV = REPO / "bench" / ".trl-venv"
PEER = REPO / "bench" / "peers" / "trl_grpo.py"
THRESHOLD, WINDOW, WARMUP = 0.5, 10, 3
RUNS = {"tiny (0.5M)": (100, 8), "50M": (8, 32)}  # model: (steps, completion tokens)


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


def run_trl(python: Path, model: str, steps: int, max_tokens: int, out: Path) -> dict:
    launched = time.time()
    cmd = [str(python), str(PEER), model, str(steps), str(out), str(max_tokens)]
    subprocess.run(cmd, check=True, capture_output=True)
    r = json.loads(out.read_text())
    times = r["step_end_times"]
    rate = r["samples_per_step"] * (len(times) - 1 - WARMUP) / (times[-1] - times[WARMUP])
    return {
        "samples_per_s": rate,
        "to_threshold_s": time_to_threshold(times, r["rewards"], launched),
        "reward_first_last": [r["rewards"][0], r["rewards"][-1]],
    }


def run_triad(model: str, steps: int, max_tokens: int, run_dir: Path, extra: tuple[str, ...] = ()) -> dict:
    """`triad up` (the embedded default's placement: a 1-rank trainer, inference and trainer on
    their own cores, unless `extra` settings say otherwise)."""
    sets = [
        f"run_dir={run_dir}",
        f"model={model}",
        f"max_steps={steps}",
        "orchestrator.eval.every=0",
        f"orchestrator.sampling.max_tokens={max_tokens}",
        "trainer.checkpoint.every=0",
        "inference.port=8421",
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
    rate = sum(row["samples"] for row in rows[WARMUP + 1 :]) / (times[-1] - times[WARMUP])
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
    for name, (steps, max_tokens) in RUNS.items():
        triad = run_triad(models[name], steps, max_tokens, workdir / f"triad-{name.split()[0]}")
        trl = run_trl(python, models[name], steps, max_tokens, workdir / f"trl-{name.split()[0]}.json")
        results[name] = {
            "steps": steps,
            "completion_tokens": max_tokens,
            "triad": triad,
            "trl": trl,
            "samples_per_s_ratio": triad["samples_per_s"] / trl["samples_per_s"],
        }
    results["threshold"] = THRESHOLD
    print(json.dumps(results))


if __name__ == "__main__":
    main()
