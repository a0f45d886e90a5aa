"""`triad status RUN_DIR` and `triad plot RUN_DIR`: a run, read from its directory alone."""

from __future__ import annotations

import time
from pathlib import Path
from statistics import mean

from shared.errors import TriadError
from shared.resume import newest_batch, newest_checkpoint
from shared.rundir import ORCHESTRATOR, SERVICES, TRAINER, RunDir


def rolling_mean(values: list[float], window: int = 10) -> list[float]:
    return [mean(values[max(0, i + 1 - window) : i + 1]) for i in range(len(values))]


def describe(service: str, row: dict) -> str:
    if service == ORCHESTRATOR:
        return f"reward {row['reward_mean']:.3f}, lag {row['lag_mean']:.2f} (max {row['lag_max']})"
    if service == TRAINER:
        return f"loss {row['loss']:+.4f}, grad norm {row['grad_norm']:.3f}"
    return f"serving version {row['version']}"


def status_lines(rundir: RunDir, now: float | None = None) -> list[str]:
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
    return lines


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
    out = rundir.plot_file
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
