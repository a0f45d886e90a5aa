"""What streaming a rollout answer costs on long generations, against asking for it whole.

    python -m bench.streaming_cost WORKDIR [--rounds 2] [--lengths 128 512 960] [--requests 8]

Rollout requests longer than one chunk are streamed (`InferenceClient.complete`: vLLM sends a
sample's tokens every 16), so a request's bound is on each chunk, not on the whole generation.
The chunks cost JSON on vLLM's API server and parsing in the orchestrator. This bench times the
real client against a real `triad inference` on a model of the embedded chat model's shape
(`builtin:tiny-tools`: Qwen3, its tokenizer, 1024 tokens of context) with random weights, so a
sample runs to its `max_tokens` (an end-of-turn token is 1 of 151,936): per length, `--requests`
requests of 8 samples at temperature 1 at once, streamed and whole alternating (A B A B) in one
run, each arm's first after a warm-up batch. Reported per arm: generated tokens per second (wall) and
the client process's CPU seconds per 1000 tokens (the orchestrator's share of the cost), with
the load average before each; the ratio streamed over whole per length. Results:
bench/results/streaming_cost.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import statistics
import time
from pathlib import Path

from bench.suite import RESULTS
from orchestrator.servers.client import STREAM_INTERVAL, InferenceClient
from tests.helpers import Server

SAMPLES = 8  # per request, as a group of the embedded defaults
PROMPT_IDS = 16


def random_model(workdir: Path) -> str:
    """`builtin:tiny-tools`'s config, tokenizer and template with the real-size fixture's seeded
    random weights (`tests.realsize.write_weights`)."""
    from services.models import resolve_model
    from tests.realsize import write_weights

    source = Path(resolve_model("builtin:tiny-tools"))
    target = workdir / "tiny-tools-random"
    if target.exists():
        return str(target)
    building = workdir / "tiny-tools-random.building"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    for f in source.iterdir():  # the config, tokenizer, its template and the generation config
        if f.suffix != ".safetensors" and f.name != "triad_build.json":
            shutil.copy(f, building / f.name)
    write_weights(building)
    building.rename(target)
    return str(target)


async def one_batch(
    client: InferenceClient, prompts: list[list[int]], length: int
) -> tuple[float, float, int]:
    """Wall and CPU seconds of `prompts` asked at once, `SAMPLES` samples of `length` each; the
    tokens generated."""
    wall, cpu = time.monotonic(), time.process_time()
    answers = await asyncio.gather(*(client.complete(p, SAMPLES, length, 1.0) for p in prompts))
    tokens = sum(len(c.token_ids) for answer in answers for c in answer)
    return time.monotonic() - wall, time.process_time() - cpu, tokens


async def measure(url: str, lengths: list[int], requests: int, rounds: int) -> list[dict]:
    rng = random.Random(0)
    arms = {"streamed": STREAM_INTERVAL, "whole": None}
    clients = {arm: InferenceClient(url, None, 600, interval) for arm, interval in arms.items()}
    for client in clients.values():
        await client.wait_ready(600, None)
    rows = []
    try:
        for length in lengths:
            for round_ in range(rounds):
                for arm, client in clients.items():
                    prompts = [
                        [rng.randrange(1000, 100_000) for _ in range(PROMPT_IDS)] for _ in range(requests)
                    ]
                    if round_ == 0:  # a warm-up batch per arm and length
                        await one_batch(client, prompts, length)
                    load = os.getloadavg()[0]
                    wall, cpu, tokens = await one_batch(client, prompts, length)
                    rows.append(
                        dict(
                            length=length,
                            round=round_,
                            arm=arm,
                            wall_s=wall,
                            cpu_s=cpu,
                            tokens=tokens,
                            load=load,
                        )
                    )
                    print(json.dumps(rows[-1]), flush=True)
    finally:
        for client in clients.values():
            await client.close()
    return rows


def summary(rows: list[dict]) -> list[dict]:
    """Per length and arm: median tokens/s and client CPU ms per 1000 tokens; streamed / whole."""
    out = []
    for length in sorted({r["length"] for r in rows}):
        arm = {}
        for name in ("streamed", "whole"):
            mine = [r for r in rows if r["length"] == length and r["arm"] == name]
            arm[name] = dict(
                tokens_per_s=statistics.median(r["tokens"] / r["wall_s"] for r in mine),
                cpu_ms_per_1k_tokens=statistics.median(1e6 * r["cpu_s"] / r["tokens"] for r in mine),
                tokens=statistics.median(r["tokens"] for r in mine),
            )
        out.append(
            dict(
                length=length,
                **{f"{k}_{name}": v for name, a in arm.items() for k, v in a.items()},
                throughput_ratio=arm["streamed"]["tokens_per_s"] / arm["whole"]["tokens_per_s"],
                cpu_ratio=arm["streamed"]["cpu_ms_per_1k_tokens"] / arm["whole"]["cpu_ms_per_1k_tokens"],
            )
        )
    return out


def markdown(result: dict) -> str:
    lines = [
        "# What streaming a rollout answer costs (`bench/streaming_cost.py`)",
        "",
        f"{result['measured_at']}, {result['requests']} requests of {SAMPLES} samples at once per batch, "
        f"random-weight `builtin:tiny-tools` shape, chunks of {STREAM_INTERVAL} tokens; medians over "
        f"{result['rounds']} alternating rounds (load {min(r['load'] for r in result['rows']):.1f}-"
        f"{max(r['load'] for r in result['rows']):.1f}).",
        "",
        "| max_tokens | tokens/s streamed | tokens/s whole | streamed / whole | client CPU ms per 1k tokens, "
        "streamed | whole | streamed / whole |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in result["summary"]:
        lines.append(
            f"| {s['length']} | {s['tokens_per_s_streamed']:.0f} | {s['tokens_per_s_whole']:.0f} | "
            f"{s['throughput_ratio']:.2f} | {s['cpu_ms_per_1k_tokens_streamed']:.1f} | "
            f"{s['cpu_ms_per_1k_tokens_whole']:.1f} | {s['cpu_ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 960])
    parser.add_argument("--requests", type=int, default=8)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    model = random_model(args.workdir)
    server = Server(args.workdir / "run", model, args.workdir / "inference.log")
    try:
        server.wait_healthy(600)
        rows = asyncio.run(measure(server.url, args.lengths, args.requests, args.rounds))
    finally:
        server.stop()
    result = dict(
        measured_at=time.strftime("%Y-%m-%d %H:%M"),
        requests=args.requests,
        rounds=args.rounds,
        rows=rows,
        summary=summary(rows),
    )
    (RESULTS / "streaming_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / "streaming_cost.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
