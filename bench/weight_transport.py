"""Weight hand-off by broadcast against by files, for models of about 5M, 50M and 200M parameters.

    python -m bench.weight_transport WORKDIR [SIZE ...]    (prints one JSON line; SIZE: 5M, 50M, 200M)

For each size a Qwen2-shaped model with random weights is built, a triad
inference server started on it, and a 1-rank trainer run on prepared batches,
once with `weights.transport = "filesystem"` and once with `"broadcast"`. This
script plays the orchestrator: it answers the trainer's `SEND_READY` and asks
the server to receive (broadcast), or loads each published `DONE` (files).
Hand-off time for version V: from the trainer starting to publish V (its
metrics row time minus its `publish_s`) to the server's answer that it serves V.
Median over versions after the first (which includes joining the group).

Digest cost (`shared/digest.py`, on the hand-off's path on both sides): the
trainer's `digest_s` metric for each version, plus the same digest computed in
this process over the tensors of a published file (what inference computes of
what it loads, same bytes, same machine), as a fraction of the hand-off time.
`digest_figures` keeps just these for 5M and 50M (`bench/run --only digest`).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from shared.admin_api import ADMIN_PREFIX, BROADCAST_INIT_ROUTE, BROADCAST_RECEIVE_ROUTE, WEIGHTS_ROUTE
from shared.broadcast import Receiving, write_handshake
from shared.rundir import TRAINER, Handshake, RunDir

REPO = Path(__file__).resolve().parent.parent
SIZES = {  # name: (hidden, layers, intermediate, heads) -> about 5M, 50M, 200M parameters
    "5M": (256, 4, 1024, 4),
    "50M": (640, 8, 2560, 10),
    "200M": (1024, 12, 4096, 16),
}
STEPS = 5
TRANSPORTS = ("filesystem", "broadcast")
DIGEST_SIZES = ("5M", "50M")  # the digest's share of the hand-off (200M adds minutes, not insight)
DIGEST_GOAL = "digests (trainer + inference) < 5% of the hand-off"


def build_model(dest: Path, hidden: int, layers: int, intermediate: int, heads: int) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from services.tiny_model import make_tokenizer

    tokenizer = make_tokenizer()
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        torch_dtype="float32",
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)
    return sum(p.numel() for p in model.parameters())


def post(url: str, route: str, body: dict) -> httpx.Response:
    r = httpx.post(url + ADMIN_PREFIX + route, json=body, timeout=600)
    r.raise_for_status()
    return r


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"trainer gone or too slow waiting for {path}")
        time.sleep(0.005)


def inference_digest_s(weights_dir: Path, repeats: int = 3) -> float:
    """Seconds to digest every tensor of a published directory, as the inference worker does
    (median of `repeats`)."""
    from safetensors.torch import load_file

    from shared.digest import tensor_digest

    tensors = {}
    for file in RunDir.tensor_files_at(weights_dir):
        tensors.update(load_file(file))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for tensor in tensors.values():
            tensor_digest(tensor)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def start_trainer(sets: list[str], log: Path) -> subprocess.Popen:
    """A 1-rank torchrun trainer with these `--set`s, its output to `log`."""
    from tests.helpers import trainer_cmd

    with open(log, "wb") as out:
        return subprocess.Popen(
            trainer_cmd(*[f"--set={s}" for s in sets]),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def one_run(workdir: Path, model: str, transport: str) -> tuple[list[float], list[float]]:
    """Hand-off seconds and the trainer's digest seconds, for versions 2.."""
    from tests.helpers import Server, free_port
    from tests.integration.test_trainer import make_batches

    run_dir = workdir / transport
    run_id = RunDir(run_dir).ensure_run({}).run_id
    make_batches(run_dir, model, range(1, STEPS + 1))
    server = Server(run_dir, model, workdir / f"{transport}-inference.log", "inference.kv_cache_gib=1")
    server.wait_healthy(600)
    port = free_port()
    sets = [
        f"run_dir={run_dir}",
        f"model={model}",
        f"max_steps={STEPS}",
        f'weights.transport="{transport}"',
        f"weights.broadcast.port={port}",
        "trainer.checkpoint.every=0",
        "weights.keep=3",
    ]
    trainer = start_trainer(sets, workdir / f"{transport}-trainer.log")
    rundir, served = RunDir(run_dir), {}
    try:
        if transport == "broadcast":
            init = dict(host="127.0.0.1", port=port, generation=1, world_size=2, rank_offset=1, timeout_s=300)
            post(server.url, BROADCAST_INIT_ROUTE, init)
        for v in range(1, STEPS + 1):
            body = {"version": v, "path": rundir.weights.relative(v)}
            if transport == "broadcast":
                wait_for(rundir.store.local_path(rundir.handshake_key(v, Handshake.SEND_READY)), trainer)
                receiving = Receiving(run_id=run_id, version=v, generation=1, world_size=2)
                write_handshake(rundir, v, Handshake.RECEIVING, receiving)
                post(server.url, BROADCAST_RECEIVE_ROUTE, body)
            else:
                wait_for(rundir.weights.marker_path(v), trainer)
                post(server.url, WEIGHTS_ROUTE, body)
            served[v] = time.time()
        if trainer.wait(timeout=600) != 0:
            raise RuntimeError(f"trainer failed: see {workdir}/{transport}-trainer.log")
    finally:
        if trainer.poll() is None:
            trainer.kill()
        server.stop()
    rows = {r["step"]: r for r in rundir.metrics.rows(TRAINER)}
    handoff = [served[v] - (rows[v]["time"] - rows[v]["publish_s"]) for v in range(2, STEPS + 1)]
    return handoff, [rows[v]["digest_s"] for v in range(2, STEPS + 1)]


def digest_figures(transport: dict) -> dict:
    """The digest's share of the hand-off, per size of `DIGEST_SIZES`, from `main`'s result."""
    keys = ["bytes", "inference_digest_s"] + [
        f"{t}_{what}"
        for t in TRANSPORTS
        for what in ("s", "trainer_digest_s", "trainer_digest_max_s", "digest_frac")
    ]
    sizes = {size: {k: w[k] for k in keys} for size, w in transport.items() if size in DIGEST_SIZES}
    return {**sizes, "goal": DIGEST_GOAL}


def main() -> None:
    workdir = Path(sys.argv[1])
    chosen = sys.argv[2:] or list(SIZES)
    results = {}
    for name, shape in ((n, SIZES[n]) for n in chosen):
        model_dir = workdir / f"model-{name}"
        params = build_model(model_dir, *shape)
        tensor_bytes = sum(f.stat().st_size for f in RunDir.tensor_files_at(model_dir))
        figure: dict = {"parameters": params, "bytes": tensor_bytes}
        figure["inference_digest_s"] = inference_digest_s(model_dir)
        for transport in TRANSPORTS:
            handoff, digest = one_run(workdir / name, str(model_dir), transport)
            figure[f"{transport}_s"] = statistics.median(handoff)
            figure[f"{transport}_trainer_digest_s"] = statistics.median(digest)
            figure[f"{transport}_trainer_digest_max_s"] = max(digest)
            digest_total = figure[f"{transport}_trainer_digest_s"] + figure["inference_digest_s"]
            figure[f"{transport}_digest_frac"] = digest_total / figure[f"{transport}_s"]
        figure["speedup"] = figure["filesystem_s"] / figure["broadcast_s"]
        results[name] = figure
    print(json.dumps(results))


if __name__ == "__main__":
    main()
