"""Progress of a run, read from its metrics files: plain lines, safe for pipes."""

from __future__ import annotations

import json
from statistics import mean

from shared.rundir import RunDir


class MetricsTail:
    """New complete JSON rows appended to a metrics file since the last read."""

    def __init__(self, path) -> None:
        self.path, self.offset = path, 0

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        return [json.loads(line) for line in complete.splitlines() if line.strip()]


class ProgressPrinter:
    def __init__(self, rundir: RunDir, max_steps: int) -> None:
        self.max_steps = max_steps
        self.orchestrator = MetricsTail(rundir.metrics_file("orchestrator"))
        self.trainer = MetricsTail(rundir.metrics_file("trainer"))
        self.rewards: list[float] = []
        self.last_loss: float | None = None

    def poll(self) -> None:
        for row in self.trainer.read():
            self.last_loss = row["loss"]
        for row in self.orchestrator.read():
            self.rewards.append(row["reward_mean"])
            recent = mean(self.rewards[-10:])
            loss = f"{self.last_loss:+.4f}" if self.last_loss is not None else "-"
            print(
                f"step {row['step']:>4}/{self.max_steps}  reward {row['reward_mean']:.3f} "
                f"(last 10: {recent:.3f})  lag {row['lag_mean']:.2f}  served v{row['served_version']}  "
                f"{row['samples_per_s']:.1f} samples/s  loss {loss}",
                flush=True,
            )

    def summary(self) -> None:
        if not self.rewards:
            return
        first, last = mean(self.rewards[:10]), mean(self.rewards[-10:])
        print(f"done: mean reward {first:.3f} over the first 10 steps, {last:.3f} over the last 10")
