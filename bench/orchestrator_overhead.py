"""Orchestrator overhead: rollouts/s against a zero-latency fake OpenAI server.

    python -m bench.orchestrator_overhead [--steps 40]

The fake server (`tests/fake_openai.py`, its own process) answers every
completion at once, so what is measured is triad's own cost per rollout:
HTTP client, scheduling, scoring, advantages and Parquet writing with `DONE`
markers. Reported: single-turn rollouts (samples) per second over the run, the
orchestrator process's CPU time per rollout, and the event-loop lag (how late
a 50 ms sleep wakes up; median, p99 and max over the run). At full speed the
loop is busy all the time, so its lag is high by construction; a second run
answers after LOADED_DELAY_S, which with 64 groups of 8 in flight offers about
1000 rollouts/s, and reports the lag at that load.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from orchestrator.batches.stats import percentile
from orchestrator.environments import load_environment
from orchestrator.loop import Orchestrator
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.pool import Server, ServerPool
from shared.batch import publish_batch
from shared.config import load_config
from shared.rundir import RunDir

REPO = Path(__file__).resolve().parent.parent
PORT = 8419
LOADED_DELAY_S = 0.5  # 64 in flight x 8 samples / 0.5 s = 1024 rollouts/s offered


def wait_healthy(url: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(f"fake server {url} did not start")


async def measure(run_dir: Path, url: str, steps: int, in_thread: bool = True) -> dict:
    cfg = load_config(
        None,
        [
            f"run_dir={run_dir}",
            f"max_steps={steps}",
            "max_async_level=100000",
            "weights.keep=100002",
            "orchestrator.batch_size=32",
            "orchestrator.group_size=8",
            "orchestrator.max_inflight=64",
            "orchestrator.keep_rollouts=100000",
        ],
    )
    run = RunDir(run_dir).ensure_run({})
    client = InferenceClient(url, None, 30)
    client.model = "fake"
    pool = ServerPool([Server(client, Frozen())], cfg.orchestrator)
    orch = Orchestrator(cfg, run.run_id, pool, load_environment("addition"))
    lag_task = asyncio.create_task(orch.counters.loop_lag.run())
    producer = asyncio.create_task(orch.produce())
    await orch.assemble(1)  # warm-up: connections open, code paths hot
    orch.counters.loop_lag.samples.clear()
    wall, cpu = time.perf_counter(), time.process_time()
    samples = 0
    for step in range(2, steps + 1):
        batch, _, _ = await orch.assemble(step)
        rows = orch.builder.rows(step, batch)
        publish = (publish_batch, orch.rundir, orch.run_id, step, rows, orch.oc.sampling.temperature)
        await asyncio.to_thread(*publish) if in_thread else publish[0](
            *publish[1:]
        )  # as the orchestrator does
        samples += len(rows)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    lags = list(orch.counters.loop_lag.samples)
    for task in (producer, lag_task):
        task.cancel()
    await asyncio.gather(producer, lag_task, return_exceptions=True)
    await client.close()
    return dict(  # keywords: the key `rollouts` is a count here, not the run-directory name
        rollouts=samples,
        rollouts_per_s=samples / wall,
        cpu_ms_per_rollout=1000 * cpu / samples,
        loop_lag_ms={
            "median": 1000 * percentile(lags, 50),
            "p99": 1000 * percentile(lags, 99),
            "max": 1000 * max(lags, default=0.0),
        },
        goal=">= 1000 rollouts/s with event-loop lag (p99) under 50 ms",
    )


def against_fake_server(delay: float, steps: int) -> dict:
    url = f"http://127.0.0.1:{PORT}"
    server = subprocess.Popen([sys.executable, "-m", "tests.fake_openai", str(PORT), str(delay)], cwd=REPO)
    try:
        wait_healthy(url)
        with tempfile.TemporaryDirectory(prefix="triad-overhead-") as tmp:
            return asyncio.run(measure(Path(tmp), url, steps))
    finally:
        server.kill()
        server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    result = against_fake_server(0.0, args.steps)
    loaded = against_fake_server(LOADED_DELAY_S, args.steps // 2)
    result["at_1000_per_s"] = {key: loaded[key] for key in ("rollouts_per_s", "loop_lag_ms")}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
