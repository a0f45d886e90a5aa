"""Copies of the JSONL metrics for TensorBoard and Weights & Biases, when available.

`triad up` feeds every new metrics row to these; the JSONL files stay the source
of truth. Each exporter is optional: a missing package disables it with one
log line, never the run.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from contextlib import AbstractContextManager
from numbers import Number
from pathlib import Path
from typing import Protocol

from shared.config import TriadConfig
from shared.diskspace import RUN_DIR_ADVICE, full_disk_is_one_line, is_disk_full
from shared.errors import TriadError
from shared.rundir import RunDir

log = logging.getLogger("triad.metrics")


class Exporter(Protocol):
    def write(self, service: str, row: dict) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k not in ("step", "time") and isinstance(v, Number)}


class TensorBoardExporter:
    """Its event file is in the run directory: a full disk there is one line, as for every
    other writer of the run. TensorBoard's writer thread meets the full disk first and dies
    with it; the next call here raises it again, and that call's line is the only report."""

    def __init__(self, log_dir: str) -> None:
        # TensorBoard's own writer, which torch's SummaryWriter wraps: torch's import took 1.66 s
        # of `triad up` before it started the services (a cProfile of a run)
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.log_dir = Path(log_dir)
        before = set(threading.enumerate())
        with self._full_disk_is_one_line():
            self.writer = EventFileWriter(log_dir)
        self._quiet = QuietDiskFull(set(threading.enumerate()) - before)

    def _full_disk_is_one_line(self) -> AbstractContextManager[None]:
        return full_disk_is_one_line(self.log_dir, "TensorBoard events", RUN_DIR_ADVICE)

    def write(self, service: str, row: dict) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=f"{service}/{key}", simple_value=v) for key, v in scalars(row).items()]
        event = Event(wall_time=time.time(), step=row["step"], summary=Summary(value=values))
        with self._full_disk_is_one_line():
            self.writer.add_event(event)

    def close(self) -> None:
        try:
            with self._full_disk_is_one_line():
                self.writer.close()
        finally:
            self._quiet.remove()


class QuietDiskFull:
    """A `threading.excepthook` that prints nothing for a full disk in `threads`, whose owner
    raises that error again in the caller's thread; any other error of any thread goes to the
    hook that was there before."""

    def __init__(self, threads: set[threading.Thread]) -> None:
        self.threads = threads
        self.previous = threading.excepthook
        threading.excepthook = self.hook

    def hook(self, args: threading.ExceptHookArgs) -> None:
        if args.thread in self.threads and args.exc_value is not None and is_disk_full(args.exc_value):
            return
        self.previous(args)

    def remove(self) -> None:
        if threading.excepthook == self.hook:
            threading.excepthook = self.previous


class WandbExporter:
    def __init__(self, cfg: TriadConfig, rundir: RunDir, run_id: str) -> None:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        m = cfg.metrics
        try:
            self.run = wandb.init(
                project=m.wandb_project,
                id=run_id,
                resume="allow",
                mode=m.wandb_mode,
                dir=str(rundir.root),
                config=cfg.public_dict(),
            )
        except wandb.errors.Error as e:  # no login, no network, a project it may not write to
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise TriadError(
                f"W&B could not start (metrics.wandb_project = {m.wandb_project!r}, "
                f"metrics.wandb_mode = {m.wandb_mode!r}): {reason}; run `wandb login` or set "
                'WANDB_API_KEY, or set metrics.wandb_mode = "offline" and sync later'
            ) from None

    def write(self, service: str, row: dict) -> None:
        self.run.log({f"{service}/{k}": v for k, v in scalars(row).items()} | {"step": row["step"]})

    def close(self) -> None:
        self.run.finish()


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def make_exporters(cfg: TriadConfig, rundir: RunDir, run_id: str) -> list[Exporter]:
    exporters: list[Exporter] = []
    if cfg.metrics.tensorboard and installed("tensorboard"):
        exporters.append(TensorBoardExporter(str(rundir.tensorboard_dir)))
    if cfg.metrics.wandb_project:
        if installed("wandb"):
            exporters.append(WandbExporter(cfg, rundir, run_id))
        else:
            log.warning("metrics.wandb_project is set but wandb is not installed: not logging to W&B")
    return exporters
