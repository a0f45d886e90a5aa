"""How long `triad simulate` takes for 1024 GPUs over 1000 steps (goal: under a minute here).

    python -m bench.simulate_speed [STEPS]

`cpu_seconds` is the process's own CPU time: on this shared machine the wall time also counts
what other work takes from it. The setup: a 7B model, 16k-token cap, 512 prompts x 16 samples per
step (8192 samples), 768 GPUs serving (tp 1) and 256 training, η = 4, abort and resubmit.
Writes bench/results/simulate_speed.json."""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

from simulate.pipeline import simulate
from simulate.scenario import Scenario

RESULTS = Path(__file__).with_name("results")


def main(steps: int) -> None:
    sc = Scenario(gpus=1024, params=7e9, max_tokens=16384, batch_prompts=512, group_size=16, steps=steps)
    setup = sc.split(768, 4, "abort")
    started, cpu = time.perf_counter(), time.process_time()
    r = simulate(setup)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu
    out = {
        "made_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpus": 1024,
        "steps": steps,
        "samples": steps * 512 * 16,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "seconds_per_1000_steps": seconds * 1000 / steps,
        "load_average": os.getloadavg(),
        "simulated_samples_per_s": r.samples_per_s(),
    }
    (RESULTS / "simulate_speed.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
