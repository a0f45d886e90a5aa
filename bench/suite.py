"""triad's benchmarks: each figure is a ratio measured in one run, against a goal.

    bench/run [--steps 60] [--skip-transport] [--skip-peer]
    bench/run --only trainer        (one figure again; the rest kept from suite.json)

Writes bench/results/suite.json and suite.md (this suite's table); `bench/run` then runs
`bench/summary.py`, which writes latest.md (the newest figure of every bench).

1. asynchrony: samples/s at max_async_level 1 and 2 against 0, and against the
   ideal overlap bound (T_gen + T_train) / max(T_gen, T_train) from the
   synchronous run's own phase times.
2. weight hand-off: trainer publishing version V -> inference serving V, against
   writing and reading the same safetensors bytes on the same disk.
3. trainer throughput: tokens/s of the 1-rank torchrun trainer against a plain
   single-process PyTorch loop on the same model and batches.
4. orchestrator overhead: rollouts/s, CPU time per rollout and event-loop lag
   against a zero-latency fake OpenAI server (`bench/orchestrator_overhead.py`).
5. weight transport: hand-off by broadcast against by files for models of about
   5M, 50M and 200M parameters (`bench/weight_transport.py`).
   Also the weight digests' share of those hand-offs at 5M and 50M (`--only digest`
   measures just these).
6. adapter hand-off: a LoRA adapter against full weights for the 5M and 50M models
   (`bench/adapter_handoff.py`).
7. LoRA sharing: samples/s of one LoRA run alone on a server against two runs sharing it
   (`bench/lora_sharing.py`).
   Delta versions against full snapshots through an object store: bytes per version and
   hand-off at 5M, 50M and 200M (`bench/weight_deltas.py`; `--only weight_deltas`).
8. a peer: TRL's GRPOTrainer on the same model, task and batch shape, in its own
   virtual environment (`bench/trl_compare.py`).
Median over steps after a warm-up; spread as the interquartile range.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from bench.weight_transport import DIGEST_SIZES, digest_figures
from shared.rundir import INFERENCE, ORCHESTRATOR, TRAINER, RunDir

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
WARMUP_STEPS = 5


def spread(values: list[float]) -> dict[str, float]:
    """The median of a few rounds and their range, as bench.quick and bench.first_up report them."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def write_rounds(out: Path, name: str, summary: dict, markdown: str) -> None:
    """A rounds bench's summary as `out/NAME.json` and its page as `out/NAME.md`, the page printed."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1))
    (out / f"{name}.md").write_text(markdown)
    print(markdown)


def quartiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": statistics.median(values), "q1": q[0], "q3": q[2], "n": len(values)}


def short_commit(rev: str = "HEAD") -> str:
    """`rev` as its short hash, so a result names the code it ran (`HEAD` moves on)."""
    done = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{rev}: git rev-parse failed in {REPO} ({why}); run the bench from a git checkout")
    return done.stdout.strip()


def extract_commit(commit: str, dest: Path) -> Path:
    """The code of `commit` (`git archive`) in `dest`, to run with this checkout's environment."""
    archive = dest.with_suffix(".tar")
    with open(archive, "wb") as f:
        done = subprocess.run(
            ["git", "archive", commit], cwd=REPO, stdout=f, stderr=subprocess.PIPE, text=True
        )
    if done.returncode:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"{commit}: git archive failed in {REPO} ({why}); name a commit of this repository")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest


def triad_up(run_dir: Path, eta: int, steps: int, code: Path = REPO) -> float:
    """Run `triad up` to the end with the code in `code` (this checkout, or a commit's
    `extract_commit`): its services are started from there and import it first; returns the wall
    time it was launched at."""
    sets = [
        f"run_dir={run_dir}",
        f"max_steps={steps}",
        f"max_async_level={eta}",
        f"weights.keep={eta + 3}",
        "trainer.checkpoint.every=0",  # the embedded default's placement (inference.cpus = "auto")
        "inference.port=8417",
    ]
    cmd = [sys.executable, "-m", "services.cli", "up", *[f"--set={s}" for s in sets]]
    launched = time.time()
    subprocess.run(cmd, cwd=code, check=True, stdout=subprocess.DEVNULL)
    return launched


def startup(run_dir: Path, launched: float) -> dict[str, float]:
    """Seconds from launching `triad up` to the server's first row, the first batch and the
    first trained step (from each service's metrics)."""
    rundir = RunDir(run_dir)

    def first(service: str) -> float:
        return rundir.metrics.rows(service)[0]["time"] - launched

    return {
        "server_ready_s": first(INFERENCE),
        "first_batch_s": first(ORCHESTRATOR),
        "first_step_s": first(TRAINER),
    }


def steady(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows[WARMUP_STEPS:]]


def run_asynchrony(workdir: Path, steps: int) -> tuple[dict, dict[int, Path]]:
    runs, rates, starts = {}, {}, []
    for eta in (0, 1, 2):
        run_dir = workdir / f"eta{eta}"
        starts.append(startup(run_dir, triad_up(run_dir, eta, steps)))
        runs[eta] = run_dir
        rows = RunDir(run_dir).metrics.rows(ORCHESTRATOR)
        span = rows[-1]["time"] - rows[WARMUP_STEPS]["time"]
        rates[eta] = sum(r["samples"] for r in rows[WARMUP_STEPS + 1 :]) / span
    trainer = RunDir(runs[0]).metrics.rows(TRAINER)
    t_train = statistics.median(steady(trainer, "train_s")) + statistics.median(steady(trainer, "publish_s"))
    cycle = statistics.median(steady(RunDir(runs[0]).metrics.rows(ORCHESTRATOR), "step_time_s"))
    t_gen = max(cycle - t_train, 1e-9)
    bound = (t_gen + t_train) / max(t_gen, t_train)
    figure = {
        "samples_per_s": rates,
        "phase_s": {"generate": t_gen, "train_and_publish": t_train, "sync_cycle": cycle},
        "ideal_speedup": bound,
        "speedup_eta1": rates[1] / rates[0],
        "speedup_eta2": rates[2] / rates[0],
        "fraction_of_bound_eta1": (rates[1] / rates[0]) / bound,
        "startup_s": {key: statistics.median(s[key] for s in starts) for key in starts[0]},
        "phases_eta1_s": phase_means(runs[1]),
        "goal": "eta=1 reaches >= 0.8 of the ideal overlap bound",
    }
    return figure, runs


def phase_means(run_dir: Path) -> dict[str, dict[str, float]]:
    """Median seconds per step of each service's phases after warm-up (`services/timeline.py`)."""
    from services.timeline import ORCHESTRATOR_FINE, TRAINER_FINE

    out = {}
    for service, phases in ((TRAINER, TRAINER_FINE), (ORCHESTRATOR, ORCHESTRATOR_FINE)):
        rows = RunDir(run_dir).metrics.rows(service)[WARMUP_STEPS:]
        out[service] = {p: statistics.median(r[p] for r in rows) for p in phases if all(p in r for r in rows)}
    return out


def run_asynchrony_and_handoff(workdir: Path, steps: int) -> dict:
    asynchrony, runs = run_asynchrony(workdir, steps)
    return {"asynchrony": asynchrony, "handoff": run_handoff(runs[1])}


def run_handoff(run_dir: Path) -> dict:
    rundir = RunDir(run_dir)
    published = {r["step"]: r["time"] for r in rundir.metrics.rows(TRAINER)}
    served = {r["version"]: r["time"] for r in rundir.metrics.rows(INFERENCE)}
    latencies = [served[v] - published[v] for v in sorted(published) if v in served and v > WARMUP_STEPS]
    weights = next(f for f in map(rundir.weights_file, rundir.weights.steps()) if f.is_file())
    raw = raw_io_seconds(weights.read_bytes())
    handoff = quartiles(latencies)
    return {
        "handoff_s": handoff,
        "raw_write_read_s": raw,
        "bytes": weights.stat().st_size,
        "ratio_to_raw_plus_100ms": handoff["median"] / (1.5 * raw + 0.1),
        "goal": "hand-off <= 3 x raw + 10 ms (issue 23)",
        "note": "publish is timed from the trainer's metrics row "
        f"(written right after {RunDir.marker_name()})",
    }


def handoff_goal(h: dict) -> float:
    """The hand-off as a fraction of issue 23's goal, 3x the raw write and read + 10 ms."""
    return h["handoff_s"]["median"] / (3 * h["raw_write_read_s"] + 0.01)


def raw_io_seconds(data: bytes, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        with tempfile.NamedTemporaryFile(dir=REPO / "bench" / "results", delete=True) as f:
            start = time.perf_counter()
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)
            f.read()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_module(module: str, *args: str) -> dict:
    """Run `python -m module ARGS`, which prints its figure as the last line of JSON."""
    out = subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"python -m {module} failed with code {out.returncode}:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_trainer_throughput(workdir: Path) -> dict:
    return run_module("bench.trainer_throughput", str(workdir / "trainer"))


Row = tuple[str, str, str, str]  # figure, measured, reference, ratio / goal


def core_rows(results: dict) -> list[tuple[str, Row]]:
    """The asynchrony, hand-off and trainer rows, each with the figure (`--only` name) that measured it."""
    a, h, t = results["asynchrony"], results["handoff"], results["trainer"]
    rows: list[tuple[str, Row]] = [
        (
            "asynchrony",
            (
                "asynchrony: samples/s eta=1 / eta=0",
                f"{a['speedup_eta1']:.2f}x",
                f"bound {a['ideal_speedup']:.2f}x",
                f"{a['fraction_of_bound_eta1']:.2f} of bound (goal >= 0.8)",
            ),
        ),
        (
            "asynchrony",
            (
                "asynchrony: samples/s eta=2 / eta=0",
                f"{a['speedup_eta2']:.2f}x",
                f"bound {a['ideal_speedup']:.2f}x",
                "-",
            ),
        ),
        (
            "asynchrony",
            (
                "weight hand-off (median)",
                f"{h['handoff_s']['median'] * 1000:.0f} ms",
                f"raw {h['raw_write_read_s'] * 1000:.1f} ms",
                f"{h['handoff_s']['median'] / h['raw_write_read_s']:.0f}x raw; {handoff_goal(h):.2f} of "
                "3x raw + 10 ms (goal <= 1)",
            ),
        ),
        (
            "trainer",
            (
                "trainer tokens/s, 1 rank / plain loop, tiny (0.5M)",
                f"{t['trainer_tokens_per_s']:.0f}/s ({t['ratio']:.2f}x)",
                f"plain {t['plain_tokens_per_s']:.0f}/s; trainer with glibc's default malloc "
                f"{t['trainer_default_malloc_tokens_per_s']:.0f}/s",
                "goal >= 0.9",
            ),
        ),
    ]
    if "5M" in t:
        rows.append(
            (
                "trainer",
                (
                    f"trainer tokens/s, 1 rank / plain loop, {t['5M']['parameters'] / 1e6:.0f}M parameters",
                    f"{t['5M']['trainer_tokens_per_s']:.0f}/s ({t['5M']['ratio']:.2f}x)",
                    f"plain {t['5M']['plain_tokens_per_s']:.0f}/s",
                    "goal >= 0.9",
                ),
            )
        )
    if "trainer_compiled_tokens_per_s" in t:
        rows.append(
            (
                "trainer",
                (
                    "trainer with torch.compile, tiny (0.5M), after warm-up",
                    f"{t['trainer_compiled_tokens_per_s']:.0f}/s",
                    f"eager trainer {t['trainer_tokens_per_s']:.0f}/s",
                    f"{t['trainer_compiled_tokens_per_s'] / t['trainer_tokens_per_s']:.2f}x",
                ),
            )
        )
    return rows


def orchestrator_rows(results: dict) -> list[Row]:
    o = results.get("orchestrator")
    if not o:
        return []
    loaded = o["at_1000_per_s"]
    return [
        (
            "orchestrator: rollouts/s against a zero-latency server",
            f"{o['rollouts_per_s']:.0f}/s, {o['cpu_ms_per_rollout']:.2f} ms CPU each",
            f"loop lag p99 {o['loop_lag_ms']['p99']:.0f} ms (saturated)",
            f"{o['rollouts_per_s'] / 1000:.2f} of 1000/s (goal >= 1)",
        ),
        (
            "orchestrator: event-loop lag at ~1000 rollouts/s offered",
            f"p99 {loaded['loop_lag_ms']['p99']:.1f} ms (median {loaded['loop_lag_ms']['median']:.1f})",
            f"{loaded['rollouts_per_s']:.0f} rollouts/s",
            "goal: p99 < 50 ms",
        ),
    ]


def trl_rows(results: dict) -> list[Row]:
    trl, rows = results.get("trl", {}), []
    for name in ("tiny (0.5M)", "50M"):
        if name not in trl:
            continue
        r = trl[name]
        rows.append(
            (
                f"vs TRL GRPOTrainer, {name} model: samples/s",
                f"triad {r['triad']['samples_per_s']:.1f}/s",
                f"TRL {r['trl']['samples_per_s']:.1f}/s",
                f"{r['samples_per_s_ratio']:.1f}x (goal > 1)",
            )
        )
        if name.startswith("tiny"):
            fmt = lambda s: "not reached" if s is None else f"{s:.0f} s"  # noqa: E731
            rows.append(
                (
                    f"vs TRL, {name}: wall time to mean reward {trl['threshold']} (from launch)",
                    f"triad {fmt(r['triad']['to_threshold_s'])}",
                    f"TRL {fmt(r['trl']['to_threshold_s'])}",
                    "goal: triad faster",
                )
            )
    return rows


def transport_rows(results: dict) -> list[Row]:
    return [
        (
            f"hand-off by broadcast vs files, {size} ({w['parameters'] / 1e6:.0f}M params)",
            f"{w['broadcast_s'] * 1000:.0f} ms",
            f"files {w['filesystem_s'] * 1000:.0f} ms",
            f"{w['speedup']:.2f}x faster",
        )
        for size, w in results.get("weight_transport", {}).items()
    ]


def launch_rows(results: dict) -> list[Row]:
    s = results["asynchrony"].get("startup_s")
    if not s:
        return []
    return [
        (
            "launch (`triad up`) to first trained step (median of 3 runs)",
            f"{s['first_step_s']:.1f} s",
            f"server ready {s['server_ready_s']:.1f} s, first batch {s['first_batch_s']:.1f} s",
            "goal: halved",
        )
    ]


def figure_rows(results: dict) -> list[tuple[str, Row]]:
    """Every row of the suite's table, each with the figure (`--only` name) that measured it."""
    tagged = [
        ("orchestrator", orchestrator_rows),
        ("trl", trl_rows),
        ("weight_transport", transport_rows),
        ("digest", digest_rows),
        ("lora_sharing", sharing_rows),
        ("adapter_handoff", adapter_rows),
        ("floor", floor_rows),
        ("asynchrony", launch_rows),
        ("inference_start", start_rows),
        ("object_store", store_rows),
        ("weight_deltas", delta_rows),
    ]
    return core_rows(results) + [(figure, row) for figure, rows in tagged for row in rows(results)]


def measured_at(results: dict, figure: str) -> str:
    """When `figure` was last measured: the suite's date unless it was measured again alone."""
    return results.get("remeasured", {}).get(figure, results["date"])


def markdown(results: dict) -> str:
    lines = ["| figure | measured | reference | ratio / goal |", "| --- | --- | --- | --- |"]
    lines += [f"| {' | '.join(row)} |" for _, row in figure_rows(results)]
    again = "".join(
        f"; {name} figures re-measured {date}" for name, date in results.get("remeasured", {}).items()
    )
    return f"Benchmarks ({results['machine']}, {results['date']}{again})\n\n" + "\n".join(lines) + "\n"


def digest_rows(results: dict) -> list[Row]:
    """The weight digests' share of the hand-off (`bench/weight_transport.py`)."""
    d = results.get("digest", {})
    rows = []
    for size in [s for s in d if s != "goal"]:
        w, cells = d[size], []
        for transport, label in (("filesystem", "files"), ("broadcast", "broadcast")):
            digest_ms = (w[f"{transport}_trainer_digest_s"] + w["inference_digest_s"]) * 1000
            cells.append(
                f"{label} {w[f'{transport}_digest_frac'] * 100:.1f}% "
                f"({digest_ms:.1f} of {w[f'{transport}_s'] * 1000:.0f} ms)"
            )
        rows.append(
            (
                f"weight digests (trainer + inference) in the hand-off, {size}",
                cells[0],
                cells[1],
                "goal < 5% of the hand-off",
            )
        )
    return rows


def sharing_rows(results: dict) -> list[Row]:
    """LoRA runs sharing one server (`bench/lora_sharing.py`)."""
    s = results.get("lora_sharing")
    if not s:
        return []
    a, b = s["sharing_samples_per_s"]["a"], s["sharing_samples_per_s"]["b"]
    rows = [
        (
            "LoRA runs sharing one server: samples/s of two runs vs one alone (tiny, rank 8)",
            f"{a:.1f} + {b:.1f} = {s['together_samples_per_s']:.1f}/s",
            f"alone {s['alone_samples_per_s']:.1f}/s",
            f"{s['together_over_alone']:.2f}x together",
        )
    ]
    if "adapter_load_s_shared" in s:  # results written before the load times were measured lack it
        shared, alone = s["adapter_load_s_shared"], s["adapter_load_s_alone"]
        rows.append(
            (
                "LoRA runs sharing one server: an adapter version's load (median, largest)",
                f"{shared['median']:.2f} s, {shared['max']:.2f} s shared",
                f"{alone['median']:.2f} s, {alone['max']:.2f} s alone",
                "",
            )
        )
    return rows


def adapter_rows(results: dict) -> list[Row]:
    """A LoRA adapter's hand-off against full weights (`bench/adapter_handoff.py`)."""
    return [
        (
            f"hand-off of a LoRA adapter ({r['lora']}) vs full weights, {size}",
            f"{r['adapter_s'] * 1000:.0f} ms ({r['adapter_bytes'] / 1e3:.0f} kB)",
            f"full {r['full_s'] * 1000:.0f} ms ({r['full_bytes'] / 1e6:.0f} MB)",
            f"{r['speedup']:.2f}x faster",
        )
        for size, r in results.get("adapter_handoff", {}).items()
    ]


def floor_rows(results: dict) -> list[Row]:
    """triad's steady-state step at eta=1 against the same step done in one process."""
    f = results.get("floor")
    if not f:
        return []
    rates = {str(eta): rate for eta, rate in results["asynchrony"]["samples_per_s"].items()}
    triad_step_s = f["samples_per_step"] / rates["1"]
    return [
        (
            "embedded default: steady-state step time / compute floor",
            f"triad {triad_step_s * 1000:.0f} ms (eta=1)",
            f"floor {f['step_s'] * 1000:.0f} ms (sampling {f['sample_s'] * 1000:.0f}, training "
            f"{f['train_s'] * 1000:.0f})",
            f"{triad_step_s / f['step_s']:.1f}x (goal <= 1.5)",
        )
    ]


def start_rows(results: dict) -> list[Row]:
    """Launch to the first trained step, and vLLM's own start (`bench/inference_start.py`)."""
    r = results.get("inference_start")
    if not r:
        return []
    launch, vllm, compiled = r["launch"], r["vllm"], r["vllm_compiled"]
    return [
        (
            "launch (`triad up`, embedded default) to first trained step (one run)",
            f"{launch['first_step_s']:.1f} s",
            f"server ready {launch['server_ready_s']:.1f} s, first batch {launch['first_batch_s']:.1f} s",
            "goal: halved",
        ),
        (
            "vLLM start alone (`triad inference` to /health), as configured (eager on CPU) vs compiled",
            f"{vllm['ready_s']:.1f} s (batch {vllm['batch_s'] * 1000:.0f} ms)",
            f"compiled {compiled['ready_s']:.1f} s (batch {compiled['batch_s'] * 1000:.0f} ms)",
            f"compiled batches {r['compiled_batch_ratio']:.2f}x the time",
        ),
    ]


def store_rows(results: dict) -> list[Row]:
    """The object-store run directory against a local one (`bench/object_store.py`)."""
    r = results.get("object_store")
    if not r:
        return []
    rows = [
        (
            "orchestrator rollouts/s, run_dir in an object store (moto) vs local",
            f"{r['rollouts_per_s']['store']:.0f}/s",
            f"local {r['rollouts_per_s']['local']:.0f}/s",
            f"{r['rollouts_per_s']['store_over_local']:.2f}x",
        )
    ]
    for size in ("5M", "50M"):
        h = r.get(f"hand_off_{size}")
        if h:
            rows.append(
                (
                    f"hand-off through the object store vs a local run_dir, {size}",
                    f"{h['store_s'] * 1000:.0f} ms",
                    f"local {h['local_s'] * 1000:.0f} ms",
                    f"{h['store_over_local']:.2f}x the time",
                )
            )
    return rows


def delta_rows(results: dict) -> list[Row]:
    """Delta versions against full snapshots through the object store (`bench/weight_deltas.py`)."""
    r = results.get("weight_deltas") or {}
    rows = []
    for size in ("5M", "50M", "200M"):
        d = r.get(size)
        if d and "delta_bytes" in d:
            goal = "; goal: >= 10x, < 7 s" if size == "50M" else ""
            rows.append(
                (
                    f"delta vs full versions through the object store, {size} bf16 (bytes; hand-off)",
                    f"{d['delta_bytes'] / 1e6:.2f} MB; {d['delta_hand_off_s']:.2f} s",
                    f"full {d['full_bytes'] / 1e6:.1f} MB; {d['full_hand_off_s']:.2f} s",
                    f"{d['bytes_full_over_delta']:.1f}x fewer bytes, "
                    f"{d['hand_off_full_over_delta']:.1f}x faster{goal}",
                )
            )
    return rows


SEPARATE = {  # figures that can be re-measured alone (--only), each from its own script
    "trainer": run_trainer_throughput,
    "orchestrator": lambda workdir: run_module("bench.orchestrator_overhead"),
    "weight_transport": lambda workdir: run_module("bench.weight_transport", str(workdir / "transport")),
    "digest": lambda workdir: digest_figures(
        run_module("bench.weight_transport", str(workdir / "digest"), *DIGEST_SIZES)
    ),
    "trl": lambda workdir: run_module("bench.trl_compare", str(workdir / "peer")),
    "floor": lambda workdir: run_module("bench.floor"),
    "object_store": lambda workdir: run_module("bench.object_store", str(workdir / "store")),
    "adapter_handoff": lambda workdir: run_module("bench.adapter_handoff", str(workdir / "adapter")),
    "inference_start": lambda workdir: run_module("bench.inference_start", str(workdir / "start")),
    "lora_sharing": lambda workdir: run_module("bench.lora_sharing", str(workdir / "lora-sharing")),
    "weight_deltas": lambda workdir: run_module("bench.weight_deltas", str(workdir / "deltas")),
}
TOGETHER = {"asynchrony": run_asynchrony_and_handoff}  # figures measured together (asynchrony + hand-off)


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}"


def measure_all(workdir: Path, args: argparse.Namespace) -> dict:
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "steps": args.steps,
        **run_asynchrony_and_handoff(workdir, args.steps),
        "trainer": run_trainer_throughput(workdir),
        "orchestrator": SEPARATE["orchestrator"](workdir),
        "floor": SEPARATE["floor"](workdir),
        "inference_start": SEPARATE["inference_start"](workdir),
    }
    if not args.skip_transport:
        results["weight_transport"] = SEPARATE["weight_transport"](workdir)
        results["digest"] = digest_figures(results["weight_transport"])
        results["object_store"] = SEPARATE["object_store"](workdir)
        results["adapter_handoff"] = SEPARATE["adapter_handoff"](workdir)
        results["lora_sharing"] = SEPARATE["lora_sharing"](workdir)
        results["weight_deltas"] = SEPARATE["weight_deltas"](workdir)
    if not args.skip_peer:
        results["trl"] = SEPARATE["trl"](workdir)
    return results


def remeasure(workdir: Path, figures: list[str], steps: int) -> dict:
    """The latest results with some figures measured again, one after the other in this run
    (on the same kind of machine)."""
    results = json.loads((RESULTS / "suite.json").read_text())
    if results["machine"] != machine():
        raise SystemExit(f"suite.json is from {results['machine']}, not {machine()}: run the whole suite")
    for figure in figures:
        if figure in TOGETHER:
            results.update(TOGETHER[figure](workdir, steps))
        else:
            results[figure] = SEPARATE[figure](workdir)
        results.setdefault("remeasured", {})[figure] = time.strftime("%Y-%m-%d %H:%M")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--skip-transport", action="store_true", help="skip broadcast vs files (slow)")
    parser.add_argument("--skip-peer", action="store_true", help="skip the TRL comparison (slow)")
    parser.add_argument(
        "--only", nargs="+", choices=sorted([*SEPARATE, *TOGETHER]), help="measure these figures again"
    )
    args = parser.parse_args()
    random.seed(0)
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="triad-bench-") as tmp:
        workdir = Path(tmp)
        results = remeasure(workdir, args.only, args.steps) if args.only else measure_all(workdir, args)
    (RESULTS / "suite.json").write_text(json.dumps(results, indent=1))
    (RESULTS / "suite.md").write_text(markdown(results))
    print(markdown(results))
    print(f"then `python -m bench.summary` (bench/run runs it) writes {RESULTS / 'latest.md'}")


if __name__ == "__main__":
    main()
