"""The run directory: names, paths, step markers and atomic publishing.

Every path and marker name in the run directory is defined here and nowhere
else. A step directory is trusted only once its `DONE` marker exists and names
the current run; files are written under a temporary name and renamed into
place, and the marker is written last.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from shared.errors import TriadError

log = logging.getLogger(__name__)

DONE = "DONE"
RUN_FILE = "run.json"
BATCH_FILE = "batch.parquet"
ROLLOUTS = "rollouts"
WEIGHTS = "weights"
CHECKPOINTS = "checkpoints"
METRICS = "metrics"
LOGS = "logs"
INFERENCE, ORCHESTRATOR, TRAINER = "inference", "orchestrator", "trainer"
SERVICES = (ORCHESTRATOR, TRAINER, INFERENCE)  # also the names of their metrics and log files
EVAL = "eval"  # the orchestrator's evaluation metrics: metrics/eval.jsonl
STEP_PREFIX = "step_"
STEP_DIGITS = 6
TMP_PREFIX = ".tmp-"
FILE_MODE = 0o644  # mkstemp's 0600 would hide published files from services running as other users


def step_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:0{STEP_DIGITS}d}"


def parse_step(name: str) -> int | None:
    digits = name.removeprefix(STEP_PREFIX)
    if name == digits or len(digits) != STEP_DIGITS or not digits.isdigit():
        return None
    return int(digits)


class Marker(BaseModel):
    """The JSON body of a `DONE` marker; kinds add their own fields."""

    model_config = ConfigDict(extra="allow")

    run_id: str
    step: int
    created_at: float


class RunInfo(BaseModel):
    run_id: str
    created_at: float
    config: dict[str, Any]


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def run_file(self) -> Path:
        return self.root / RUN_FILE

    def rollout_dir(self, step: int) -> Path:
        return self.root / ROLLOUTS / step_name(step)

    def batch_file(self, step: int) -> Path:
        return self.rollout_dir(step) / BATCH_FILE

    def weights_dir(self, step: int) -> Path:
        return self.root / WEIGHTS / step_name(step)

    def checkpoint_dir(self, step: int) -> Path:
        return self.root / CHECKPOINTS / step_name(step)

    def metrics_file(self, service: str) -> Path:
        return self.root / METRICS / f"{service}.jsonl"

    def log_file(self, service: str) -> Path:
        return self.root / LOGS / f"{service}.log"

    def relative(self, path: Path) -> str:
        """`path` relative to the run directory: how services name files to each
        other, since each may mount the run directory somewhere else."""
        return path.relative_to(self.root).as_posix()

    def step_dir(self, kind: str, step: int) -> Path:
        return self.root / kind / step_name(step)

    def done_steps(self, kind: str, run_id: str) -> list[int]:
        """Steps under `kind` whose `DONE` marker is valid and of this run, ascending."""
        return [s for s in self.steps(kind) if read_marker(self.step_dir(kind, s), run_id) is not None]

    def steps(self, kind: str) -> list[int]:
        """Step numbers of the directories under `kind` (done or not), ascending."""
        parent = self.root / kind
        if not parent.is_dir():
            return []
        found = (parse_step(p.name) for p in parent.iterdir() if p.is_dir())
        return sorted(s for s in found if s is not None)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it into place on success."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.name, dir=path.parent)
    os.fchmod(fd, FILE_MODE)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    finally:
        tmp_path.unlink(missing_ok=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, json.dumps(obj, indent=1).encode())


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under `root` to disk."""
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(dirpath))


def write_marker(step_dir: Path, run_id: str, step: int, **fields: Any) -> Marker:
    """Vouch for everything already in `step_dir`: flush it all, then write `DONE` last."""
    marker = Marker(run_id=run_id, step=step, created_at=time.time(), **fields)
    fsync_tree(step_dir)
    atomic_write_json(step_dir / DONE, marker.model_dump())
    return marker


_reported: set[tuple[str, str]] = set()


def _report_once(path: Path, why: str) -> None:
    if (str(path), why) not in _reported:
        _reported.add((str(path), why))
        log.warning("ignoring %s: %s", path, why)


def read_marker(step_dir: Path, run_id: str) -> Marker | None:
    """The step's marker if the step is complete and belongs to `run_id`, else None.

    A marker from another run, or one that is not valid JSON, is reported
    (once) and treated as absent: the step is never trusted.
    """
    path = step_dir / DONE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        _report_once(path, f"unreadable marker ({e.strerror})")
        return None
    try:
        marker = Marker.model_validate_json(raw)
    except ValidationError as e:
        _report_once(path, f"malformed marker ({e.errors()[0]['msg']})")
        return None
    if marker.run_id != run_id:
        _report_once(path, f"marker of run {marker.run_id!r}, not of this run {run_id!r}")
        return None
    return marker


def clear_step_dir(step_dir: Path) -> None:
    """Remove a step directory, marker first, so no reader trusts a partial one."""
    (step_dir / DONE).unlink(missing_ok=True)
    shutil.rmtree(step_dir, ignore_errors=True)


def prune_steps(
    parent: Path, keep_last: int, done_upto: int, protect: frozenset[int] = frozenset()
) -> list[int]:
    """Delete step directories no consumer needs: those <= `done_upto`, except the
    newest `keep_last` of them and any in `protect` (e.g. checkpointed steps)."""
    steps = sorted(s for p in parent.glob(STEP_PREFIX + "*") if (s := parse_step(p.name)) is not None)
    finished = [s for s in steps if s <= done_upto]
    doomed = [s for s in finished[: max(len(finished) - keep_last, 0)] if s not in protect]
    for step in doomed:
        clear_step_dir(parent / step_name(step))
    return doomed


def check_writable(root: Path) -> None:
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f"{TMP_PREFIX}probe-{uuid.uuid4().hex}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise TriadError(f"run directory {root} is not writable: {e.strerror or e}") from None


def ensure_run(root: Path, config: dict[str, Any]) -> RunInfo:
    """Read run.json, or create it if this is a new run; the first writer wins."""
    check_writable(root)
    run_file = root / RUN_FILE
    if not run_file.exists():
        info = RunInfo(run_id=uuid.uuid4().hex[:12], created_at=time.time(), config=config)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=root)
        os.fchmod(fd, FILE_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(info.model_dump_json(indent=1))
        try:
            os.link(tmp, run_file)  # fails if another service created it first
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return read_run(root)


def read_run(root: Path) -> RunInfo:
    run_file = root / RUN_FILE
    try:
        return RunInfo.model_validate_json(run_file.read_bytes())
    except FileNotFoundError:
        raise TriadError(f"{run_file} does not exist: is this a triad run directory?") from None
    except ValidationError as e:
        raise TriadError(f"{run_file} is not a valid run file: {e.errors()[0]['msg']}") from None
