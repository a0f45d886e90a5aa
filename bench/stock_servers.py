"""Triad's launcher against a stock vLLM (and SGLang, where its venv is set up), in one run.

    python -m bench.stock_servers WORKDIR [--sglang-python /tmp/sglang-venv/bin/python]

Each server serves the embedded default model (`builtin:tiny-addition`) alone on this machine:

- hand-off: versions 1..6 (the base model with noise, published as the trainer publishes)
  loaded through the orchestrator's own weight backend for that server (`triad`:
  `/admin/weights`; `vllm`: pause, start, update, finish, resume and the `/weight_checker`
  checksums; `sglang`: `/update_weights_from_disk`), each from the request to the server
  reporting the version; median over versions 2..6, in ms.
- samples/s: the embedded default's rollout shape (16 prompts x 8 samples, up to 8 tokens,
  temperature 1, with logprobs and token ids), 6 rounds of 16 concurrent requests after one
  warm-up round.

Prints one JSON line and writes bench/results/stock_servers.{json,md}.
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

from orchestrator.servers.backends.detection import detect
from orchestrator.servers.client import InferenceClient

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
VERSIONS = 6
ROUNDS = 6
PROMPTS, GROUP, TOKENS = 16, 8, 8


def write_versions(model: str, run_dir: Path) -> list[str]:
    """Versions 1..VERSIONS published as the trainer publishes them; their paths in the run directory."""
    from shared.rundir import RunDir
    from tests.integration.test_weight_reload import perturbed_weights

    rundir = RunDir(run_dir)
    for v in range(1, VERSIONS + 1):
        perturbed_weights(model, rundir, version=v, seed=v)
    return [rundir.weights.relative(v) for v in range(1, VERSIONS + 1)]


async def hand_off(url: str, kind: str, run_dir: Path, paths: list[str]) -> list[float]:
    client = InferenceClient(url, None, 600)
    try:
        backend = await detect(client, kind, run_dir, 600)
        times = []
        for v in range(1, VERSIONS + 1):
            start = time.perf_counter()
            info = await backend.load(v, paths[v - 1])
            times.append(time.perf_counter() - start)
            assert info.version == v, (kind, v, info)
        return times
    finally:
        await client.close()


async def samples_per_s(url: str) -> float:
    client = InferenceClient(url, None, 600)
    try:
        model = (await client.http.get("/v1/models")).json()["data"][0]["id"]

        async def one(i: int) -> int:
            r = await client.openai.completions.create(
                model=model,
                prompt=f"{i % 10}+{(i * 7) % 10}=",
                n=GROUP,
                max_tokens=TOKENS,
                temperature=1.0,
                logprobs=0,
                extra_body={"return_token_ids": True},
            )
            return len(r.choices)

        await asyncio.gather(*(one(i) for i in range(PROMPTS)))  # warm-up
        start, samples = time.perf_counter(), 0
        for r in range(ROUNDS):
            samples += sum(await asyncio.gather(*(one(r * PROMPTS + i) for i in range(PROMPTS))))
        return samples / (time.perf_counter() - start)
    finally:
        await client.close()


def sglang_server(python: str, model: str, run_dir: Path, port: int) -> subprocess.Popen:
    log = open(run_dir / "sglang.log", "ab")  # noqa: SIM115 (the process keeps it)
    cmd = [
        python,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--device",
        "cpu",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1"}
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def measure(kind: str, workdir: Path, model: str, sglang_python: str | None) -> dict:
    from shared.waiting import wait_for
    from tests.helpers import Server, free_port

    run_dir = workdir / kind
    run_dir.mkdir(parents=True)
    paths = write_versions(model, run_dir)
    if kind == "sglang":
        port = free_port()
        proc = sglang_server(sglang_python, model, run_dir, port)
        url = f"http://127.0.0.1:{port}"
        import httpx

        def up() -> bool | None:
            assert proc.poll() is None, (run_dir / "sglang.log").read_text()[-3000:]
            try:
                return httpx.get(url + "/health", timeout=2).status_code == 200 or None
            except httpx.HTTPError:
                return None

        wait_for(up, f"SGLang at {url}", 600, poll=1)
        stop = lambda: os.killpg(proc.pid, 15)  # noqa: E731
    else:
        extra = ["inference.backend=vllm"] if kind == "vllm" else []
        server = Server(run_dir, model, run_dir / "server.log", *extra)
        server.wait_healthy(600)
        url, stop = server.url, server.stop
    try:
        times = asyncio.run(hand_off(url, kind, run_dir, paths))
        rate = asyncio.run(samples_per_s(url))
    finally:
        stop()
    return {"handoff_ms": round(1000 * statistics.median(times[1:]), 1), "samples_per_s": round(rate, 1)}


def markdown(results: dict) -> str:
    lines = [
        "# Triad's launcher against stock servers (embedded default model, one run)",
        "",
        "| server | hand-off (ms, median v2..v6) | samples/s |",
        "|---|---|---|",
    ]
    names = {"triad": "triad's launcher (/admin)", "vllm": "stock vLLM (RL routes)", "sglang": "SGLang"}
    for kind, r in results["servers"].items():
        lines.append(f"| {names[kind]} | {r['handoff_ms']} | {r['samples_per_s']} |")
    lines += ["", results["note"], ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--sglang-python", default=None)
    args = parser.parse_args()
    from services.models import resolve_model

    model = resolve_model("builtin:tiny-addition")
    kinds = ["triad", "vllm", *(["sglang"] if args.sglang_python else [])]
    servers = {kind: measure(kind, args.workdir, model, args.sglang_python) for kind in kinds}
    results = {
        "servers": servers,
        "machine": f"{os.cpu_count()} cores",
        "note": "Each server alone on the machine, unpinned; hand-off from the load request to the "
        "server reporting the version (stock vLLM: pause, start, update, finish, resume, then the "
        "/weight_checker checksums).",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "stock_servers.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "stock_servers.md").write_text(markdown(results))
    print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
