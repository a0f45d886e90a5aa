"""Start-up: launch (`triad up`) to the first trained step, and vLLM's own start.

    python -m bench.inference_start WORKDIR

1. One `triad up` of the embedded default (10 steps): seconds from launch to the
   server's first metrics row, the first batch and the first trained step.
2. `triad inference` alone on the embedded default, placed as `triad up` places it,
   once as configured (on CPU, `inference.enforce_eager = "auto"` is eager: no
   inductor compile of the model) and once compiled (`inference.enforce_eager =
   false`): seconds from launch to `/health` answering 200, then the median time of
   generating the default's batch (16 prompts x 8 samples x 8 tokens) over 10 batches
   after 2 warm-up ones. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from services.cli import EMBEDDED_DEFAULT
from services.placement import pinned, placement
from services.up import child_env
from shared.config import load_config
from shared.rundir import INFERENCE

REPO = Path(__file__).resolve().parent.parent
PORT = 8419
BATCHES, WARMUP = 10, 2
COMPILED = "inference.enforce_eager=false"


def launch_to_first_step(workdir: Path) -> dict[str, float]:
    from bench.suite import startup, triad_up

    run_dir = workdir / "up"
    return startup(run_dir, triad_up(run_dir, eta=1, steps=10))


def batch_seconds(url: str, model: str, prompts: list[str], pool: ThreadPoolExecutor) -> float:
    def one(prompt: str) -> None:
        body = dict(model=model, prompt=prompt, n=8, max_tokens=8, temperature=1.0)
        httpx.post(url + "/v1/completions", json=body, timeout=120).raise_for_status()

    started = time.perf_counter()
    list(pool.map(one, prompts))
    return time.perf_counter() - started


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"triad inference exited with {proc.returncode} before {url}/health answered")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"gave up after {timeout:.0f} s waiting for {url}/health")


def serve_alone(workdir: Path, *sets: str) -> dict[str, float]:
    """`triad inference` on the embedded default: seconds to healthy, median batch seconds."""
    sets = (f"run_dir={workdir / 'alone'}", f"inference.port={PORT}", *sets)
    cfg = load_config(EMBEDDED_DEFAULT, list(sets))
    cpus = placement(cfg)
    cmd = [sys.executable, "-m", "services.cli", "inference", "-c", str(EMBEDDED_DEFAULT)]
    cmd += [f"--set={s}" for s in sets]
    url = f"http://127.0.0.1:{PORT}"
    started = time.monotonic()
    out = subprocess.DEVNULL
    proc = subprocess.Popen(
        pinned(cmd, cpus[INFERENCE]),
        cwd=REPO,
        env=child_env(cfg, INFERENCE, cpus),
        stdout=out,
        stderr=out,
        start_new_session=True,
    )
    try:
        wait_healthy(url, proc)
        ready = time.monotonic() - started
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        prompts = [f"{a}+{b}=" for a, b in zip(range(16), reversed(range(16)), strict=True)]
        with ThreadPoolExecutor(16) as pool:
            times = [batch_seconds(url, model, prompts, pool) for _ in range(BATCHES + WARMUP)]
        return {"ready_s": ready, "batch_s": statistics.median(times[WARMUP:])}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    workdir = Path(sys.argv[1])
    workdir.mkdir(parents=True, exist_ok=True)
    configured, compiled = serve_alone(workdir), serve_alone(workdir, COMPILED)
    figure = {
        "launch": launch_to_first_step(workdir),
        "vllm": configured,
        "vllm_compiled": compiled,
        "compiled_batch_ratio": compiled["batch_s"] / configured["batch_s"],
        "goal": "launch to first trained step: measured, then halved",
    }
    print(json.dumps(figure))


if __name__ == "__main__":
    main()
