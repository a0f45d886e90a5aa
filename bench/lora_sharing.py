"""Samples/s of one LoRA run alone on a triad inference server against two LoRA runs sharing it.

    python -m bench.lora_sharing WORKDIR    (prints one JSON line)

The embedded default's model and task (`builtin:tiny-addition`, addition, 16 groups of 8,
`max_async_level = 1`) with `[trainer.lora]` rank 8 (alpha 16) on all seven projections and a
1-rank torchrun trainer per run. One server started with `--enable-lora --max-loras 4` on
WORKDIR/shared serves first one run alone (its orchestrator and trainer), then two runs at
once, each with its own run_dir inside the server's and its own orchestrator and trainer.
A run's samples/s: the samples of its steps after the warm-up over the time they took (from
the orchestrator's metrics rows); an adapter version's load time is the server's `load_s` (its
metrics rows), alone and shared.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from shared.rundir import ORCHESTRATOR, RunDir

REPO = Path(__file__).resolve().parent.parent
STEPS, WARMUP = 20, 4
RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VLLM_LORA = f"inference.vllm_args=['--enable-lora','--max-lora-rank','{RANK}','--max-loras','4']"


def sets(run_dir: Path, server_url: str) -> list[str]:
    return [
        f"run_dir={run_dir}",
        f"max_steps={STEPS}",
        "trainer.checkpoint.every=0",
        "weights.keep=3",
        "orchestrator.eval.every=0",
        f'orchestrator.servers.urls=["{server_url}"]',
        f"trainer.lora.rank={RANK}",
        f"trainer.lora.alpha={2 * RANK}",
        f"trainer.lora.target_modules={TARGETS}",
    ]


def start(run_dir: Path, server_url: str) -> list[subprocess.Popen]:
    """The run's orchestrator and 1-rank trainer, with the embedded default's config."""
    config = ["-c", str(REPO / "services" / "embedded_default.toml")]
    flags = [*config, *[f"--set={s}" for s in sets(run_dir, server_url)]]
    from tests.helpers import trainer_cmd

    cmds = [
        [sys.executable, "-m", "services.cli", "orchestrator", *flags],
        trainer_cmd(*flags),
    ]
    run_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for name, cmd in zip(("orchestrator", "trainer"), cmds, strict=True):
        with open(run_dir.parent / f"{run_dir.name}-{name}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
    return procs


def samples_per_s(run_dir: Path) -> float:
    rows = [r for r in RunDir(run_dir).metrics.rows(ORCHESTRATOR) if r["step"] >= WARMUP]
    return sum(r["samples"] for r in rows[1:]) / (rows[-1]["time"] - rows[0]["time"])


def load_seconds(server_dir: Path, run_dirs: list[Path]) -> dict[str, float]:
    """Median and largest time the server took to load one of these runs' adapter versions."""
    ids = {RunDir(d).read_run().run_id for d in run_dirs}
    rows = RunDir(server_dir).metrics.rows("inference")
    times = sorted(r["load_s"] for r in rows if r.get("run_id") in ids)
    return {"median": statistics.median(times), "max": times[-1]}


def runs(run_dirs: list[Path], server_url: str) -> dict[str, float]:
    """Run these runs at once to the end; each one's samples/s."""
    procs = [p for run_dir in run_dirs for p in start(run_dir, server_url)]
    try:
        for proc in procs:
            if proc.wait(timeout=1800) != 0:
                raise RuntimeError(f"{proc.args[:6]} failed: see the logs in {run_dirs[0].parent}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return {run_dir.name: samples_per_s(run_dir) for run_dir in run_dirs}


def main() -> None:
    from services.models import resolve_model
    from tests.helpers import Server

    shared = Path(sys.argv[1]) / "shared"
    shared.mkdir(parents=True, exist_ok=True)
    model = resolve_model("builtin:tiny-addition")
    server = Server(shared, model, shared.parent / "inference.log", VLLM_LORA)
    try:
        server.wait_healthy(600)
        alone = runs([shared / "alone"], server.url)["alone"]
        both = runs([shared / "a", shared / "b"], server.url)
    finally:
        server.stop()
    load_alone = load_seconds(shared, [shared / "alone"])
    load_shared = load_seconds(shared, [shared / "a", shared / "b"])
    together = both["a"] + both["b"]
    print(
        json.dumps(
            {
                "lora": f"rank {RANK} on {', '.join(TARGETS)}",
                "steps": STEPS,
                "warmup": WARMUP,
                "alone_samples_per_s": alone,
                "sharing_samples_per_s": both,
                "together_samples_per_s": together,
                "together_over_alone": together / alone,
                "adapter_load_s_alone": load_alone,
                "adapter_load_s_shared": load_shared,
            }
        )
    )


if __name__ == "__main__":
    main()
