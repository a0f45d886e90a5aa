"""Where a delta version's hand-off goes, offline: the trainer's publish and inference's apply,
phase by phase, before and after a change, in one run.

    python -m bench.delta_publish WORKDIR [--size 50M] [--versions 6] [--base 9d96d85] [--rounds 2]

No training and no vLLM: a state dict of `bench/weight_transport.py`'s model shapes (random
bf16 weights, a tied head stored once) and a chain of versions, each changing `--changed`
(0.107, the share the real 50M runs measured) of the words by one unit in the last place, as
small RL updates do in bf16. A moto server (`tests/s3.py`, its own process, loopback) holds the
run directory. Per version, timed by cProfile:

- publish: the trainer's `VersionWriter.write` (a delta from the version before: `pack`'s diff
  and compression, clearing the step directory, the metadata copies, the upload, the digests,
  the marker, pruning, and keeping the words as the next base);
- apply: inference's path for a delta it holds the base of: `pull_step_dir` (the download),
  then `DeltaChain.rebuild` (reading the held version, `apply`, the digests, writing the
  rebuilt safetensors).

"before" is the code of commit `--base` (extracted with `git archive`), "after" this working
tree; each runs the same versions in its own process (`--child`), alternating for `--rounds`
rounds. Figures: medians over the versions after the first delta of each round, per phase
(cumulative seconds of the named function) and in total, and after/before ratios. Writes
bench/results/delta_publish.{json,md}.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.suite import extract_commit

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
BASE_COMMIT = "9d96d85"
CHANGED = 0.107
RUN_ID = "bench-deltas"
BUCKET = "bench"
PUBLISH_PHASES = {  # phase: (file suffix, function name) whose cumulative time it is
    "pack (diff + compress)": ("shared/delta.py", "pack"),
    "compress": ("shared/delta.py", "_compress"),
    "clear step dir": ("shared/rundir/steps.py", "clear"),
    "metadata copies": ("trainer/versions.py", "put"),
    "upload": ("shared/objectcache.py", "writing"),
    "size lookup": ("shared/rundir/steps.py", "size"),
    "digests": ("trainer/versions.py", "timed_digests"),
    "marker": ("shared/rundir/steps.py", "write_marker"),
    "prune": ("shared/rundir/steps.py", "prune"),
    "keep base words": ("trainer/versions.py", "of"),
}
APPLY_PHASES = {
    "download": ("shared/rundir/__init__.py", "pull_step_dir"),
    "read held version": ("inference/deltas.py", "_held"),
    "apply": ("shared/delta.py", "apply"),
    "digests": ("inference/deltas.py", "digests"),
    "write rebuilt": ("inference/deltas.py", "_write"),
}


def shapes(size: str) -> dict[str, tuple[int, ...]]:
    """The published tensors of `bench/weight_transport.py`'s model of `size` (tied head once)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from bench.weight_transport import SIZES
    from services.tiny_model import make_tokenizer

    hidden, layers, intermediate, heads = SIZES[size]
    config = Qwen2Config(
        vocab_size=len(make_tokenizer()),
        hidden_size=hidden,
        num_hidden_layers=layers,
        intermediate_size=intermediate,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    return {n: tuple(p.shape) for n, p in model.named_parameters() if n != "lm_head.weight"}


def versions(size: str, count: int, changed: float, seed: int = 0):
    """Version 1 (random bf16), then `count` versions each changing `changed` of the words of
    the one before by one unit in the last place."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    words = {
        n: (torch.from_numpy(rng.standard_normal(s, dtype=np.float32) * 0.02).to(torch.bfloat16))
        .view(torch.int16)
        .numpy()
        .view(np.uint16)
        .reshape(-1)
        .copy()
        for n, s in shapes(size).items()
    }
    layout = shapes(size)
    for v in range(1, count + 2):
        if v > 1:
            for w in words.values():
                hit = np.flatnonzero(rng.random(w.size) < changed)
                w[hit] += rng.choice(np.array([1, 0xFFFF], np.uint16), hit.size)  # +-1 ulp
        yield (
            v,
            {
                n: torch.from_numpy(w.copy().view(np.int16)).view(torch.bfloat16).reshape(layout[n])
                for n, w in words.items()
            },
        )


def phase_seconds(profile: cProfile.Profile, phases: dict[str, tuple[str, str]]) -> dict[str, float]:
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    out = dict.fromkeys(phases, 0.0)
    for (file, _, name), (_, _, _, cumulative, _) in stats.items():
        for phase, (suffix, function) in phases.items():
            if name == function and file.endswith(suffix):
                out[phase] += cumulative
    return out


def child(workdir: Path, size: str, count: int, changed: float) -> dict:
    """Publish and apply `count` delta versions with the code on `sys.path`; per-version phase
    seconds."""
    from inference.deltas import DeltaChain
    from shared.delta import changed_words
    from shared.digest import load_cpu_kernel, version_digest
    from shared.rundir import DeltaFiles, RunDir, pull_step_dir
    from trainer.versions import Metadata, VersionWriter

    rundir = RunDir(f"s3://{BUCKET}/{workdir.name}")

    def save(directory: Path) -> None:
        for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            (directory / name).write_text(json.dumps({"name": name}))

    load_cpu_kernel()
    writer = VersionWriter(rundir, Metadata(rundir, save), every=10_000, keep=3)
    chain = DeltaChain(rundir, workdir / "work")
    rows = []
    for v, state in versions(size, count, changed):
        publish = cProfile.Profile()
        started = time.perf_counter()
        publish.runcall(writer.write, v, RUN_ID, state, False)
        published = time.perf_counter()
        apply = cProfile.Profile()
        served, path = apply.runcall(pull_step_dir, rundir, rundir.weights.relative(v))
        marker = RunDir.marker_at(path)
        if getattr(marker, "delta_base", None) is not None:
            blob = DeltaFiles.file_at(path).read_bytes()
            path = apply.runcall(chain.rebuild, v, marker, blob)
            changed, words = changed_words(blob)
            rows.append(
                {
                    "version": v,
                    "publish_s": published - started,
                    "apply_s": time.perf_counter() - published,
                    "delta_bytes": len(blob),
                    "changed_share": changed / words,
                    "publish": phase_seconds(publish, PUBLISH_PHASES),
                    "apply": phase_seconds(apply, APPLY_PHASES),
                }
            )
        chain.served(v, path, version_digest(dict(marker.tensor_digests)))
    return {"parameters": sum(t.numel() for t in state.values()), "rows": rows}


def run_child(code: Path, workdir: Path, args: argparse.Namespace, env: dict[str, str]) -> dict:
    workdir.mkdir(parents=True)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(workdir),
        "--size",
        args.size,
        "--versions",
        str(args.versions),
        "--changed",
        str(args.changed),
    ]
    child_env = {**env, "PYTHONPATH": str(code)}
    out = subprocess.run(cmd, cwd=code, env=child_env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"the {code} child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def medians(rows: list[dict]) -> dict:
    def med(key: str, phase: str | None = None) -> float:
        return statistics.median(r[key][phase] if phase else r[key] for r in rows)

    return {
        "publish_s": med("publish_s"),
        "apply_s": med("apply_s"),
        "delta_bytes": med("delta_bytes"),
        "changed_share": med("changed_share"),
        "publish": {p: med("publish", p) for p in PUBLISH_PHASES},
        "apply": {p: med("apply", p) for p in APPLY_PHASES},
    }


def markdown(result: dict) -> str:
    before, after = result["before"], result["after"]

    def row(label: str, b: float, a: float, scale: float = 1e3) -> str:
        return f"| {label} | {b * scale:.0f} | {a * scale:.0f} | {a / b if b else float('nan'):.2f} |"

    lines = [
        f"Delta publish and apply, offline ({result['size']}, {result['parameters']} parameters, changed "
        f"share {after['changed_share']:.3f}; {result['date']}, load average {' '.join(result['loadavg'])}; "
        f"before = {result['base']}, after = this tree, medians of {result['versions_each']} versions each)",
        "",
        "| phase | before (ms) | after (ms) | after / before |",
        "| --- | --- | --- | --- |",
    ]
    for side in ("publish", "apply"):
        lines.append(row(f"**{side} total**", before[side + "_s"], after[side + "_s"]))
        lines += [row(f"{side}: {phase}", before[side][phase], after[side][phase]) for phase in before[side]]
    lines.append(row("delta bytes", before["delta_bytes"], after["delta_bytes"], 1))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("--size", default="50M")
    parser.add_argument("--versions", type=int, default=6, help="delta versions per round and side")
    parser.add_argument("--changed", type=float, default=CHANGED)
    parser.add_argument("--base", default=BASE_COMMIT, help="the commit measured as 'before'")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.workdir, args.size, args.versions, args.changed)))
        return
    from tests.s3 import MotoServer

    args.workdir.mkdir(parents=True, exist_ok=True)
    code = {"before": extract_commit(args.base, args.workdir / "before-code"), "after": REPO}
    moto = MotoServer(args.workdir / "moto.log")
    rows: dict[str, list[dict]] = {"before": [], "after": []}
    try:
        moto.create_bucket(BUCKET)
        env = {**os.environ, **moto.env()}
        for round_ in range(args.rounds):
            for side in ("before", "after"):
                got = run_child(code[side], args.workdir / f"{side}-{round_}", args, env)
                rows[side] += got["rows"][1:]  # the first delta also warms caches and connections
    finally:
        moto.close()
    result = {
        "bench": "delta_publish",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "size": args.size,
        "parameters": got["parameters"],
        "base": args.base,
        "versions_each": len(rows["after"]),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
        "before": medians(rows["before"]),
        "after": medians(rows["after"]),
    }
    result["publish_after_over_before"] = result["after"]["publish_s"] / result["before"]["publish_s"]
    result["apply_after_over_before"] = result["after"]["apply_s"] / result["before"]["apply_s"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "delta_publish.json").write_text(json.dumps(result, indent=1))
    (RESULTS / "delta_publish.md").write_text(markdown(result))
    print(markdown(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
