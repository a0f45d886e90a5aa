"""Step directories (`rollouts/`, `weights/`, `checkpoints/`): each trusted only once its `DONE`
marker names this run; a LoRA version's files in PEFT's layout; and what can be read of a step
directory given by local path (what another service sent)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from shared.rundir.names import (
    _ADAPTER_CONFIG,
    _ADAPTER_FILE,
    _DELTA_FILE,
    _DONE,
    _WEIGHTS_SUFFIX,
    Handshake,
    parse_step,
    step_name,
)
from shared.storage import Storage
from shared.watch import DirWatch

log = logging.getLogger("triad.rundir")


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


_reported: set[tuple[str, str]] = set()


def _report_once(where: str, why: str) -> None:
    if (where, why) not in _reported:
        _reported.add((where, why))
        log.warning("ignoring %s: %s", where, why)


def _parse_marker(raw: bytes | None, where: str, run_id: str) -> Marker | None:
    if raw is None:
        return None
    try:
        marker = Marker.model_validate_json(raw)
    except ValidationError as e:
        _report_once(where, f"malformed marker ({e.errors()[0]['msg']})")
        return None
    if marker.run_id != run_id:
        _report_once(where, f"marker of run {marker.run_id!r}, not of this run {run_id!r}")
        return None
    return marker


class Steps:
    """The step directories of one kind (`rollouts`, `weights`, `checkpoints`), each trusted
    only once its `DONE` marker names this run."""

    def __init__(self, store: Storage, kind: str) -> None:
        self.store, self.kind = store, kind

    def key(self, step: int, *names: str) -> str:
        return "/".join((self.kind, step_name(step), *names))

    def path(self, step: int) -> Path:
        """The step directory, as a local path."""
        return self.store.local_path(self.key(step))

    def relative(self, step: int) -> str:
        """How services name the step directory to each other (each may mount it elsewhere)."""
        return self.key(step)

    def marker_path(self, step: int) -> Path:
        return self.store.local_path(self.key(step, _DONE))

    def describe_marker(self, step: int) -> str:
        """The marker's location, for messages about waiting on it."""
        return self.store.describe(self.key(step, _DONE))

    def watch(self) -> DirWatch | None:
        """What wakes a wait on a marker of this kind when it is written (None: poll only);
        the caller closes it."""
        return self.store.watch(self.kind)

    def steps(self) -> list[int]:
        """Step numbers of the directories of this kind (done or not), ascending."""
        found = (parse_step(name) for name in self.store.children(self.kind))
        return sorted(s for s in found if s is not None)

    def done_steps(self, run_id: str) -> list[int]:
        return [s for s in self.steps() if self.marker(s, run_id) is not None]

    def newest(self, run_id: str) -> int:
        """The newest done step of this run; 0 if none."""
        return max(self.done_steps(run_id), default=0)

    def has_marker(self, step: int) -> bool:
        """Whether the step has a marker at all (of any run, valid or not)."""
        return self.store.exists(self.key(step, _DONE))

    def marker(self, step: int, run_id: str) -> Marker | None:
        """The step's marker if the step is complete and belongs to `run_id`, else None.

        A marker from another run, or one that is not valid JSON, is reported (once)
        and treated as absent: the step is never trusted."""
        try:
            raw = self.store.read_bytes(self.key(step, _DONE))
        except OSError as e:
            _report_once(self.describe_marker(step), f"unreadable marker ({e.strerror or e})")
            return None
        return _parse_marker(raw, self.describe_marker(step), run_id)

    def write_marker(self, step: int, run_id: str, **fields: Any) -> Marker:
        """Vouch for everything already in the step directory: flush it all, then `DONE` last."""
        marker = Marker(run_id=run_id, step=step, created_at=time.time(), **fields)
        self.store.flush(self.key(step))
        self.store.write_bytes(self.key(step, _DONE), json.dumps(marker.model_dump(), indent=1).encode())
        return marker

    def clear(self, step: int) -> None:
        """Remove a step directory, marker first, so no reader trusts a partial one."""
        self.store.remove(self.key(step, _DONE))
        self.store.remove(self.key(step))

    def prune(self, keep_last: int, done_upto: int, protect: frozenset[int] = frozenset()) -> list[int]:
        """Delete step directories no consumer needs: those <= `done_upto`, except the
        newest `keep_last` of them and any in `protect` (e.g. checkpointed steps)."""
        finished = [s for s in self.steps() if s <= done_upto]
        doomed = [s for s in finished[: max(len(finished) - keep_last, 0)] if s not in protect]
        for step in doomed:
            self.clear(step)
        return doomed

    def copy_files(self, source: int, step: int, names: list[str]) -> bool:
        """Files `names` of step `source` into step `step` (hard links on a local store; in an
        object store server-side copies, all at once: each is a round trip); False, with none of
        them left in `step`, if any is missing in `source`."""
        if not names:
            return True
        with ThreadPoolExecutor(min(len(names), 8), thread_name_prefix="triad-copy") as pool:
            copied = list(pool.map(lambda n: self.store.copy(self.key(source, n), self.key(step, n)), names))
        if all(copied):
            return True
        for name, done in zip(names, copied, strict=True):
            if done:  # never leave a link that a later write could truncate in place
                self.store.remove(self.key(step, name))
        return False

    def size(self, step: int) -> int:
        return self.store.size(self.key(step))


class AdapterFiles:
    """A LoRA version's files in its weights step directory, in PEFT's layout."""

    def __init__(self, weights: Steps) -> None:
        self.weights = weights

    @contextmanager
    def writing(self, version: int) -> Iterator[Path]:
        """A local path for the adapter's tensors (published atomically)."""
        with self.weights.store.writing(self.weights.key(version, _ADAPTER_FILE)) as tmp:
            yield tmp

    def write_config(self, version: int, config: dict[str, Any]) -> None:
        body = json.dumps(config, indent=1).encode()
        self.weights.store.write_bytes(self.weights.key(version, _ADAPTER_CONFIG), body)

    @staticmethod
    def file_at(step_dir: Path) -> Path:
        return step_dir / _ADAPTER_FILE

    @staticmethod
    def config_at(step_dir: Path) -> Path:
        return step_dir / _ADAPTER_CONFIG

    @staticmethod
    def is_adapter_at(step_dir: Path) -> bool:
        """Whether a weights directory holds a LoRA adapter (not full weights)."""
        return AdapterFiles.config_at(step_dir).is_file() and AdapterFiles.file_at(step_dir).is_file()


class StepDirAt:
    """What can be read of a step directory given by local path (from `resolve_inside` or a
    fetched copy), of any run."""

    @staticmethod
    def has_marker_at(step_dir: Path) -> bool:
        return (step_dir / _DONE).is_file()

    @staticmethod
    def marker_at(step_dir: Path) -> Marker | None:
        """The valid marker of a step directory given by path (from `resolve_inside`), of any run:
        inference does not know the run id (the orchestrator checks it)."""
        try:
            return Marker.model_validate_json((step_dir / _DONE).read_bytes())
        except (OSError, ValidationError):
            return None

    @staticmethod
    def handshake_at(step_dir: Path, kind: Handshake) -> bytes | None:
        try:
            return (step_dir / kind.value).read_bytes()
        except OSError:
            return None

    @staticmethod
    def payload_bytes_at(step_dir: Path) -> int:
        """Bytes of every file in a step directory but its marker (what a weights marker vouches for)."""
        return sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file() and f.name != _DONE)

    @staticmethod
    def tensor_files_at(step_dir: Path) -> list[Path]:
        return sorted(step_dir.glob("*" + _WEIGHTS_SUFFIX))

    @staticmethod
    def marker_name() -> str:
        """The marker's file name, for messages only."""
        return _DONE


class DeltaFiles:
    """A delta version's difference from the version before, in its weights step directory
    (`shared/delta.py`)."""

    def __init__(self, weights: Steps) -> None:
        self.weights = weights

    @contextmanager
    def writing(self, version: int) -> Iterator[Path]:
        """A local path for the packed difference (published atomically)."""
        with self.weights.store.writing(self.weights.key(version, _DELTA_FILE)) as tmp:
            yield tmp

    @staticmethod
    def file_at(step_dir: Path) -> Path:
        return step_dir / _DELTA_FILE

    def read(self, version: int) -> tuple[Marker | None, bytes | None]:
        """A weights version's marker (of any run: inference does not know the run id), then
        its delta if it is one: the two small objects a delta chain needs, without a fetch."""
        raw = self.weights.store.read_bytes(self.weights.key(version, _DONE))
        try:
            marker = Marker.model_validate_json(raw or b"")
        except ValidationError:
            return None, None
        return marker, self.weights.store.read_bytes(self.weights.key(version, _DELTA_FILE))
