"""The README's first figure: `./triad up` on the embedded default as a new user types it, from
launch to exit, the median of three rounds with the spread (issue 44).

    python -m bench.first_up [--rounds 3]       (run it in a fresh clone after its set-up)

Each round runs the checkout's own `./triad up` twice, each with a run directory of its own:
- first: an empty model cache (`TRIAD_CACHE`), so the tiny model's build is in the time, as on a
  new machine;
- again: the same cache, the model built: every later run on that machine.
From each run's metrics: seconds from launch to exit and to the first trained step, the steady
samples/s (the orchestrator's samples after the warm-up steps over their span) and the mean
reward over the first and the last 10 steps, as `triad up` prints them. The load average is
recorded before each run. Writes bench/results/first_up.json and first_up.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.suite import REPO, RESULTS, machine, short_commit, spread, write_rounds
from shared.rundir import ORCHESTRATOR, TRAINER, RunDir

WARMUP_STEPS = 10
KINDS = ("first", "again")


def one_up(run_dir: Path, cache: Path) -> dict:
    load_before = os.getloadavg()[0]
    launched = time.time()
    done = subprocess.run(
        ["./triad", "up", f"--set=run_dir={run_dir}"],
        cwd=REPO,
        env={**os.environ, "TRIAD_CACHE": str(cache)},
        stdout=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise SystemExit(
            f"bench.first_up: `./triad up` in {REPO} stopped with code {done.returncode}; its one-line "
            f"error is above and each service's log is in {RunDir(run_dir).logs_dir}"
        )
    wall = time.time() - launched
    rundir = RunDir(run_dir)
    rows = rundir.metrics.rows(ORCHESTRATOR)
    steady = rows[WARMUP_STEPS:]
    rewards = [r["reward_mean"] for r in rows]
    return {
        "load_before": round(load_before, 2),
        "steps": len(rows),
        "wall_s": wall,
        "first_step_s": rundir.metrics.rows(TRAINER)[0]["time"] - launched,
        "samples_per_s": sum(r["samples"] for r in steady[1:]) / (steady[-1]["time"] - steady[0]["time"]),
        "reward_first10": statistics.mean(rewards[:10]),
        "reward_last10": statistics.mean(rewards[-10:]),
    }


def summary(rounds: list[dict]) -> dict:
    keys = ("wall_s", "first_step_s", "samples_per_s", "reward_first10", "reward_last10")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "commit": short_commit(),
        "command": f"python -m bench.first_up --rounds {len(rounds)}",
        "rounds": rounds,
        **{kind: {key: spread([r[kind][key] for r in rounds]) for key in keys} for kind in KINDS},
    }


def markdown(s: dict) -> str:
    lines = [
        f"# bench.first_up, {s['date']} ({s['machine']}, commit {s['commit']})",
        "",
        f"`{s['command']}`: `./triad up` on the embedded default, from launch to exit; *first* with",
        "an empty model cache (the tiny model's build included), *again* with the model built.",
        "",
        "| round | run | load before | steps | launch to exit | to first step | samples/s "
        "| reward first 10 | last 10 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(s["rounds"], 1):
        for kind in KINDS:
            x = r[kind]
            lines.append(
                f"| {i} | {kind} | {x['load_before']:.2f} | {x['steps']} | {x['wall_s']:.0f} s "
                f"| {x['first_step_s']:.1f} s | {x['samples_per_s']:.0f} | {x['reward_first10']:.3f} "
                f"| {x['reward_last10']:.3f} |"
            )
    lines.append("")
    for kind in KINDS:
        w, f, r = s[kind]["wall_s"], s[kind]["first_step_s"], s[kind]["samples_per_s"]
        lines.append(
            f"- {kind}: launch to exit median **{w['median']:.0f} s** ({w['min']:.0f}-{w['max']:.0f}), "
            f"to the first step {f['median']:.1f} s ({f['min']:.1f}-{f['max']:.1f}), "
            f"{r['median']:.0f} samples/s ({r['min']:.0f}-{r['max']:.0f})"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS, help="where first_up.json and first_up.md go")
    args = parser.parse_args()
    rounds = []
    with tempfile.TemporaryDirectory(prefix="triad-first-up-") as tmp:
        for i in range(args.rounds):
            cache = Path(tmp) / f"cache{i}"
            rounds.append({kind: one_up(Path(tmp) / f"run{i}-{kind}", cache) for kind in KINDS})
            print(json.dumps(rounds[-1]), file=sys.stderr, flush=True)
    s = summary(rounds)
    write_rounds(args.out, "first_up", s, markdown(s))


if __name__ == "__main__":
    main()
