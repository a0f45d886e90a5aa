"""`triad status RUN_DIR` and `triad plot RUN_DIR`: a run, read from its directory alone."""

from __future__ import annotations

import time
from pathlib import Path
from statistics import mean

from services.timeline import breakdown, spans
from shared.errors import TriadError
from shared.fleet import parse_records
from shared.liveness import describe_holder
from shared.resume import newest_batch, newest_checkpoint
from shared.rundir import ORCHESTRATOR, SERVICES, TRAINER, RunDir

PHASE_COLOURS = {
    "generate": "tab:green",
    "assemble": "yellowgreen",
    "write_batch": "darkgreen",
    "wait": "lightgrey",
    "read": "tab:gray",
    "train": "tab:blue",
    "forward_backward": "tab:blue",
    "optimizer": "tab:cyan",
    "publish": "tab:orange",
    "gather": "tab:orange",
    "write": "tab:brown",
    "mark": "tab:pink",
    "load": "tab:red",
}
LABELLED = ("generate", "train", "forward_backward", "load")  # bars that carry their step number


def rolling_mean(values: list[float], window: int = 10) -> list[float]:
    return [mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def describe(service: str, row: dict) -> str:
    if service == ORCHESTRATOR:
        epoch = f", epoch {row['epoch']:.2f}" if "epoch" in row else ""
        return f"reward {row['reward_mean']:.3f}, lag {row['lag_mean']:.2f} (max {row['lag_max']}){epoch}"
    if service == TRAINER:
        return f"loss {row['loss']:+.4f}, grad norm {row['grad_norm']:.3f}"
    return f"serving version {row['version']}"


def status_lines(rundir: RunDir, now: float | None = None, last_n: int = 20) -> list[str]:
    run = rundir.read_run()
    now = time.time() if now is None else now
    lines = [f"run {run.run_id} in {rundir.name} (max_steps {run.config.get('max_steps')})"]
    lines.append(
        f"  newest batch {newest_batch(rundir, run.run_id)}, "
        f"newest weights {rundir.weights.newest(run.run_id)}, "
        f"newest checkpoint {newest_checkpoint(rundir, run.run_id)}"
    )
    for service in SERVICES:
        rows = rundir.metrics.rows(service)
        if not rows:
            lines.append(f"  {service:<12} no metrics yet")
            continue
        last = rows[-1]
        age = now - last["time"]
        lines.append(f"  {service:<12} step {last['step']:>5}  {describe(service, last)}  ({age:.0f} s ago)")
    for role in (ORCHESTRATOR, TRAINER):
        lines.append(f"  {role:<12} {describe_holder(rundir.live, role, now)}")
    for record in parse_records(rundir.fleet.read_all(), rundir.fleet.describe()):
        age = now - record.written_at
        lines.append(f"  {'joined':<12} {record.url}  beat {record.beat}  ({age:.0f} s ago)")
    time_went = breakdown(rundir, last_n)
    return [*lines, "where the time went:", *time_went] if time_went else lines


def plot_run(rundir: RunDir) -> Path:
    """Reward, off-policy lag and throughput over steps, as a PNG in the run directory."""
    rows = rundir.metrics.rows(ORCHESTRATOR)
    if not rows:
        raise TriadError(f"{rundir.name} has no orchestrator metrics to plot yet")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in rows]
    rewards = [r["reward_mean"] for r in rows]
    fig, (ax_r, ax_l, ax_t) = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    ax_r.plot(steps, rewards, alpha=0.35, label="reward (step mean)")
    ax_r.plot(steps, rolling_mean(rewards), label="reward (mean of last 10)")
    ax_r.set_ylabel("reward")
    ax_r.legend(loc="lower right")
    ax_l.plot(steps, [r["lag_mean"] for r in rows], label="mean")
    ax_l.plot(steps, [r["lag_max"] for r in rows], label="max", linestyle="--")
    ax_l.set_ylabel("off-policy lag")
    ax_l.legend(loc="upper right")
    ax_t.plot(steps, rolling_mean([r["samples_per_s"] for r in rows]))
    ax_t.set_ylabel("samples/s (mean of 10)")
    ax_t.set_xlabel("step")
    fig.suptitle(f"triad run {rundir.read_run().run_id}")
    fig.tight_layout()
    out = rundir.plot_file()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def step_window(rundir: RunDir, window: str | None) -> tuple[int, int]:
    """`A:B` -> (A, B); None -> the trainer's last 10 steps."""
    if window:
        first, sep, last = window.partition(":")
        if not sep or not first.isdigit() or not last.isdigit() or int(first) > int(last):
            raise TriadError(f"--window expects FIRST:LAST steps (e.g. 20:30), got {window!r}")
        return int(first), int(last)
    rows = rundir.metrics.rows(TRAINER)
    if not rows:
        raise TriadError(f"{rundir.name} has no trainer metrics for a timeline yet")
    return max(1, rows[-1]["step"] - 9), rows[-1]["step"]


def plot_timeline(rundir: RunDir, first: int, last: int) -> Path:
    """A Gantt-style figure of steps `first..last`: one lane per service, one bar per phase."""
    chosen = spans(rundir, first, last)
    if not chosen:
        raise TriadError(f"{rundir.name} has no metrics for steps {first}..{last}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    origin = min(s.start for s in chosen)
    lanes = {service: i for i, service in enumerate(reversed(SERVICES))}
    fig, ax = plt.subplots(figsize=(12, 3.2))
    for s in chosen:
        width = max(s.end - s.start, 0.002)  # a load without a duration still shows as a tick
        ax.broken_barh(
            [(s.start - origin, width)],
            (lanes[s.service] - 0.35, 0.7),
            facecolors=PHASE_COLOURS[s.phase],
            edgecolor="black",
            linewidth=0.3,
        )
        if s.phase in LABELLED:
            ax.text(
                s.start - origin + width / 2,
                lanes[s.service],
                str(s.step),
                ha="center",
                va="center",
                fontsize=6,
            )
    ax.set_yticks(list(lanes.values()), list(lanes))
    ax.set_xlabel("seconds")
    shown = [p for p in PHASE_COLOURS if any(s.phase == p for s in chosen)]
    handles = [plt.Rectangle((0, 0), 1, 1, color=PHASE_COLOURS[p]) for p in shown]
    ax.legend(
        handles, shown, loc="upper center", ncol=min(len(shown), 7), bbox_to_anchor=(0.5, -0.25), fontsize=8
    )
    ax.set_title(f"triad run {rundir.read_run().run_id}: steps {first}..{last} (numbers: step or version)")
    fig.tight_layout()
    out = rundir.plot_file(timeline=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
