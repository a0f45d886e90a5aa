"""Progress of a run, read from its metrics files.

On a terminal: one live table (rich). Otherwise (CI, pipes, files): one plain
line per step, with no control characters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from statistics import mean

from services.exporters import Exporter
from shared.rundir import INFERENCE, ORCHESTRATOR, SERVICES, TRAINER, RunDir
from shared.storage import LocalStore


class MetricsTail:
    """New complete JSON rows appended to a metrics file since the last read.

    A resumed service rewrites its file without the rows of the discarded lineage
    (`drop_rows_after`, a new file in its place) and then appends that lineage's
    steps again: the tail then reads the new file from its start and passes only
    rows newer than the last one it returned. Lines that are not JSON (a row torn
    by a killed writer) are skipped, as `read_metrics` does.
    """

    def __init__(self, path) -> None:
        self.path, self.offset, self.inode = path, 0, None
        self.last_time = float("-inf")
        self.returned_before: float | None = None  # after a rewrite: rows up to this time were returned

    def read(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self.inode or st.st_size < self.offset:
                    self.rewound(st.st_ino)
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self.offset += len(complete)
        rows = [row for row in map(parse_row, complete.splitlines()) if row is not None]
        if self.returned_before is not None:
            rows = [r for r in rows if r.get("time", float("inf")) > self.returned_before]
        if rows:
            self.last_time = max(self.last_time, rows[-1].get("time", self.last_time))
        return rows

    def rewound(self, inode: int) -> None:
        if self.inode is not None:
            self.returned_before = self.last_time
        self.inode, self.offset = inode, 0


class StoreTail:
    """New rows of a service's metrics in an object store, where each row rewrites the (small,
    single-writer) object: read whole, pass the rows newer than the last one returned."""

    def __init__(self, rundir: RunDir, service: str) -> None:
        self.rundir, self.service = rundir, service
        self.last_time = float("-inf")

    def read(self) -> list[dict]:
        rows = [r for r in self.rundir.metrics.rows(self.service) if r.get("time", 0.0) > self.last_time]
        if rows:
            self.last_time = rows[-1].get("time", self.last_time)
        return rows


class LocalTail:
    """New rows of every metrics file of a service on a local store (each inference server has
    its own): one `MetricsTail` per file, files that appear later included, merged by time."""

    def __init__(self, rundir: RunDir, service: str) -> None:
        self.rundir, self.service = rundir, service
        self.tails: dict[str, MetricsTail] = {}

    def read(self) -> list[dict]:
        for _, _, key in self.rundir.metrics.files(self.service):
            if key not in self.tails:
                self.tails[key] = MetricsTail(self.rundir.store.local_path(key))
        rows = [row for tail in self.tails.values() for row in tail.read()]
        return sorted(rows, key=lambda r: r.get("time", 0.0)) if len(self.tails) > 1 else rows


def tail_of(rundir: RunDir, service: str) -> LocalTail | StoreTail:
    if isinstance(rundir.store, LocalStore):
        return LocalTail(rundir, service)
    return StoreTail(rundir, service)


def parse_row(line: bytes) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return None
    return row if isinstance(row, dict) else None


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


class ProgressPrinter:
    def __init__(
        self, rundir: RunDir, max_steps: int, exporters: Sequence[Exporter] = (), live: bool = False
    ) -> None:
        self.max_steps = max_steps
        self.tails = {s: tail_of(rundir, s) for s in SERVICES}
        self.exporters = exporters
        self.rewards: list[float] = []
        self.step_times: list[float] = []
        self.last: dict[str, dict] = {}
        self.live = None
        if live:
            from rich.live import Live

            self.live = Live(self.table(), refresh_per_second=4)
            self.live.start()

    def poll(self) -> None:
        for service, tail in self.tails.items():
            for row in tail.read():
                for exporter in self.exporters:
                    exporter.write(service, row)
                self.last[service] = row
                if service == ORCHESTRATOR:
                    self.on_step(row)
        if self.live is not None:
            self.live.update(self.table())

    def on_step(self, row: dict) -> None:
        self.rewards.append(row["reward_mean"])
        self.step_times.append(row["time"])
        if self.live is None:
            print(self.line(row), flush=True)

    def eta(self, step: int) -> str:
        recent = self.step_times[-20:]
        if len(recent) < 2:
            return "-"
        per_step = (recent[-1] - recent[0]) / (len(recent) - 1)
        return format_duration(per_step * (self.max_steps - step))

    def line(self, row: dict) -> str:
        loss = self.last.get(TRAINER, {}).get("loss")
        return (
            f"step {row['step']:>4}/{self.max_steps}  reward {row['reward_mean']:.3f} "
            f"(last 10: {mean(self.rewards[-10:]):.3f})  lag {row['lag_mean']:.2f}  "
            f"served v{row['served_version']}  {row['samples_per_s']:.1f} samples/s  "
            f"{row['tokens_per_s']:.0f} tokens/s  loss {'-' if loss is None else f'{loss:+.4f}'}  "
            f"eta {self.eta(row['step'])}"
        )

    def table(self):
        from rich.table import Table

        table = Table(title="triad", show_header=False)
        row = self.last.get(ORCHESTRATOR)
        if row is None:
            table.add_row("waiting for the first batch", "")
            return table
        trainer = self.last.get(TRAINER, {})
        table.add_row("step", f"{row['step']} / {self.max_steps}  (eta {self.eta(row['step'])})")
        table.add_row("reward", f"{row['reward_mean']:.3f}  (last 10: {mean(self.rewards[-10:]):.3f})")
        table.add_row("off-policy lag", f"{row['lag_mean']:.2f} (max {row['lag_max']})")
        table.add_row(
            "throughput", f"{row['samples_per_s']:.1f} samples/s, {row['tokens_per_s']:.0f} tokens/s"
        )
        table.add_row("served version", str(self.last.get(INFERENCE, {}).get("version", "-")))
        if trainer:
            table.add_row("trainer", f"step {trainer['step']}, loss {trainer['loss']:+.4f}")
        return table

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
        for exporter in self.exporters:
            exporter.close()

    def summary(self) -> None:
        if not self.rewards:
            return
        first, last = mean(self.rewards[:10]), mean(self.rewards[-10:])
        print(f"done: mean reward {first:.3f} over the first 10 steps, {last:.3f} over the last 10")
