"""Hand-off of a LoRA adapter against full weights, for the 5M and 50M models of
`bench/weight_transport.py`.

    python -m bench.adapter_handoff WORKDIR [SIZE ...]    (prints one JSON line; SIZE: 5M, 50M)

For each size, a 1-rank trainer on prepared batches publishes versions 1..5 twice: full
weights to a triad inference server (`weights.transport = "filesystem"`, loaded with
`POST /admin/weights`: `bench/weight_transport.py`'s own run), and a LoRA adapter (rank 8 on
q, k, v and o) to a server started with `--enable-lora` (loaded with `POST /admin/adapters`,
served as `<name>@v<V>`). This script plays the orchestrator. Hand-off time for version V:
from the trainer starting to publish V (its metrics row time minus `publish_s`) to the
server's answer that it serves V. Median over versions 2..5.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from bench.weight_transport import SIZES, STEPS, build_model, one_run, post, start_trainer, wait_for
from shared.admin_api import ADAPTERS_ROUTE
from shared.rundir import TRAINER, RunDir

RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
LORA = [
    f"trainer.lora.rank={RANK}",
    f"trainer.lora.alpha={2 * RANK}",
    f"trainer.lora.target_modules={TARGETS}",
]
VLLM_LORA = f"inference.vllm_args=['--enable-lora','--max-lora-rank','{RANK}','--max-loras','2']"
HANDOFF_SIZES = ("5M", "50M")


def adapter_run(workdir: Path, model: str) -> tuple[list[float], int]:
    """Hand-off seconds of the adapter for versions 2.., and the bytes of one version."""
    from tests.helpers import Server
    from tests.integration.test_trainer import make_batches

    run_dir = workdir / "adapter"
    run_id = RunDir(run_dir).ensure_run({}).run_id
    make_batches(run_dir, model, range(1, STEPS + 1))
    server = Server(run_dir, model, workdir / "adapter-inference.log", "inference.kv_cache_gib=1", VLLM_LORA)
    server.wait_healthy(600)
    sets = [
        f"run_dir={run_dir}",
        f"model={model}",
        f"max_steps={STEPS}",
        "trainer.checkpoint.every=0",
        "weights.keep=3",
        *LORA,
    ]
    trainer = start_trainer(sets, workdir / "adapter-trainer.log")
    rundir, served, size = RunDir(run_dir), {}, 0
    try:
        for v in range(1, STEPS + 1):
            wait_for(rundir.weights.marker_path(v), trainer)
            size = rundir.weights.marker(v, run_id).bytes
            body = {"name": "bench", "run_id": run_id, "version": v, "path": rundir.weights.relative(v)}
            post(server.url, ADAPTERS_ROUTE, body)
            served[v] = time.time()
        if trainer.wait(timeout=600) != 0:
            raise RuntimeError(f"trainer failed: see {workdir}/adapter-trainer.log")
    finally:
        if trainer.poll() is None:
            trainer.kill()
        server.stop()
    rows = {r["step"]: r for r in rundir.metrics.rows(TRAINER)}
    return [served[v] - (rows[v]["time"] - rows[v]["publish_s"]) for v in range(2, STEPS + 1)], size


def main() -> None:
    workdir = Path(sys.argv[1])
    results = {}
    for name in sys.argv[2:] or HANDOFF_SIZES:
        model_dir = workdir / f"model-{name}"
        params = build_model(model_dir, *SIZES[name])
        full_bytes = sum(f.stat().st_size for f in RunDir.tensor_files_at(model_dir))
        full, _ = one_run(workdir / name, str(model_dir), "filesystem")
        adapter, adapter_bytes = adapter_run(workdir / name, str(model_dir))
        results[name] = {
            "parameters": params,
            "lora": f"rank {RANK} on {', '.join(TARGETS)}",
            "full_bytes": full_bytes,
            "adapter_bytes": adapter_bytes,
            "full_s": statistics.median(full),
            "adapter_s": statistics.median(adapter),
            "full_all_s": full,
            "adapter_all_s": adapter,
            "speedup": statistics.median(full) / statistics.median(adapter),
        }
    print(json.dumps(results))


if __name__ == "__main__":
    main()
