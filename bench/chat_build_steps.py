"""The embedded chat model's first warm-up steps, timed in this process: one JSON line.

    OMP_WAIT_POLICY=passive python -m bench.chat_build_steps 10     # 10 + 10 steps

The recipe of `builtin:tiny-tools` with `copy_steps = warmup_steps = N` (the build's own
deterministic settings, threads included); wall and CPU time of the warm-up (with its vocabulary
pass), and the first 16 hex digits of the weights' sha256 after it. libgomp reads OMP_WAIT_POLICY
when torch loads: set it in the environment (services/tiny_model.py's BUILD_ENV does for builds).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(steps: int) -> dict:
    from dataclasses import replace

    from services import tiny_chat as chat
    from services.tiny_model import RECIPES

    recipe = replace(RECIPES["tiny-tools"], copy_steps=steps, warmup_steps=steps)
    tokenizer = chat.load_tokenizer()
    with chat.deterministic(0):
        model = chat.make_chat_model(tokenizer, 0)
        wall, cpu = time.monotonic(), cpu_s()
        loss = chat.warm_up_chat(model, tokenizer, recipe, 0)
        wall, cpu = time.monotonic() - wall, cpu_s() - cpu
    return {
        "steps": 2 * steps,
        "warm_up_s": round(wall, 1),
        "cpu_s": round(cpu, 1),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
        "sha256": chat.weights_digest(model)[:16],
        "loss": round(loss, 5),
    }


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]))))
