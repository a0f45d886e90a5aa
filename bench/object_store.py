"""The object-store run directory against a local one, measured in the same run.

    python -m bench.object_store WORKDIR [--steps 20]     (prints one JSON line)

A moto server (`tests/s3.py`, its own process, loopback) plays the S3-compatible store.

- weight hand-off, for the 5M and 50M models of `bench/weight_transport.py`: a 1-rank
  trainer on prepared batches publishes versions 1..5 with `transport = "filesystem"`,
  once with `run_dir` a local directory and once `s3://bench/...`; this script plays the
  orchestrator, polling each version's `DONE` through the run directory's store and asking
  the server to load it (from the store, the server pulls it into its cache first). Per
  version: from the trainer starting to publish (metrics row time minus `publish_s`) to
  the server's answer. Median over versions 2..5 (2..3 for 50M: moto moves about 10 MB/s,
  so a 50M version takes about a minute through it).
- rollouts/s: `bench/orchestrator_overhead.py`'s real `Orchestrator` against the
  zero-latency fake OpenAI server, writing its batches and markers to a local run
  directory and to the store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.orchestrator_overhead import PORT, measure, wait_healthy
from bench.weight_transport import REPO, SIZES, STEPS, build_model, post, start_trainer
from shared.admin_api import WEIGHTS_ROUTE
from shared.rundir import TRAINER, RunDir

BUCKET = "bench"
STORE_SIZES = ("5M", "50M")
VERSIONS = {"5M": STEPS, "50M": 3}  # moto takes about a minute per 50M version (it moves ~10 MB/s)


def hand_off(workdir: Path, run_dir: str, model: str, name: str, steps: int = STEPS) -> list[float]:
    from tests.helpers import Server
    from tests.integration.test_trainer import make_batches

    make_batches(run_dir, model, range(1, steps + 1))
    cache = f"store.cache_dir={workdir / f'{name}-cache-inference'}"
    server = Server(run_dir, model, workdir / f"{name}-inference.log", "inference.kv_cache_gib=1", cache)
    server.wait_healthy(600)
    sets = [
        f"run_dir={run_dir}",
        f"model={model}",
        f"max_steps={steps}",
        "trainer.checkpoint.every=0",
        "weights.keep=3",
        f"store.cache_dir={workdir / f'{name}-cache-trainer'}",
    ]
    trainer = start_trainer(sets, workdir / f"{name}-trainer.log")
    rundir, served = RunDir(run_dir), {}
    try:
        for v in range(1, steps + 1):
            deadline = time.monotonic() + 600
            while not rundir.weights.has_marker(v):
                if trainer.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"no weights v{v} from the trainer: see {workdir}/{name}-trainer.log")
                time.sleep(0.01)
            post(server.url, WEIGHTS_ROUTE, {"version": v, "path": rundir.weights.relative(v)})
            served[v] = time.time()
        if trainer.wait(timeout=600) != 0:
            raise RuntimeError(f"trainer failed: see {workdir}/{name}-trainer.log")
    finally:
        if trainer.poll() is None:
            trainer.kill()
        server.stop()
    started = {r["step"]: r["time"] - r["publish_s"] for r in rundir.metrics.rows(TRAINER)}
    return [served[v] - started[v] for v in range(2, steps + 1)]


def rollouts_per_s(run_dir: str, steps: int) -> float:
    url = f"http://127.0.0.1:{PORT}"
    server = subprocess.Popen([sys.executable, "-m", "tests.fake_openai", str(PORT), "0"], cwd=REPO)
    try:
        wait_healthy(url)
        return asyncio.run(measure(run_dir, url, steps))["rollouts_per_s"]
    finally:
        server.kill()
        server.wait()


def main() -> None:
    from tests.s3 import MotoServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    moto = MotoServer(args.workdir / "moto.log")
    os.environ.update(moto.env())  # the services started here inherit the endpoint and credentials
    results: dict = {}
    try:
        moto.create_bucket(BUCKET)
        local = rollouts_per_s(str(args.workdir / "orchestrator-local"), args.steps)
        store = rollouts_per_s(f"s3://{BUCKET}/orchestrator", args.steps)
        results["rollouts_per_s"] = {"local": local, "store": store, "store_over_local": store / local}
        for size in STORE_SIZES:
            workdir = args.workdir / size
            model = workdir / "model"
            params = build_model(model, *SIZES[size])
            figure: dict = {"parameters": params, "versions": VERSIONS[size]}
            figure["local_s"] = statistics.median(
                hand_off(workdir, str(workdir / "run"), str(model), "local", VERSIONS[size])
            )
            figure["store_s"] = statistics.median(
                hand_off(workdir, f"s3://{BUCKET}/{size}", str(model), "store", VERSIONS[size])
            )
            figure["store_over_local"] = figure["store_s"] / figure["local_s"]
            results[f"hand_off_{size}"] = figure
    finally:
        moto.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
