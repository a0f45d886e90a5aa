"""The one-minute check before a submission: the embedded default's steady step against its
compute floor, and the weight hand-off against raw I/O, as ratios measured back to back.

    python -m bench.quick [--rounds 3] [--steps 40]     (bench/run includes it)

Each round measures, one after the other on this machine:
- the floor (`bench/floor.py`): the same step in one process, no services;
- `triad up` on the embedded default at η = 1 for `--steps` steps: the steady step (seconds
  between the orchestrator's batch writes after warm-up, per step) and the hand-off (trainer
  publishes V -> inference serves V, `bench/suite.run_handoff`);
and the ratios step / floor and hand-off / (3 x raw write and read + 10 ms). Rounds alternate the
two, so a machine that gets busier mid-run moves both; the load average is recorded before each.
A change is judged against the commit before it in one sitting (`--base`, below), never by an old
absolute figure (one commit's step moves ±15% between runs here). Writes bench/results/quick.json
and quick.md.

    python -m bench.quick --base REV [--rounds 3] [--steps 40]

measures a change instead: the embedded default's steady step and hand-off with this checkout's
code and with commit REV's (`git archive`, run with this checkout's environment), one after the
other in each round, the order swapped every round (A B, B A, ...), and the ratios change / REV
pair by pair. A pair is two runs minutes apart, so it does not depend on a floor measured in
another process; its median over the rounds, and in how many pairs the change was the shorter,
say whether a change shows beyond this machine's spread. Writes bench/results/quick_vs.json and
quick_vs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.suite import (
    REPO,
    RESULTS,
    extract_commit,
    handoff_goal,
    machine,
    run_handoff,
    run_module,
    short_commit,
    spread,
    triad_up,
    write_rounds,
)
from shared.rundir import ORCHESTRATOR, RunDir

WARMUP_STEPS = 10  # the first steps include vLLM's and the trainer's first-call costs
FLOOR_STEPS = 30
COMPARED = {"step": ("step_ratio", "step_shorter"), "hand-off": ("handoff_ratio", "handoff_shorter")}


def steady_step_s(run_dir: Path) -> float:
    """Seconds per step between the orchestrator's batch writes, after warm-up."""
    rows = RunDir(run_dir).metrics.rows(ORCHESTRATOR)[WARMUP_STEPS:]
    if len(rows) < 3:
        raise SystemExit(
            f"{run_dir}: only {len(rows)} steps after warm-up; give --steps above {WARMUP_STEPS + 3}"
        )
    return (rows[-1]["time"] - rows[0]["time"]) / (len(rows) - 1)


def one_round(workdir: Path, index: int, steps: int) -> dict:
    load_before = os.getloadavg()[0]
    floor = run_module("bench.floor", str(FLOOR_STEPS))
    run = side_run(workdir, REPO, f"round{index}", steps)
    return {
        **run,
        "load_before": round(load_before, 2),
        "floor_step_s": floor["step_s"],
        "floor_sample_s": floor["sample_s"],
        "floor_train_s": floor["train_s"],
        "step_over_floor": run["step_s"] / floor["step_s"],
    }


def summary(rounds: list[dict], steps: int) -> dict:
    keys = ("floor_step_s", "step_s", "step_over_floor", "handoff_s", "handoff_over_goal")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "command": f"python -m bench.quick --rounds {len(rounds)} --steps {steps}",
        "steps": steps,
        "rounds": rounds,
        **{key: spread([r[key] for r in rounds]) for key in keys},
        "goals": {"step_over_floor": 1.5, "handoff_over_goal": 1.0},
    }


def markdown(s: dict) -> str:
    lines = [
        f"# bench.quick, {s['date']} ({s['machine']})",
        "",
        f"`{s['command']}`: the embedded default at η = 1 ({s['steps']} steps, "
        f"{WARMUP_STEPS} warm-up) against its floor ({FLOOR_STEPS} steps), round by round.",
        "",
        "| round | load before | floor step | step | step / floor | hand-off | raw I/O | hand-off / goal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(s["rounds"], 1):
        lines.append(
            f"| {i} | {r['load_before']:.2f} | {r['floor_step_s'] * 1e3:.0f} ms | {r['step_s'] * 1e3:.0f} ms "
            f"| {r['step_over_floor']:.2f} | {r['handoff_s'] * 1e3:.0f} ms "
            f"| {r['raw_write_read_s'] * 1e3:.1f} ms | {r['handoff_over_goal']:.2f} |"
        )
    sof, hog = s["step_over_floor"], s["handoff_over_goal"]
    lines += [
        "",
        f"- step / floor: median **{sof['median']:.2f}** (spread {sof['min']:.2f}-{sof['max']:.2f}; "
        f"goal at most {s['goals']['step_over_floor']})",
        f"- hand-off / (3 x raw + 10 ms): median **{hog['median']:.2f}** "
        f"(spread {hog['min']:.2f}-{hog['max']:.2f}; goal at most 1)",
        "",
    ]
    return "\n".join(lines)


def side_run(workdir: Path, code: Path, name: str, steps: int) -> dict:
    """The embedded default's steady step and hand-off with the code in `code`."""
    load_before = os.getloadavg()[0]
    run_dir = workdir / name
    launched = triad_up(run_dir, 1, steps, code)
    handoff = run_handoff(run_dir)
    return {
        "load_before": round(load_before, 2),
        "step_s": steady_step_s(run_dir),
        "handoff_s": handoff["handoff_s"]["median"],
        "raw_write_read_s": handoff["raw_write_read_s"],
        "handoff_over_goal": handoff_goal(handoff),
        "up_wall_s": time.time() - launched,
    }


def one_pair(workdir: Path, base_code: Path, index: int, steps: int) -> dict:
    """Round `index` of a comparison: the base first in even rounds, the change first in odd ones."""
    order = ("base", "change") if index % 2 == 0 else ("change", "base")
    code = {"base": base_code, "change": REPO}
    runs = {side: side_run(workdir, code[side], f"{side}{index}", steps) for side in order}
    return {
        "first": order[0],
        **runs,
        "step_ratio": runs["change"]["step_s"] / runs["base"]["step_s"],
        "handoff_ratio": runs["change"]["handoff_s"] / runs["base"]["handoff_s"],
    }


def summary_vs(pairs: list[dict], steps: int, base: str) -> dict:
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": machine(),
        "command": f"python -m bench.quick --base {base} --rounds {len(pairs)} --steps {steps}",
        "base": base,
        "steps": steps,
        "pairs": pairs,
        "step_ratio": spread([p["step_ratio"] for p in pairs]),
        "handoff_ratio": spread([p["handoff_ratio"] for p in pairs]),
        "step_shorter": sum(p["step_ratio"] < 1 for p in pairs),
        "handoff_shorter": sum(p["handoff_ratio"] < 1 for p in pairs),
    }


def markdown_vs(s: dict) -> str:
    lines = [
        f"# bench.quick against {s['base']}, {s['date']} ({s['machine']})",
        "",
        f"`{s['command']}`: the embedded default at η = 1 ({s['steps']} steps, {WARMUP_STEPS} warm-up) "
        f"with this checkout's code (change) and with {s['base']}'s (base), pair by pair.",
        "",
        "| pair | first | load before | base step | change step | change / base | base hand-off "
        "| change hand-off | change / base |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, p in enumerate(s["pairs"], 1):
        base, change = p["base"], p["change"]
        lines.append(
            f"| {i} | {p['first']} | {p[p['first']]['load_before']:.2f} | {base['step_s'] * 1e3:.0f} ms "
            f"| {change['step_s'] * 1e3:.0f} ms | {p['step_ratio']:.2f} | {base['handoff_s'] * 1e3:.0f} ms "
            f"| {change['handoff_s'] * 1e3:.0f} ms | {p['handoff_ratio']:.2f} |"
        )
    n = len(s["pairs"])
    lines.append("")
    for label, (key, shorter) in COMPARED.items():
        r = s[key]
        lines.append(
            f"- {label}, change / base: median **{r['median']:.2f}** (spread {r['min']:.2f}-{r['max']:.2f}); "
            f"the change's was the shorter in {s[shorter]} of {n} pairs"
        )
    return "\n".join([*lines, ""])


def each_round(measure: Callable[[int], dict], rounds: int) -> list[dict]:
    """`measure(i)` for each round, each printed as it comes."""
    results = []
    for i in range(rounds):
        results.append(measure(i))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--base", help="a commit: measure this checkout's change against it, pair by pair")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="triad-quick-") as tmp:
        workdir = Path(tmp)
        if args.base:
            base_code = extract_commit(args.base, workdir / "base-code")
            pairs = each_round(lambda i: one_pair(workdir, base_code, i, args.steps), args.rounds)
            s = summary_vs(pairs, args.steps, short_commit(args.base))
            write_rounds(args.out, "quick_vs", s, markdown_vs(s))
        else:
            rounds = each_round(lambda i: one_round(workdir, i, args.steps), args.rounds)
            s = summary(rounds, args.steps)
            write_rounds(args.out, "quick", s, markdown(s))


if __name__ == "__main__":
    main()
