"""The trainer's cores on a machine `inference.cpus = "auto"` splits, A B C alternating, for
the tiny model and a 50M one: its own half only (`--set trainer.cpus=OWN`), `auto` (its own,
and inference's as well while it bounds the step if that makes its steps shorter:
`trainer.borrow_cpus`, `trainer/cores.py`), and always every core (`--set trainer.cpus=ALL`).

    python -m bench.placement WORKDIR [--pairs 3] [--sizes 50M]
        (writes bench/results/placement.{json,md})

The runs are bench.trl_compare's triad side (the addition task, 16 prompts x 8 samples; the tiny
model 100 steps of 8 tokens, the 50M model 17 steps of 32), samples/s over the steps after its
warm-up, which side bound the step (`services.timeline.bound`), and the cores the trainer ended on.
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
from services.placement import placement
from services.timeline import bound
from shared.config import load_config
from shared.cpus import format_cpus
from shared.rundir import TRAINER, RunDir


def main() -> None:
    from services.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--sizes", nargs="+", default=[n.split()[0] for n in RUNS], help="tiny, 50M")
    a = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    split = placement(load_config(None, ['inference.cpus="auto"']), cores, gpu=False)
    own, every = split[TRAINER], format_cpus(cores)
    models = {"tiny (0.5M)": resolve_model("builtin:tiny-addition"), "50M": str(a.workdir / "model-50M")}
    if "50M" in a.sizes and not (a.workdir / "model-50M" / "config.json").exists():
        build_model(Path(models["50M"]), *SIZES["50M"])
    variants = {
        f"trainer.cpus={own}": [f"trainer.cpus={own}"],
        "auto (borrows while it bounds)": [],
        f"trainer.cpus={every}": [f"trainer.cpus={every}"],
    }
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "sizes": {}}
    out["command"] = f"python -m bench.placement WORKDIR --pairs {a.pairs} --sizes {' '.join(a.sizes)}"
    for name, run in RUNS.items():
        if name.split()[0] not in a.sizes:
            continue
        runs: dict[str, list] = {v: [] for v in variants}
        for pair in range(a.pairs):
            for k, (variant, extra) in enumerate(variants.items()):
                run_dir = a.workdir / f"{name.split()[0]}-{pair}-{'ABC'[k]}"
                shutil.rmtree(run_dir, ignore_errors=True)
                load = os.getloadavg()[0]
                rate = run_triad(models[name], run, run_dir, tuple(extra))["samples_per_s"]
                found = bound(RunDir(run_dir), run.steps - run.warmup)
                ended_on = RunDir(run_dir).metrics.rows(TRAINER)[-1]["cores"]
                runs[variant].append(
                    {"samples_per_s": rate, "load": load, "bound": found and found.side, "cores": ended_on}
                )
        out["sizes"][name] = {
            v: {"runs": rs, "median": statistics.median(x["samples_per_s"] for x in rs)}
            for v, rs in runs.items()
        }
    write_rounds(RESULTS, "placement", out, markdown(out))


def markdown(out: dict) -> str:
    lines = [
        f"# The trainer's cores: its own, borrowing inference's, or all, {out['date']} ({out['cpus']} CPUs)",
        "",
        f"`{out['command']}`: A B C alternating, samples/s over the steps after warm-up, which side",
        "bound them (`triad up` prints it at the end of a run) and the trainer's cores at the end.",
        "",
        "| model | placement | samples/s, each run (load before; bound; trainer's cores at end) | median |",
        "| --- | --- | --- | --- |",
    ]
    for name, variants in out["sizes"].items():
        for variant, r in variants.items():
            each = ", ".join(
                f"{x['samples_per_s']:.1f} ({x['load']:.1f}; {x['bound']}; {x['cores']})" for x in r["runs"]
            )
            lines.append(f"| {name} | {variant} | {each} | **{r['median']:.1f}** |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
