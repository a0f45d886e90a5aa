"""The run directory: every name, path and step marker in it, and nothing else.

Every file and directory name of a run directory is defined in this package
(`names.py`) and nowhere else (a unit test greps the code for them); services ask
`RunDir` for what they need by method. All access goes through a `Storage`
(`shared/storage.py`), so what lies under a run directory can change without
touching a service.

A step directory is trusted only once its `DONE` marker exists and names the
current run; files are written under a temporary name and renamed into place,
and the marker is written last.

The package, by concept: `names` (every name), `steps` (step directories and their markers,
adapter files, a step directory read by path), `weights_files` (a version's tensor and
handshake files), `metrics_files`, `fleet_registry`, `live_records` (each role's lease and
heartbeat), and here `RunDir`, which holds them all.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import ValidationError

from shared.errors import TriadError
from shared.rundir.fleet_registry import FleetRegistry
from shared.rundir.live_records import LiveRecords
from shared.rundir.metrics_files import MetricsFiles
from shared.rundir.names import (
    _BATCH_FILE,
    _CHECKPOINTS,
    _DONE,
    _LOGS,
    _PLOT,
    _ROLLOUTS,
    _RUN_FILE,
    _TENSORBOARD,
    _TIMELINE,
    _TRAINER_STATE,
    _WEIGHTS,
    EVAL,
    INFERENCE,
    ORCHESTRATOR,
    SERVICES,
    TRAINER,
    Handshake,
    parse_step,
    step_name,
)
from shared.rundir.steps import AdapterFiles, DeltaFiles, Marker, RunInfo, StepDirAt, Steps
from shared.rundir.weights_files import WeightsFiles
from shared.storage import LocalStore, Storage, open_store

__all__ = [
    "EVAL",
    "INFERENCE",
    "ORCHESTRATOR",
    "SERVICES",
    "TRAINER",
    "AdapterFiles",
    "DeltaFiles",
    "FleetRegistry",
    "Handshake",
    "LiveRecords",
    "Marker",
    "MetricsFiles",
    "RunDir",
    "RunInfo",
    "Steps",
    "has_marker",
    "parse_step",
    "pull_step_dir",
    "step_name",
]


class RunDir(WeightsFiles, StepDirAt):
    """A run directory: a local path, or an object-store URL (`s3://bucket/prefix`).
    `root` is its local directory (for an object store: this machine's cache of it)."""

    def __init__(self, root: Path | str, store: Storage | None = None) -> None:
        self.store: Storage = store or open_store(root)
        self.name = str(root)
        self.root = self.store.local_path("")
        self.rollouts, self.weights = Steps(self.store, _ROLLOUTS), Steps(self.store, _WEIGHTS)
        self.checkpoints = Steps(self.store, _CHECKPOINTS)
        self.adapters = AdapterFiles(self.weights)
        self.fleet = FleetRegistry(self.store)
        self.live = LiveRecords(self.store)
        self.metrics = MetricsFiles(self.store)

    @classmethod
    def of(cls, cfg: Any) -> RunDir:
        """The run directory of a `TriadConfig`, with its `[store]` settings."""
        return cls(cfg.run_dir, open_store(cfg.run_dir, cfg.store.cache_dir, cfg.store.timeout_s))

    def __repr__(self) -> str:
        return f"RunDir({self.name!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    # -- the run record -------------------------------------------------------
    @property
    def run_file(self) -> Path:
        return self.store.local_path(_RUN_FILE)

    def check_writable(self) -> None:
        self.store.check_writable()

    def ensure_run(self, config: dict[str, Any]) -> RunInfo:
        """Read the run record, or create it if this is a new run; the first writer wins."""
        self.check_writable()
        if not self.store.exists(_RUN_FILE):
            info = RunInfo(run_id=uuid.uuid4().hex[:12], created_at=time.time(), config=config)
            self.store.create_once(_RUN_FILE, info.model_dump_json(indent=1).encode())
        return self.read_run()

    def read_run(self) -> RunInfo:
        raw = self.store.read_bytes(_RUN_FILE)
        if raw is None:
            raise TriadError(
                f"{self.store.describe(_RUN_FILE)} does not exist: is this a triad run directory?"
            )
        try:
            return RunInfo.model_validate_json(raw)
        except ValidationError as e:
            where = self.store.describe(_RUN_FILE)
            raise TriadError(f"{where} is not a valid run file: {e.errors()[0]['msg']}") from None

    # -- batches --------------------------------------------------------------
    def batch_file(self, step: int) -> Path:
        return self.store.local_path(self.rollouts.key(step, _BATCH_FILE))

    @contextmanager
    def writing_batch(self, step: int) -> Iterator[Path]:
        """A local path to write batch `step` to (published atomically; the marker comes after)."""
        with self.store.writing(self.rollouts.key(step, _BATCH_FILE)) as tmp:
            yield tmp

    def batch_source(self, step: int) -> tuple[bytes | None, str]:
        """Batch `step`'s bytes (None if missing) and where they come from."""
        key = self.rollouts.key(step, _BATCH_FILE)
        return self.store.read_bytes(key), self.store.describe(key)

    # -- checkpoints ----------------------------------------------------------
    def trainer_state_dir(self, step: int) -> Path:
        """The local directory of the trainer's DCP state after update `step` (or its fetched copy)."""
        return self.store.local_path(self.checkpoints.key(step, _TRAINER_STATE))

    def trainer_state_key(self, step: int) -> str:
        return self.checkpoints.key(step, _TRAINER_STATE)

    # -- metrics, logs, reports ----------------------------------------------
    def metrics_file(self, service: str) -> Path:
        """A service's own metrics file on a local store (`metrics.rows` reads every store, and
        the files of every inference server)."""
        return self.store.local_path(self.metrics.key(service))

    def log_file(self, service: str) -> Path:
        return self.store.local_path(f"{_LOGS}/{service}.log")

    @property
    def logs_dir(self) -> Path:
        return self.store.local_path(_LOGS)

    @property
    def tensorboard_dir(self) -> Path:
        return self.store.local_path(_TENSORBOARD)

    def plot_file(self, timeline: bool = False) -> Path:
        """`triad plot`'s figures: reward, lag and throughput, or the per-step timeline."""
        return self.store.local_path(_TIMELINE if timeline else _PLOT)

    # -- paths other services send -------------------------------------------
    def relative(self, path: Path) -> str:
        """`path` relative to the run directory: how services name files to each other."""
        return path.relative_to(self.root).as_posix()

    def resolve_inside(self, raw: str) -> Path:
        """The directory `raw` names (relative to the run directory, or absolute), which must lie
        inside it once `..` and symlinks are resolved; TriadError otherwise."""
        root = self.root.resolve()
        path = Path(raw)
        path = (path if path.is_absolute() else root / path).resolve()
        if not path.is_relative_to(root):
            raise TriadError(f"path {raw!r} is outside the run directory")
        if not path.is_dir():
            raise TriadError(f"path {raw!r} is not a directory")
        return path


def pull_step_dir(rundir: RunDir, raw: str) -> tuple[str, Path]:
    """The step directory `raw` names (relative to the run directory; on a local store also
    absolute inside it), as (its relative name, a local directory holding it). From an
    object store it is fetched into the cache, its marker first and written last;
    `store.drop_local(name)` forgets the copy. TriadError if it lies outside the run directory."""
    if isinstance(rundir.store, LocalStore):
        path = rundir.resolve_inside(raw)
        return path.relative_to(rundir.root.resolve()).as_posix(), path
    key = PurePosixPath(raw)
    if key.is_absolute() or ".." in key.parts or not key.parts:
        raise TriadError(f"path {raw!r} is outside the run directory")
    if not rundir.store.children(key.as_posix(), dirs=False):
        raise TriadError(f"path {raw!r} is not a directory")
    return key.as_posix(), rundir.store.fetch(key.as_posix(), last=_DONE)


def has_marker(rundir: RunDir, relative: str) -> bool:
    """Whether the step directory named relative to the run directory (as services send it)
    has its marker in the store."""
    return rundir.store.exists(f"{relative.rstrip('/')}/{_DONE}")
