"""Progress of a run, read from its metrics files.

On a terminal: one live table (rich). Otherwise (CI, pipes, files): one plain
line per step, with no control characters.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from statistics import mean

from services.exporters import Exporter
from shared.rundir import INFERENCE, ORCHESTRATOR, SERVICES, TRAINER, RunDir
from shared.rundir.metrics_files import merge_writers
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
    """New rows of a service's metrics in an object store, where each row rewrites its writer's
    current part (`shared/metrics.py`). Each poll lists the parts and reads, of each writer (the
    service, or each inference server), its last part and those after the last part read
    before: a part before a writer's last is full and never written again, so a poll of a long
    run stays a LIST and a GET or two a writer. A rewound writer continues an earlier part, which
    is then the one read. Rows newer than the last one returned of that writer pass."""

    def __init__(self, rundir: RunDir, service: str) -> None:
        self.rundir, self.service = rundir, service
        self.from_part: dict[str, int] = {}  # per writer: the first part the next poll reads
        self.last_time: dict[str, float] = {}

    def read(self) -> list[dict]:
        parts: dict[str, list[tuple[int, str]]] = {}
        for writer, part, key in self.rundir.metrics.files(self.service):
            parts.setdefault(writer, []).append((part, key))
        rows = [row for writer, found in parts.items() for row in self.new_rows(writer, found)]
        return merge_writers(rows, len(parts))

    def new_rows(self, writer: str, found: list[tuple[int, str]]) -> list[dict]:
        """A writer's rows newer than the last returned of it, from the last part read before on
        (`found`: its (part, key)s in order)."""
        last = found[-1][0]
        start, after = min(self.from_part.get(writer, 0), last), self.last_time.get(writer, float("-inf"))
        new = [
            row
            for part, key in found
            if part >= start
            for row in self.rundir.metrics.file_rows(writer, key)
            if row.get("time", 0.0) > after
        ]
        self.from_part[writer] = last
        if new:
            self.last_time[writer] = max(row.get("time", 0.0) for row in new)
        return new


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


class Ticker:
    """One long wait's progress: a terminal gets one live line, rewritten in place; a pipe or a
    file gets a plain line every `every_s` seconds (the first at once), without control characters."""

    def __init__(
        self,
        stream=None,
        every_s: float = 5.0,
        live: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.live = self.stream.isatty() if live is None else live
        self.every_s, self.clock = every_s, clock
        self.printed_at = float("-inf")
        self.width = 0

    def update(self, text: str) -> None:
        if self.live:
            self.stream.write("\r" + text.ljust(self.width))
            self.stream.flush()
            self.width = len(text)
        elif self.clock() - self.printed_at >= self.every_s:
            print(text, file=self.stream, flush=True)
            self.printed_at = self.clock()

    def done(self) -> None:
        """Leave the live line as it stands and go on below it."""
        if self.live and self.width:
            self.stream.write("\n")
            self.stream.flush()
        self.width = 0


class StepProgress:
    """`what`: step i of n, elapsed and the time left at the pace so far, on a `Ticker`."""

    def __init__(self, what: str, ticker: Ticker | None = None, clock: Callable[[], float] = time.monotonic):
        self.what, self.clock = what, clock
        self.ticker = Ticker(clock=clock) if ticker is None else ticker
        self.start = clock()
        self.steps_from: tuple[float, int] | None = None  # (time, step) the pace is measured from

    def step(self, done: int, total: int, phase: str) -> None:
        now = self.clock()
        if done == 0 or self.steps_from is None:
            self.steps_from = (now, done)
        since, first = self.steps_from
        pace = (now - since) / (done - first) if done > first else None
        left = f", about {format_duration(pace * (total - done))} left" if pace is not None else ""
        elapsed = format_duration(now - self.start)
        self.ticker.update(f"{self.what}: {phase}, step {done}/{total}, {elapsed}{left}")

    def phase(self, phase: str) -> None:
        self.ticker.update(f"{self.what}: {phase}, {format_duration(self.clock() - self.start)}")

    @contextlib.contextmanager
    def during(self, phase: str, every_s: float = 5.0) -> Iterator[None]:
        """A phase that blocks (an import, a sampling pass): its line again every `every_s` seconds
        from a thread until it ends."""
        stop = threading.Event()

        def beat() -> None:
            while True:
                self.phase(phase)
                if stop.wait(every_s):
                    return

        thread = threading.Thread(target=beat, name="progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def done(self) -> None:
        self.ticker.done()


def format_duration(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LOG_PREFIX = re.compile(r"^(\(\w+ pid=\d+\) )?(DEBUG|INFO|WARNING|ERROR) [\d-]+ [\d:.]+ (\[[^]]*\] )?")
# the orchestrator's line once inference serves (orchestrator/loop.py)
CONNECTED = "connected to inference at"


def last_log_line(path: Path, width: int = 100, since: int = 0) -> str:
    """The last non-empty line of a log after its byte `since`, without vLLM's level-and-time
    prefix, cut to `width`."""
    try:
        with open(path, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - 4096))
            lines = [x for x in f.read().decode(errors="replace").splitlines() if x.strip()]
    except FileNotFoundError:
        return "(no output yet)"
    line = LOG_PREFIX.sub("", ANSI_ESCAPE.sub("", lines[-1]).strip()) if lines else "(no output yet)"
    line = "".join(ch if ch.isprintable() else " " for ch in line)  # a pipe's line stays one plain line
    return line if len(line) <= width else line[: width - 3] + "..."


def log_text(path: Path, since: int = 0) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(since)
            return f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


class StartTimes:
    """How long the last start on this machine took to inference serving and to the first batch
    (a small JSON file in the model cache), to say how far a start is against the usual."""

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key

    def usual(self) -> dict[str, float]:
        try:
            return json.loads(self.path.read_text()).get(self.key, {})
        except (OSError, ValueError, AttributeError):
            return {}

    def record(self, times: dict[str, float]) -> None:
        try:
            known = json.loads(self.path.read_text())
        except (OSError, ValueError):
            known = {}
        known = known if isinstance(known, dict) else {}
        known[self.key] = {k: round(v, 1) for k, v in times.items()}
        with contextlib.suppress(OSError):  # a read-only cache only loses the comparison
            self.path.write_text(json.dumps(known, indent=1) + "\n")


class StartProgress:
    """What `triad up` waits for before its first batch: inference starting (its log's last line),
    then the first batch (the orchestrator's), elapsed against the last start on this machine.
    Made before the services start: what their logs hold by then is a previous start's."""

    def __init__(self, rundir: RunDir, times: StartTimes | None, clock: Callable[[], float] = time.monotonic):
        self.rundir, self.times, self.clock = rundir, times, clock
        self.start = clock()
        self.since = {s: log_size(rundir.log_file(s)) for s in (INFERENCE, ORCHESTRATOR)}
        self.usual = times.usual() if times is not None else {}
        self.served_at: float | None = None

    def elapsed(self, phase: str, since: float) -> str:
        usual = self.usual.get(phase)
        return format_duration(self.clock() - since) + (
            f" (last time {format_duration(usual)})" if usual else ""
        )

    def served(self) -> bool:
        path = self.rundir.log_file(ORCHESTRATOR)
        if self.served_at is None and CONNECTED in log_text(path, self.since[ORCHESTRATOR]):
            self.served_at = self.clock()
        return self.served_at is not None

    def line(self) -> str:
        if not self.served():
            what = last_log_line(self.rundir.log_file(INFERENCE), since=self.since[INFERENCE])
            return f"starting: inference (vLLM) {self.elapsed('inference_s', self.start)}: {what}"
        what, waited = (
            last_log_line(self.rundir.log_file(ORCHESTRATOR), since=self.since[ORCHESTRATOR]),
            self.elapsed("first_batch_s", self.served_at),
        )
        return f"starting: inference serves; waiting for the first batch {waited}: {what}"

    def first_batch(self) -> None:
        if self.times is not None and self.served():
            now = self.clock()
            self.times.record(
                {"inference_s": self.served_at - self.start, "first_batch_s": now - self.served_at}
            )


class ProgressPrinter:
    """A start's progress, from the rows its services write: made before they start, it passes
    over the rows a previous start of the run wrote (a resumed run shows and exports its own)."""

    def __init__(
        self,
        rundir: RunDir,
        max_steps: int,
        exporters: Sequence[Exporter] = (),
        live: bool = False,
        start_times: StartTimes | None = None,
    ) -> None:
        self.max_steps = max_steps
        self.tails = {s: tail_of(rundir, s) for s in SERVICES}
        for tail in self.tails.values():
            tail.read()
        self.starting: StartProgress | None = StartProgress(rundir, start_times)
        self.ticker = Ticker(sys.stdout, live=False)
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
        if self.starting is not None and ORCHESTRATOR in self.last:
            self.starting.first_batch()
            self.starting = None
        elif self.starting is not None and self.live is None:
            self.ticker.update(self.starting.line())
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
            table.add_row(
                self.starting.line() if self.starting is not None else "waiting for the first batch", ""
            )
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
