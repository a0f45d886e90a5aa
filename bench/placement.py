"""The trainer on cores of its own (`inference.cpus = "auto"`) against sharing inference's
(`--set trainer.cpus=ALL`), A B alternating, for the tiny model and a 50M one.

    python -m bench.placement WORKDIR [--pairs 3]     (writes bench/results/placement.{json,md})

The runs are bench.trl_compare's triad side (the addition task, 16 prompts x 8 samples; the tiny
model 100 steps of 8 tokens, the 50M model 8 steps of 32), samples/s over the steps after its
warm-up, and which side bound the step (`services.timeline.bound`). `triad up` names this
placement when a run on auto cores was bound by its trainer.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

from bench.suite import RESULTS, write_rounds
from bench.trl_compare import RUNS, run_triad
from bench.weight_transport import SIZES, build_model
from services.timeline import bound
from shared.cpus import format_cpus
from shared.rundir import RunDir


def main() -> None:
    from services.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--pairs", type=int, default=3)
    a = parser.parse_args()
    every = format_cpus(sorted(os.sched_getaffinity(0)))
    models = {"tiny (0.5M)": resolve_model("builtin:tiny-addition"), "50M": str(a.workdir / "model-50M")}
    if not (a.workdir / "model-50M" / "config.json").exists():
        build_model(Path(models["50M"]), *SIZES["50M"])
    variants = {"own cores (auto)": [], f"trainer.cpus={every}": [f"trainer.cpus={every}"]}
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "sizes": {}}
    out["command"] = f"python -m bench.placement WORKDIR --pairs {a.pairs}"
    for name, (steps, max_tokens) in RUNS.items():
        runs: dict[str, list] = {v: [] for v in variants}
        for pair in range(a.pairs):
            for k, (variant, extra) in enumerate(variants.items()):
                run_dir = a.workdir / f"{name.split()[0]}-{pair}-{'AB'[k]}"
                shutil.rmtree(run_dir, ignore_errors=True)
                load = os.getloadavg()[0]
                rate = run_triad(models[name], steps, max_tokens, run_dir, tuple(extra))["samples_per_s"]
                found = bound(RunDir(run_dir), steps)
                runs[variant].append({"samples_per_s": rate, "load": load, "bound": found and found.side})
        out["sizes"][name] = {
            v: {"runs": rs, "median": statistics.median(x["samples_per_s"] for x in rs)}
            for v, rs in runs.items()
        }
    write_rounds(RESULTS, "placement", out, markdown(out))


def markdown(out: dict) -> str:
    lines = [
        f"# The trainer's cores: its own against sharing inference's, {out['date']} ({out['cpus']} CPUs)",
        "",
        f"`{out['command']}`: A B alternating, samples/s over the steps after warm-up, and which side",
        "bound the step (`triad up` prints it at the end of a run).",
        "",
        "| model | placement | samples/s, each run (load before; bound) | median |",
        "| --- | --- | --- | --- |",
    ]
    for name, variants in out["sizes"].items():
        for variant, r in variants.items():
            each = ", ".join(f"{x['samples_per_s']:.1f} ({x['load']:.1f}; {x['bound']})" for x in r["runs"])
            lines.append(f"| {name} | {variant} | {each} | **{r['median']:.1f}** |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
