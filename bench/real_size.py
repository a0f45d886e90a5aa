"""A shipped config at real size (Qwen3-0.6B) beside the same at 50M: time per phase, peak RSS per service.

    python -m bench.real_size WORKDIR [SIZE ...] [--set KEY=VALUE ...] [--name NAME]
    (SIZE: 0.6B, 50M; both by default. --set: overrides after the CPU ones, e.g.
    trainer.parallel.activation_checkpointing=true; --name: the results' file stem, real_size)

Each size runs `triad up -c configs/qwen3-0.6b-calculator-1gpu.toml` for 2 steps on CPU with the
overrides of `tests.realsize.CPU_OVERRIDES` (README, "Real size on CPU"), full weights in a local
run directory. 0.6B is `Qwen/Qwen3-0.6B` from the real-size Hugging Face cache (`tests/realsize.py`:
its own config, random bf16 weights), offline; 50M is the same config.json, tokenizer and template
with a narrower, shallower body (hidden 256, 12 layers, the same 151936-word vocabulary), given as
a local path. Phases come from the run's metrics rows (docs/design.md, "Metrics"): vLLM start
(the server's version-0 row minus the run's `created_at`), generation (orchestrator `generate_s`),
train step (trainer `train_s`), publish (`publish_s`, with its `digest_s`), load (inference
`load_s`) and hand-off (trainer starts publishing V -> inference's row serving V); medians over
the 2 steps. Peak RSS per service: every process under `triad up` sampled each 0.5 s, its
`VmHWM` (the kernel's own peak) and the sum of RSS over the service's processes at each sample;
the trainer's largest process's RSS over time, with each step's span (`trainer_peak`), says in
which phase it peaked. Results: bench/results/NAME.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import psutil

from shared.rundir import RunDir

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
CONFIG = REPO / "configs" / "qwen3-0.6b-calculator-1gpu.toml"
SERVICES = ("inference", "orchestrator", "trainer")
SMALL = {"hidden_size": 256, "num_hidden_layers": 12, "max_window_layers": 12, "intermediate_size": 1024}
SMALL.update({"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64})
SAMPLE_S = 0.5
RUN_TIMEOUT_S = 3000
# the trainer's reference (issue 43: at most 1.3x it): the published bf16 model (2 bytes a parameter)
# plus the optimizer's fp32 master weights, gradients and AdamW's two moments (4 + 4 + 8)
TRAINER_BYTES_PER_PARAMETER = 2 + 4 + 4 + 8


def build_small(dest: Path) -> int:
    """The 50M model: Qwen3-0.6B's config.json with `SMALL`'s shape, the same tokenizer and template."""
    from tests.realsize import CONFIG as QWEN3_CONFIG
    from tests.realsize import TOKENIZER_DIR, TOKENIZER_FILES, write_weights

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / "config.json").write_text(json.dumps({**json.loads(QWEN3_CONFIG.read_text()), **SMALL}, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(TOKENIZER_DIR / name, dest / name)
    return write_weights(dest)


def service_of(proc: psutil.Process) -> str | None:
    """The service a process belongs to: the nearest `services.cli <service>` among it and its parents."""
    for p in [proc, *proc.parents()]:
        cmd = p.cmdline()
        for i, word in enumerate(cmd[:-1]):
            if word == "services.cli" and cmd[i + 1] in SERVICES:
                return cmd[i + 1]
    return None


class RssSampler(threading.Thread):
    """Samples every process under `root`: per process its VmHWM, per service the peak summed RSS."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.hwm: dict[int, tuple[str, str, int]] = {}  # pid: service, command, VmHWM bytes
        self.sum_peak = dict.fromkeys(SERVICES, 0)
        self.min_available = psutil.virtual_memory().available
        self.trainer_rss: dict[int, list[tuple[float, int]]] = {}  # pid: (wall clock, RSS bytes) samples
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            try:
                procs = psutil.Process(self.root).children(recursive=True)
            except psutil.NoSuchProcess:
                return
            sums = dict.fromkeys(SERVICES, 0)
            for proc in procs:
                try:
                    service = service_of(proc)
                    if service is None:
                        continue
                    with open(f"/proc/{proc.pid}/status") as f:
                        fields = dict(line.split(":", 1) for line in f if ":" in line)
                    hwm = int(fields["VmHWM"].split()[0]) * 1024
                    rss = int(fields["VmRSS"].split()[0]) * 1024
                    sums[service] += rss
                    if service == "trainer":
                        self.trainer_rss.setdefault(proc.pid, []).append((time.time(), rss))
                    cmd = " ".join(proc.cmdline())[:160]
                    self.hwm[proc.pid] = (service, cmd, max(hwm, self.hwm.get(proc.pid, ("", "", 0))[2]))
                except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError, KeyError):
                    continue
            for service, total in sums.items():
                self.sum_peak[service] = max(self.sum_peak[service], total)
            self.min_available = min(self.min_available, psutil.virtual_memory().available)

    def figures(self) -> dict:
        out = {}
        for service in SERVICES:
            mine = [(cmd, hwm) for s, cmd, hwm in self.hwm.values() if s == service]
            top = max(mine, key=lambda m: m[1], default=("", 0))
            out[service] = {
                "peak_rss_sum_gb": self.sum_peak[service] / 1e9,
                "max_process_hwm_gb": top[1] / 1e9,
                "max_process": top[0],
                "processes": len(mine),
                "process_hwm_gb": {cmd: round(hwm / 1e9, 3) for cmd, hwm in sorted(mine, key=lambda m: m[1])},
            }
        return out


def rank0_timeline(sampler: RssSampler, rundir: RunDir) -> dict:
    """When the trainer's largest process peaked, and in which phase of which step (from each
    trainer row: it is written after the step's publish, so train runs from `time - publish_s -
    train_s`); its RSS when the first step began, and at its peak."""
    pid, samples = max(sampler.trainer_rss.items(), key=lambda kv: max(r for _, r in kv[1]))
    at, peak = max(samples, key=lambda s: s[1])
    phase = "start-up (before the first step)"
    first_train = None
    for row in rundir.metrics.rows("trainer"):
        publish_start = row["time"] - row["publish_s"]
        train_start = publish_start - row["train_s"]
        first_train = first_train or train_start
        if train_start <= at < publish_start:
            phase = f"train, step {row['step']}"
        elif publish_start <= at <= row["time"] + SAMPLE_S:
            phase = f"publish, step {row['step']}"
        elif at > row["time"] + SAMPLE_S:
            phase = f"after step {row['step']}"
    before = [r for t, r in samples if first_train is not None and t <= first_train]
    start = samples[0][0]
    steps = [
        {
            "step": r["step"],
            "train_from_s": r["time"] - r["publish_s"] - r["train_s"] - start,
            "ended_s": r["time"] - start,
        }
        for r in rundir.metrics.rows("trainer")
    ]
    return {
        "pid": pid,
        "timeline_gb": [(round(t - start, 1), round(r / 1e9, 2)) for t, r in samples],
        "steps": steps,
        "peak_gb": peak / 1e9,
        "peak_phase": phase,
        "rss_when_training_began_gb": before[-1] / 1e9 if before else None,
    }


def median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def phases(rundir: RunDir) -> dict:
    """Seconds per phase from the run's metrics rows."""
    created = rundir.read_run().created_at
    trainer = rundir.metrics.rows("trainer")
    orchestrator = rundir.metrics.rows("orchestrator")
    inference = rundir.metrics.rows("inference")
    loads = [r for r in inference if r["version"] > 0]
    served_at = {r["version"]: r["time"] for r in loads}
    hand_offs = [
        served_at[r["step"]] - (r["time"] - r["publish_s"]) for r in trainer if r["step"] in served_at
    ]
    out = {
        "vllm_start_s": inference[0]["time"] - created,
        "first_batch_s": orchestrator[0]["time"] - created if orchestrator else None,
        "generate_s": median(orchestrator, "generate_s"),
        "train_s": median(trainer, "train_s"),
        "forward_backward_s": median(trainer, "forward_backward_s"),
        "optimizer_s": median(trainer, "optimizer_s"),
        "publish_s": median(trainer, "publish_s"),
        "gather_s": median(trainer, "gather_s"),
        "write_s": median(trainer, "write_s"),
        "digest_s": median(trainer, "digest_s"),
        "load_s": median(loads, "load_s"),
        "hand_off_s": statistics.median(hand_offs) if hand_offs else None,
        "steps": [r["step"] for r in trainer],
        "served": [r["version"] for r in inference],
    }
    if out["hand_off_s"] and out["digest_s"] is not None:
        out["digest_share_of_hand_off"] = out["digest_s"] / out["hand_off_s"]
    return out


def one_run(workdir: Path, model: str, env: dict[str, str], extra: list[str]) -> dict:
    from shared.net import free_port
    from tests.realsize import CPU_OVERRIDES

    run_dir = workdir / "run"
    shutil.rmtree(run_dir, ignore_errors=True)
    sets = [f"model={model}", f"run_dir={run_dir}", f"inference.port={free_port()}", *CPU_OVERRIDES, *extra]
    cmd = [sys.executable, "-m", "services.cli", "up", "-c", str(CONFIG), *[f"--set={s}" for s in sets]]
    load_before = psutil.getloadavg()
    started = time.time()
    with open(workdir / "up.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=workdir, env={**os.environ, **env}, stdout=log, stderr=log)
        sampler = RssSampler(proc.pid)
        sampler.start()
        try:
            code = proc.wait(timeout=RUN_TIMEOUT_S)
        finally:
            sampler.stop.set()
            sampler.join()
    if code != 0:
        tail = (workdir / "up.log").read_text()[-3000:]
        raise SystemExit(f"triad up on {model} exited {code}; its log ends:\n{tail}")
    return {
        "wall_s": time.time() - started,
        "load_avg_before": load_before,
        "load_avg_after": psutil.getloadavg(),
        "min_available_gb": sampler.min_available / 1e9,
        "phases": phases(RunDir(str(run_dir))),
        "rss": sampler.figures(),
        "trainer_peak": rank0_timeline(sampler, RunDir(str(run_dir))),
    }


def run_size(workdir: Path, size: str, extra: list[str]) -> dict:
    from tests.realsize import REPO_ID, ensure_realsize_model, parameter_count, realsize_env

    workdir.mkdir(parents=True, exist_ok=True)
    if size == "0.6B":
        snapshot = ensure_realsize_model()
        result = one_run(workdir, REPO_ID, realsize_env(), extra)
    else:
        snapshot = workdir / "model"
        build_small(snapshot)
        result = one_run(workdir, str(snapshot), {"HF_HUB_OFFLINE": "1"}, extra)
    params = parameter_count(snapshot)
    reference = TRAINER_BYTES_PER_PARAMETER * params
    trainer_peak = result["rss"]["trainer"]["max_process_hwm_gb"] * 1e9
    return {
        "parameters": params,
        "model_bytes_bf16": 2 * params,
        "trainer_reference_gb": reference / 1e9,
        "trainer_peak_over_reference": trainer_peak / reference,
        **result,
    }


def ratios(big: dict, small: dict) -> dict:
    out = {"parameters": big["parameters"] / small["parameters"]}
    for key, value in big["phases"].items():
        other = small["phases"].get(key)
        if isinstance(value, float) and other:
            out[key] = value / other
    for service in SERVICES:
        other = small["rss"][service]["peak_rss_sum_gb"]
        if other:
            out[f"rss_{service}"] = big["rss"][service]["peak_rss_sum_gb"] / other
    return out


def markdown(result: dict) -> str:
    sizes = list(result["results"])
    head = ["figure", *sizes]
    if "ratio" in result:
        head.append("ratio")
    lines = [
        "# Real size: Qwen3-0.6B against 50M (bench/real_size.py)",
        "",
        f"{result['date']}, `{result['command']}`, {result['machine']}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + " --- |" * len(head),
    ]

    def row(name: str, values: list, ratio: float | None, fmt: str) -> None:
        cells = [fmt.format(v) if isinstance(v, float | int) else "-" for v in values]
        if "ratio" in result:
            cells.append(f"{ratio:.1f}x" if ratio else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    ratio = result.get("ratio", {})
    res = result["results"]
    row("parameters (M)", [res[s]["parameters"] / 1e6 for s in sizes], ratio.get("parameters"), "{:.1f}")
    row(
        "trainer rank 0 VmHWM / (bf16 model + fp32 weights, grads, AdamW), goal <= 1.3",
        [res[s]["trainer_peak_over_reference"] for s in sizes],
        None,
        "{:.2f}",
    )
    peaks = [res[s].get("trainer_peak") for s in sizes]
    if all(peaks):
        lines.append(
            "| trainer's largest process: RSS when training began; highest RSS sampled, and its phase | "
            + " | ".join(
                f"{p['rss_when_training_began_gb'] or 0:.2f} GB; {p['peak_gb']:.2f} GB in {p['peak_phase']}"
                for p in peaks
            )
            + (" | - |" if "ratio" in result else " |")
        )
    row("wall, triad up, 2 steps (s)", [res[s]["wall_s"] for s in sizes], None, "{:.0f}")
    for key in res[sizes[0]]["phases"]:
        values = [res[s]["phases"].get(key) for s in sizes]
        if any(isinstance(v, float) for v in values):
            row(key, values, ratio.get(key), "{:.2f}")
    for service in SERVICES:
        values = [res[s]["rss"][service]["peak_rss_sum_gb"] for s in sizes]
        row(f"peak RSS {service}, all its processes (GB)", values, ratio.get(f"rss_{service}"), "{:.2f}")
        values = [res[s]["rss"][service]["max_process_hwm_gb"] for s in sizes]
        row(f"peak RSS {service}, largest process VmHWM (GB)", values, None, "{:.2f}")
        if all("process_hwm_gb" in res[s]["rss"][service] for s in sizes):
            cells = [
                "; ".join(
                    f"`{cmd[:48]}` {gb:.2f}" for cmd, gb in res[s]["rss"][service]["process_hwm_gb"].items()
                )
                for s in sizes
            ]
            lines.append(
                f"| {service}: each process's VmHWM (GB) | "
                + " | ".join(cells)
                + (" | - |" if "ratio" in result else " |")
            )
    loads = ", ".join(
        f"{s}: {res[s]['load_avg_before'][0]:.1f} -> {res[s]['load_avg_after'][0]:.1f}" for s in sizes
    )
    lines += ["", f"1-minute load average before -> after each run: {loads}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument("sizes", nargs="*", choices=("0.6B", "50M"), default=["0.6B", "50M"])
    parser.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--name", default="real_size", help="the results' file stem in bench/results")
    args = parser.parse_args()
    results = {size: run_size(args.workdir / size, size, args.sets) for size in args.sizes}
    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python -m bench.real_size " + " ".join(sys.argv[1:]),
        "machine": f"{psutil.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB, CPU only",
        "config": str(CONFIG.relative_to(REPO)),
        "sets": args.sets,
        "results": results,
    }
    if {"0.6B", "50M"} <= set(results):
        result["ratio"] = ratios(results["0.6B"], results["50M"])
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    (RESULTS / f"{args.name}.md").write_text(markdown(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
