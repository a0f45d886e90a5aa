"""bench/results/latest.md: the newest figure of every bench, each with its date and command.

    python -m bench.summary      (bench/run runs it after the suite; run it after any bench alone)

Every result file `bench/results/NAME.json` has a reader here that gives its figures, when they
were measured and the command that measured them. A result file without a reader is an error,
so a new bench cannot be left out of the page (a unit test checks that every file's newest
figure appears in it). History is not current: the rounds that docs/simulate.md cites
(`*_roundN.*`) and the predictions the simulator's measured rounds were checked against
(`simulate_prediction*.json`) stay as files and are left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

from bench.quick import COMPARED
from bench.suite import RESULTS, Row, figure_rows, measured_at

HISTORY = re.compile(r"(_round\d+|^simulate_prediction.*)\.json$")
SUITE = "suite.json"
Entry = tuple[Row, str, str]  # the row, when measured, the command


def suite_entries(r: dict) -> list[Entry]:
    def command(figure: str) -> str:
        return f"bench/run --only {figure}" if figure in r.get("remeasured", {}) else "bench/run"

    return [(row, measured_at(r, figure), command(figure)) for figure, row in figure_rows(r)]


def quick_entries(r: dict) -> list[Entry]:
    sof, hog = r["step_over_floor"], r["handoff_over_goal"]
    step, floor = r["step_s"], r["floor_step_s"]
    return [
        (
            (
                "embedded default: steady step / compute floor, same run (bench.quick)",
                f"{step['median'] * 1e3:.0f} ms",
                f"floor {floor['median'] * 1e3:.0f} ms",
                f"{sof['median']:.2f}x (spread {sof['min']:.2f}-{sof['max']:.2f}; goal <= 1.5)",
            ),
            r["date"],
            r["command"],
        ),
        (
            (
                "weight hand-off / (3 x raw + 10 ms), same run (bench.quick)",
                f"{r['handoff_s']['median'] * 1e3:.0f} ms",
                "3 x raw write and read + 10 ms",
                f"{hog['median']:.2f} (spread {hog['min']:.2f}-{hog['max']:.2f}; goal <= 1)",
            ),
            r["date"],
            r["command"],
        ),
    ]


def delta_publish_entries(r: dict) -> list[Entry]:
    after, before = r["after"], r["before"]
    row = (
        f"delta publish and apply offline, {r['size']} (bench.delta_publish)",
        f"publish {after['publish_s']:.2f} s, apply {after['apply_s']:.2f} s",
        f"commit {r['base']}: publish {before['publish_s']:.2f} s, apply {before['apply_s']:.2f} s",
        f"{r['publish_after_over_before']:.2f}x / {r['apply_after_over_before']:.2f}x the time",
    )
    return [(row, r["date"], "python -m bench.delta_publish WORKDIR")]


def weight_deltas_entries(r: dict) -> list[Entry]:
    rows = []
    for size, d in r["results"].items():
        if "delta_bytes" not in d:
            continue
        row = (
            f"delta vs full versions through moto, {size} bf16, {d['versions']} versions",
            f"{d['delta_bytes'] / 1e6:.2f} MB; {d['delta_hand_off_s']:.2f} s",
            f"full {d['full_bytes'] / 1e6:.1f} MB; {d['full_hand_off_s']:.2f} s",
            f"{d['bytes_full_over_delta']:.1f}x fewer bytes, {d['hand_off_full_over_delta']:.1f}x faster",
        )
        rows.append((row, r["date"], r["command"]))
    return rows


def stock_servers_entries(r: dict) -> list[Entry]:
    triad, vllm = r["servers"]["triad"], r["servers"]["vllm"]
    row = (
        "stock vLLM's RL routes vs triad's launcher: hand-off; samples/s (bench.stock_servers)",
        f"{vllm['handoff_ms']:.1f} ms; {vllm['samples_per_s']:.1f}/s",
        f"triad {triad['handoff_ms']:.1f} ms; {triad['samples_per_s']:.1f}/s",
        f"{vllm['handoff_ms'] / triad['handoff_ms']:.2f}x the hand-off, "
        f"{vllm['samples_per_s'] / triad['samples_per_s']:.2f}x the samples/s",
    )
    return [(row, r["date"], "python -m bench.stock_servers WORKDIR")]


def simulate_measured_entries(r: dict) -> list[Entry]:
    ratios = ", ".join(f"η {row['eta']} {row['ratio']:.2f}" for row in r["rows"])
    row = ("simulate: predicted / measured samples/s here (bench.simulate_measured)", ratios, "1.00", "-")
    return [(row, r["measured_at"][:16].replace("T", " "), "python -m bench.simulate_measured compare ...")]


def simulate_published_entries(r: dict) -> list[Entry]:
    counts = r["counts"]
    held, absolute, ratio = (counts[f"held out 4, {kind}"] for kind in ("all", "absolute", "ratio"))
    seen = "; ".join(
        f"{name}: {counts[key][0]} of {counts[key][1]}"
        for name, key in (
            ("set 3, seen", "held out 3 (seen), all"),
            ("set 2", "held out 2, all"),
            ("set 1, seen", "held out 1 (seen), all"),
            ("fitted on", "fitted on, all"),
        )
    )
    row = (
        "simulate: published figures within 15%, held out (bench.simulate_published)",
        f"{held[0]} of {held[1]} held out, set 4 (absolute {absolute[0]} of {absolute[1]}, "
        f"ratios {ratio[0]} of {ratio[1]})",
        seen,
        "goal: >= 6 held-out rows within 15%",
    )
    return [(row, r["made_at"][:16].replace("T", " "), "python -m bench.simulate_published")]


def simulate_rates_entries(r: dict) -> list[Entry]:
    gpu = r["fitted"]["gpu"]
    row = (
        "simulate: rates fitted to NeMo-RL v0.3 (bench.simulate_rates)",
        f"hbm_efficiency {gpu['hbm_efficiency']:.3f}, mfu {gpu['mfu']:.3f}",
        f"floors {r['hbm_efficiency_bound']:.3f} / {r['mfu_bound']:.3f}",
        "-",
    )
    return [(row, r["made_at"][:16].replace("T", " "), "python -m bench.simulate_rates")]


def simulate_speed_entries(r: dict) -> list[Entry]:
    row = (
        f"simulate: {r['gpus']} GPUs x {r['steps']} steps, CPU time (bench.simulate_speed)",
        f"{r['cpu_seconds']:.1f} s",
        "a minute",
        f"{r['cpu_seconds'] / 60:.2f} of the goal",
    )
    return [(row, r["made_at"][:16].replace("T", " "), "python -m bench.simulate_speed")]


def soak_entries(r: dict) -> list[Entry]:
    rows = []
    for run in r["results"]:
        injected = sum(run["proxy_faults"].get("injected", {}).values()) + sum(
            run["environment_faults"].values()
        )
        survived = run["trained_once"] and run["within_eta"] and not any(run["tracebacks"].values())
        survived = survived and all(code == 0 for code in run["exit_codes"].values())
        row = (
            f"fault soak, {run['scenario']}: {run['share']:.0%} of calls spoiled, inference killed twice",
            f"{run['trained_steps']} of {run['steps']} steps; {injected} faults injected",
            f"requests_failed {run['orchestrator_failure_counts'].get('requests_failed', 0)}",
            "survived" if survived else "FAILED",
        )
        rows.append((row, run["date"], run["command"]))
    return rows


def real_size_entries(r: dict) -> list[Entry]:
    results = r["results"]
    sets = f" with {', '.join(r['sets'])}" if r.get("sets") else ""
    peaks = [
        (
            (
                f"real size: trainer rank 0 VmHWM / (bf16 model + fp32 weights, grads, AdamW) "
                f"at {size}{sets} (bench.real_size)",
                f"{d['trainer_peak_over_reference']:.2f}",
                f"{d['trainer_reference_gb']:.2f} GB",
                "goal <= 1.3",
            ),
            r["date"],
            r["command"],
        )
        for size, d in results.items()
    ]
    if "ratio" not in r:
        sizes = ", ".join(f"{s}: {d['wall_s']:.0f} s" for s, d in results.items())
        return peaks + [
            (
                (f"real size, {r['config']}{sets}, 2 steps: wall (bench.real_size)", sizes, "-", "-"),
                r["date"],
                r["command"],
            )
        ]
    big, small, ratio = results["0.6B"]["phases"], results["50M"]["phases"], r["ratio"]
    rows = peaks
    for key in ("vllm_start_s", "generate_s", "train_s", "publish_s", "load_s", "hand_off_s"):
        if key in ratio:
            row = (
                f"real size: {key} at 0.6B / 50M, {r['config']}{sets} on CPU (bench.real_size)",
                f"{big[key]:.2f} s",
                f"50M {small[key]:.2f} s",
                f"{ratio[key]:.1f}x (parameters {ratio['parameters']:.1f}x)",
            )
            rows.append((row, r["date"], r["command"]))
    for service in ("inference", "orchestrator", "trainer"):
        big_rss, small_rss = (results[s]["rss"][service]["peak_rss_sum_gb"] for s in ("0.6B", "50M"))
        row = (
            f"real size: peak RSS of {service} at 0.6B / 50M{sets} (bench.real_size)",
            f"{big_rss:.2f} GB",
            f"50M {small_rss:.2f} GB",
            f"{ratio.get(f'rss_{service}', 0):.1f}x (parameters {ratio['parameters']:.1f}x)",
        )
        rows.append((row, r["date"], r["command"]))
    return rows


def gpu_trainer_entries(r: dict) -> list[Entry]:
    """The trainer alone at Qwen3-0.6B's shape: each setting's longest update that ran."""
    device = r.get("cuda_device") or f"CPU ({r['cpus']} cores)"
    out = []
    for entry in r["settings"]:
        ran = (
            [row for row in entry["rows"] if "tokens_per_s" in row] if isinstance(entry["rows"], list) else []
        )
        if not ran:
            continue
        row = ran[-1]
        mfu = "-" if row["mfu"] is None else f"MFU {100 * row['mfu']:.1f}%"
        reference = "prime-rl, one H100, one 64K sequence, FA3: 10,147 tokens/s, MFU 26.8%, 19.6 GiB"
        figure = (
            f"trainer alone, Qwen3-0.6B shape, {entry['setting']}, {row['tokens']} tokens, "
            f"{device} (bench.gpu_trainer{', at ' + r['commit'] if 'commit' in r else ''})"
        )
        value = f"{row['tokens_per_s']:,.0f} tokens/s, peak {row['peak_gib']} GiB"
        out.append(((figure, value, reference, mfu), r["date"], r["command"]))
    for run in [r, *r.get("reruns", [])]:
        published = run.get("publish", {})
        if "publish_s" in published:
            figure = (
                f"trainer alone, Qwen3-0.6B shape, publish a version as {published['dtype']} safetensors, "
                f"{device} (bench.gpu_trainer{', at ' + run['commit'] if 'commit' in run else ''})"
            )
            value = f"{published['publish_s'][-1]} s (gather {published['phases']['gather_s']:.2f} s)"
            detail = f"digest {published['digest_s']} s; first version {published['publish_s'][0]} s"
            out.append(((figure, value, "-", detail), run["date"], run["command"]))
    return out


def streaming_cost_entries(r: dict) -> list[Entry]:
    out = []
    for s in r["summary"]:
        row = (
            f"streamed rollout answers, {s['length']} tokens a sample: tokens/s; client CPU per token "
            "(bench.streaming_cost)",
            f"{s['tokens_per_s_streamed']:.0f}/s; {s['cpu_ms_per_1k_tokens_streamed']:.1f} ms per 1k tokens",
            f"answered whole: {s['tokens_per_s_whole']:.0f}/s; {s['cpu_ms_per_1k_tokens_whole']:.1f} ms",
            f"{s['throughput_ratio']:.2f}x the tokens/s, {s['cpu_ratio']:.2f}x the CPU",
        )
        out.append((row, r["measured_at"], "python -m bench.streaming_cost WORKDIR"))
    return out


def quick_vs_entries(r: dict) -> list[Entry]:
    n = len(r["pairs"])
    out = []
    for label, (key, shorter) in COMPARED.items():
        ratio = r[key]
        row = (
            f"embedded default: a change's {label} / its base's, pairs in one run (bench.quick --base)",
            f"shorter in {r[shorter]} of {n} pairs",
            f"base {r['base']}",
            f"{ratio['median']:.2f}x (spread {ratio['min']:.2f}-{ratio['max']:.2f})",
        )
        out.append((row, r["date"], r["command"]))
    return out


def first_up_entries(r: dict) -> list[Entry]:
    out = []
    for kind, what in (("first", "an empty model cache (its build included)"), ("again", "the model built")):
        wall, rate = r[kind]["wall_s"], r[kind]["samples_per_s"]
        first, last = r[kind]["reward_first10"], r[kind]["reward_last10"]
        row = (
            f"`./triad up` (embedded default, 300 steps) from launch to exit, {what} (bench.first_up)",
            f"{wall['median']:.0f} s (spread {wall['min']:.0f}-{wall['max']:.0f} s)",
            f"{rate['median']:.0f} samples/s once running ({rate['min']:.0f}-{rate['max']:.0f})",
            f"mean reward {first['median']:.2f} (first 10 steps) to {last['median']:.2f} (last 10)",
        )
        out.append((row, r["date"], r["command"]))
    return out


def placement_entries(r: dict) -> list[Entry]:
    """The trainer's cores (bench.placement): `auto` (borrowing inference's while it bounds the
    step) and every core for it, each against its own cores only."""
    out = []
    for name, variants in r["sizes"].items():
        (own, own_r), *others = variants.items()
        for other, other_r in others:
            row = (
                f"triad up, {name}: the trainer on {other} against its own cores only (bench.placement)",
                f"{other_r['median']:.1f} samples/s",
                f"{own_r['median']:.1f} samples/s ({own})",
                f"{other_r['median'] / own_r['median']:.2f}x",
            )
            out.append((row, r["date"], r["command"]))
    return out


READERS: dict[str, Callable[[dict], list[Entry]]] = {
    SUITE: suite_entries,
    "quick.json": quick_entries,
    "quick_vs.json": quick_vs_entries,
    "first_up.json": first_up_entries,
    "placement.json": placement_entries,
    "soak.json": soak_entries,
    "real_size.json": real_size_entries,
    "real_size_ac.json": real_size_entries,
    "real_size_deltas.json": real_size_entries,
    "real_size_full.json": real_size_entries,
    "delta_publish.json": delta_publish_entries,
    "weight_deltas.json": weight_deltas_entries,
    "stock_servers.json": stock_servers_entries,
    "simulate_measured.json": simulate_measured_entries,
    "simulate_published.json": simulate_published_entries,
    "simulate_rates.json": simulate_rates_entries,
    "simulate_speed.json": simulate_speed_entries,
    "gpu_trainer.json": gpu_trainer_entries,
    "gpu_trainer_before.json": gpu_trainer_entries,
    "gpu_trainer_cpu.json": gpu_trainer_entries,
    "gpu_trainer_h200.json": gpu_trainer_entries,
    "streaming_cost.json": streaming_cost_entries,
}


def current_files(results: Path) -> list[Path]:
    return sorted(p for p in results.glob("*.json") if not HISTORY.search(p.name))


def entries(results: Path) -> dict[str, list[Entry]]:
    """Each current result file's entries; a file with no reader is an error that names it."""
    out = {}
    for path in current_files(results):
        reader = READERS.get(path.name)
        if reader is None:
            raise SystemExit(f"{path}: no reader in bench/summary.py; add one so latest.md shows its figures")
        out[path.name] = reader(json.loads(path.read_text()))
    return out


def markdown(results: Path) -> str:
    lines = [
        "# Benchmarks: the newest figure of each",
        "",
        "Generated by `python -m bench.summary` from every result file in this folder; each row says "
        "when it was measured and by which command (ratios are of two things measured in the same run). "
        "Rows of different dates were measured on different days, at different loads: compare a row "
        "only with the reference in its own row.",
        "",
        "| figure | measured | reference | ratio / goal | measured on | command | file |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, found in entries(results).items():
        for row, date, command in found:
            lines.append(f"| {' | '.join(row)} | {date} | `{command}` | [{name}]({name}) |")
    return "\n".join(lines) + "\n"


def write(results: Path = RESULTS) -> str:
    text = markdown(results)
    (results / "latest.md").write_text(text)
    return text


if __name__ == "__main__":
    print(write())
