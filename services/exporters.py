"""Copies of the JSONL metrics for TensorBoard and Weights & Biases, when available.

`triad up` feeds every new metrics row to these; the JSONL files stay the source
of truth. Each exporter is optional: a missing package disables it with one
log line, never the run.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from contextlib import AbstractContextManager
from numbers import Number
from pathlib import Path
from typing import Protocol

from shared.config import TriadConfig
from shared.diskspace import RUN_DIR_ADVICE, full_disk_is_one_line
from shared.rundir import RunDir

log = logging.getLogger("triad.metrics")


class Exporter(Protocol):
    def write(self, service: str, row: dict) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict) -> dict[str, float]:
    return {k: float(v) for k, v in row.items() if k not in ("step", "time") and isinstance(v, Number)}


class TensorBoardExporter:
    """Its event file is in the run directory: a full disk there is one line, as for every
    other writer of the run (TensorBoard's writer thread reports it at a later call)."""

    def __init__(self, log_dir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        with self._full_disk_is_one_line():
            self.writer = SummaryWriter(log_dir=log_dir)

    def _full_disk_is_one_line(self) -> AbstractContextManager[None]:
        return full_disk_is_one_line(self.log_dir, "TensorBoard events", RUN_DIR_ADVICE)

    def write(self, service: str, row: dict) -> None:
        with self._full_disk_is_one_line():
            for key, value in scalars(row).items():
                self.writer.add_scalar(f"{service}/{key}", value, row["step"])

    def close(self) -> None:
        with self._full_disk_is_one_line():
            self.writer.close()


class WandbExporter:
    def __init__(self, cfg: TriadConfig, rundir: RunDir, run_id: str) -> None:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(
            project=cfg.metrics.wandb_project,
            id=run_id,
            resume="allow",
            mode=cfg.metrics.wandb_mode,
            dir=str(rundir.root),
            config=cfg.public_dict(),
        )

    def write(self, service: str, row: dict) -> None:
        self.run.log({f"{service}/{k}": v for k, v in scalars(row).items()} | {"step": row["step"]})

    def close(self) -> None:
        self.run.finish()


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def make_exporters(cfg: TriadConfig, rundir: RunDir, run_id: str) -> list[Exporter]:
    exporters: list[Exporter] = []
    if cfg.metrics.tensorboard and installed("tensorboard") and installed("torch"):
        exporters.append(TensorBoardExporter(str(rundir.tensorboard_dir)))
    if cfg.metrics.wandb_project:
        if installed("wandb"):
            exporters.append(WandbExporter(cfg, rundir, run_id))
        else:
            log.warning("metrics.wandb_project is set but wandb is not installed: not logging to W&B")
    return exporters
