"""Delta versions through an object store: bytes per version and hand-off, full against delta.

    python -m bench.weight_deltas WORKDIR [--sizes 5M 50M 200M] [--versions 5M=12 ...] [--every 5]

A moto server (`tests/s3.py`, its own process, loopback) plays the S3-compatible store and
holds the run directory (`s3://bench/<size>`). Per size (`bench/weight_transport.py`'s models):
a 1-rank torchrun trainer on prepared batches (`make_batches`: real optimizer updates at the
configured `trainer.optim.lr`) publishes versions 1..N in bf16 (`weights.dtype = "bfloat16"`)
with `weights.snapshot_every = K`, so versions 1, K, 2K, ... are full snapshots and the others
deltas, in the same run; a real vLLM server loads each version from the store (this script
plays the orchestrator). Per version: the bytes the step directory holds (its marker's
`bytes`: metadata, then safetensors or the delta), the delta's share of changed words, and the
hand-off (from the trainer starting to publish to the server's answer). Figures are medians
over the snapshot versions after the first (or the first, if it is the only one) and over the
delta versions; for the delta versions also the medians of the trainer's publish phases
(`publish_s`, `gather_s`, `write_s`, `mark_s`) and of the server's load (`load_s`), and the
load average at the end of each size's run (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from bench.weight_transport import SIZES, build_model, post, start_trainer
from shared.admin_api import WEIGHTS_ROUTE
from shared.delta import changed_words
from shared.rundir import INFERENCE, TRAINER, DeltaFiles, RunDir

BUCKET = "bench"
GOAL = "at 50M: >= 10x fewer bytes per version and a hand-off < 7 s"
TRAINER_PHASES = ("publish_s", "gather_s", "write_s", "mark_s", "train_s")  # the trainer's metrics


def run_size(workdir: Path, size: str, versions: int, every: int, keep: int = 3) -> dict:
    from tests.helpers import Server
    from tests.integration.test_trainer import make_batches

    model = workdir / "model"
    params = build_model(model, *SIZES[size])
    run_dir = f"s3://{BUCKET}/{size}"
    make_batches(run_dir, str(model), range(1, versions + 1))
    cache = f"store.cache_dir={workdir / 'cache-inference'}"
    server = Server(run_dir, str(model), workdir / "inference.log", "inference.kv_cache_gib=1", cache)
    server.wait_healthy(900)
    sets = [
        f"run_dir={run_dir}",
        f"model={model}",
        f"max_steps={versions}",
        "trainer.checkpoint.every=0",
        f"weights.keep={keep}",
        f"weights.snapshot_every={every}",
        'weights.dtype="bfloat16"',
        f"store.cache_dir={workdir / 'cache-trainer'}",
    ]
    trainer = start_trainer(sets, workdir / "trainer.log")
    rundir, rows = RunDir(run_dir), {}
    try:
        for v in range(1, versions + 1):
            deadline = time.monotonic() + 900
            while not rundir.weights.has_marker(v):
                if trainer.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"no weights v{v} from the trainer: see {workdir}/trainer.log")
                time.sleep(0.05)
            marker = rundir.weights.marker(v, rundir.read_run().run_id)
            post(server.url, WEIGHTS_ROUTE, {"version": v, "path": rundir.weights.relative(v)})
            delta = getattr(marker, "delta_base", None) is not None
            rows[v] = {"served": time.time(), "bytes": marker.bytes, "delta": delta}
            if rows[v]["delta"]:
                _, blob = DeltaFiles(rundir.weights).read(v)
                changed, total = changed_words(blob or b"")
                rows[v].update(delta_bytes=len(blob or b""), changed_share=changed / total)
        if trainer.wait(timeout=900) != 0:
            raise RuntimeError(f"trainer failed: see {workdir}/trainer.log")
    finally:
        if trainer.poll() is None:
            trainer.kill()
        server.stop()
    for r in rundir.metrics.rows(TRAINER):
        row = rows[r["step"]]
        row["hand_off_s"] = row["served"] - (r["time"] - r["publish_s"])
        row.update({key: r[key] for key in TRAINER_PHASES if key in r})
    for r in rundir.metrics.rows(INFERENCE):
        if r.get("version") in rows and "load_s" in r:
            rows[r["version"]]["load_s"] = r["load_s"]  # vLLM's reload of the rebuilt files
    return summarize(params, versions, every, rows)


def summarize(params: int, versions: int, every: int, rows: dict[int, dict]) -> dict:
    full = [r for v, r in sorted(rows.items()) if not r["delta"]]
    full = full[1:] or full  # the first version also renders the metadata files
    delta = [r for r in rows.values() if r["delta"]]
    out = {
        "parameters": params,
        "versions": versions,
        "snapshot_every": every,
        "full_versions": len(full),
        "delta_versions": len(delta),
        "full_bytes": statistics.median(r["bytes"] for r in full),
        "full_hand_off_s": statistics.median(r["hand_off_s"] for r in full),
    }
    if delta:
        out["delta_bytes"] = statistics.median(r["bytes"] for r in delta)
        out["delta_file_bytes"] = statistics.median(r["delta_bytes"] for r in delta)
        out["changed_share"] = statistics.median(r["changed_share"] for r in delta)
        out["delta_hand_off_s"] = statistics.median(r["hand_off_s"] for r in delta)
        out["bytes_full_over_delta"] = out["full_bytes"] / out["delta_bytes"]
        out["hand_off_full_over_delta"] = out["full_hand_off_s"] / out["delta_hand_off_s"]
        for key in (*TRAINER_PHASES, "load_s"):  # where a delta version's hand-off goes
            if all(key in r for r in delta):
                out[f"delta_{key}"] = statistics.median(r[key] for r in delta)
    out["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]  # at the end of this size's run
    return out


def main() -> None:
    from tests.s3 import MotoServer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--sizes", nargs="+", default=["5M", "50M", "200M"])
    parser.add_argument("--versions", nargs="*", default=["5M=12", "50M=11", "200M=6"])
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--keep", type=int, default=3, help="weights.keep: more if a snapshot's pull is slow")
    args = parser.parse_args()
    counts = {k: int(v) for k, v in (item.split("=") for item in args.versions)}
    args.workdir.mkdir(parents=True, exist_ok=True)
    moto = MotoServer(args.workdir / "moto.log")
    os.environ.update(moto.env())  # the services started here inherit the endpoint and credentials
    results: dict = {"goal": GOAL}
    try:
        moto.create_bucket(BUCKET)
        for size in args.sizes:
            (args.workdir / size).mkdir(exist_ok=True)
            results[size] = run_size(args.workdir / size, size, counts[size], args.every, args.keep)
            print(json.dumps({size: results[size]}), flush=True)
    finally:
        moto.close()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
