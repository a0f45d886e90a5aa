"""The run directory: every name, path and step marker in it, and nothing else.

Every file and directory name of a run directory is defined here and nowhere
else (a unit test greps the code for them); services ask `RunDir` for what
they need by method. All access goes through a `Storage` (`shared/storage.py`),
so what lies under a run directory can change without touching a service.

A step directory is trusted only once its `DONE` marker exists and names the
current run; files are written under a temporary name and renamed into place,
and the marker is written last.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from shared.errors import TriadError
from shared.metrics import MetricsWriter, parse_metrics
from shared.storage import LocalStore, Storage, open_store
from shared.watch import DirWatch

log = logging.getLogger("triad.rundir")

_DONE = "DONE"
_RUN_FILE = "run.json"
_BATCH_FILE = "batch.parquet"
_WEIGHTS_FILE = "model.safetensors"
_WEIGHTS_INDEX = "model.safetensors.index.json"
_WEIGHTS_SUFFIX = ".safetensors"
_ADAPTER_FILE = "adapter_model.safetensors"  # PEFT's layout, which vLLM loads as a LoRA adapter
_ADAPTER_CONFIG = "adapter_config.json"
_DELTA_FILE = "model.delta"  # a delta version's difference from the one before (`shared/delta.py`)
_TRAINER_STATE = "trainer"
_ROLLOUTS, _WEIGHTS, _CHECKPOINTS = "rollouts", "weights", "checkpoints"
_METRICS, _LOGS, _TENSORBOARD, _PLOT = "metrics", "logs", "tensorboard", "plot.png"
_FLEET, _FLEET_SUFFIX = "fleet", ".json"
_METRICS_SUFFIX = ".jsonl"
_METRICS_NAME = re.compile(r"(?P<service>[a-z]+)(-(?P<server>[0-9a-f]+))?(\.(?P<part>\d{5}))?\.jsonl")
_SERVER_ID = re.compile(r"[0-9a-f]+")
_TIMELINE = "timeline.png"
_STEP_PREFIX = "step_"
_STEP_DIGITS = 6

INFERENCE, ORCHESTRATOR, TRAINER = "inference", "orchestrator", "trainer"
SERVICES = (ORCHESTRATOR, TRAINER, INFERENCE)  # also the names of their metrics and log files
EVAL = "eval"  # the orchestrator's evaluation metrics


class Handshake(StrEnum):
    """The weight-broadcast handshake files in a weights step directory (`shared/broadcast.py`)."""

    SEND_READY = "SEND_READY"
    RECEIVING = "RECEIVING"
    FALLBACK = "FALLBACK"


def step_name(step: int) -> str:
    return f"{_STEP_PREFIX}{step:0{_STEP_DIGITS}d}"


def parse_step(name: str) -> int | None:
    digits = name.removeprefix(_STEP_PREFIX)
    if name == digits or len(digits) != _STEP_DIGITS or not digits.isdigit():
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
        """Files `names` of step `source` into step `step` (hard links on a local store); False,
        with none of them left in `step`, if any is missing in `source`."""
        done = []
        for name in names:
            if not self.store.copy(self.key(source, name), self.key(step, name)):
                for copied in done:  # never leave a link that a later write could truncate in place
                    self.store.remove(self.key(step, copied))
                return False
            done.append(name)
        return True

    def size(self, step: int) -> int:
        return self.store.size(self.key(step))


class MetricsFiles:
    """The metrics of every service under `metrics/`, through the store.

    A service's rows are in `<service>.jsonl`; each inference server (several may serve one
    run) writes its own `inference-<server id>.jsonl`. On an object store a writer's rows are
    rotated into parts of `PART_ROWS` (`<name>.jsonl`, then `<name>.00001.jsonl`, ...), since
    each row rewrites its part. `rows` reads and merges them all."""

    PART_ROWS = 500

    def __init__(self, store: Storage) -> None:
        self.store = store

    @staticmethod
    def key(service: str, server_id: str | None = None, part: int = 0) -> str:
        name = service if server_id is None else f"{service}-{server_id}"
        return f"{_METRICS}/{name}{f'.{part:05d}' if part else ''}{_METRICS_SUFFIX}"

    def files(self, service: str) -> list[tuple[str, int, str]]:
        """(server id or "", part, key) of each of a service's metrics files, in that order."""
        found = []
        for name in self.store.children(_METRICS, dirs=False):
            match = _METRICS_NAME.fullmatch(name)
            if match and match["service"] == service:
                found.append((match["server"] or "", int(match["part"] or 0), f"{_METRICS}/{name}"))
        return sorted(found)

    def writer(self, service: str, server_id: str | None = None) -> MetricsWriter:
        if server_id is not None and not _SERVER_ID.fullmatch(server_id):
            raise TriadError(f"server id {server_id!r} is not a lowercase hex string")
        key = self.key(service, server_id)
        if isinstance(self.store, LocalStore):
            return MetricsWriter(self.store, key)

        def last_part() -> int:
            return max((p for s, p, _ in self.files(service) if s == (server_id or "")), default=0)

        part_key = lambda part: self.key(service, server_id, part)  # noqa: E731
        return MetricsWriter(self.store, key, self.PART_ROWS, part_key, last_part)

    def rows(self, service: str) -> list[dict[str, Any]]:
        """All complete rows of a service's metrics (a torn last line is skipped): one writer's
        in the order written, several writers' merged by time; an inference server's rows
        carry its id as `server`."""
        files = self.files(service)
        rows = []
        for server, _, key in files:
            for row in parse_metrics(self.store.read_bytes(key)):
                rows.append({**row, "server": server} if server else row)
        if len({server for server, _, _ in files}) > 1:
            rows.sort(key=lambda r: r.get("time", 0.0))
        return rows

    def drop_after(self, service: str, step: int) -> int:
        """Rewrite a service's metrics without rows of steps after `step`; returns how many.
        A part left empty is removed (a writer continues at the last part there is)."""
        dropped = 0
        for _, part, key in self.files(service):
            rows = parse_metrics(self.store.read_bytes(key))
            kept = [r for r in rows if r.get("step", 0) <= step]
            if len(kept) == len(rows):
                continue
            dropped += len(rows) - len(kept)
            if part and not kept:
                self.store.remove(key)
            else:
                self.store.write_bytes(key, "".join(json.dumps(r) + "\n" for r in kept).encode())
        return dropped


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
    def is_adapter_at(step_dir: Path) -> bool:
        """Whether a weights directory holds a LoRA adapter (not full weights)."""
        return (step_dir / _ADAPTER_CONFIG).is_file() and (step_dir / _ADAPTER_FILE).is_file()


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


class FleetRegistry:
    """`fleet/`: one record per inference server that joined the run (`shared/fleet.py`)."""

    def __init__(self, store: Storage) -> None:
        self.store = store

    def key(self, server_id: str) -> str:
        return f"{_FLEET}/{server_id}{_FLEET_SUFFIX}"

    def write(self, server_id: str, body: bytes) -> None:
        self.store.write_bytes(self.key(server_id), body)

    def remove(self, server_id: str) -> None:
        self.store.remove(self.key(server_id))

    def read_all(self) -> dict[str, bytes]:
        """The records by server id (one that vanished between listing and reading is left out)."""
        out = {}
        for name in self.store.children(_FLEET, dirs=False):
            server_id = name.removesuffix(_FLEET_SUFFIX)
            raw = self.store.read_bytes(self.key(server_id)) if name.endswith(_FLEET_SUFFIX) else None
            if raw is not None:
                out[server_id] = raw
        return out

    def describe(self) -> str:
        """The registry's location, for messages."""
        return self.store.describe(_FLEET)


class RunDir:
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

    # -- weights --------------------------------------------------------------
    def weights_file(self, version: int) -> Path:
        """The single safetensors file of an unsharded version."""
        return self.store.local_path(self.weights.key(version, _WEIGHTS_FILE))

    @staticmethod
    def shard_name(rank: int, world: int) -> str:
        return f"model-{rank + 1:05d}-of-{world:05d}{_WEIGHTS_SUFFIX}"

    def shard_file(self, version: int, rank: int, world: int) -> Path:
        return self.store.local_path(self.weights.key(version, self.shard_name(rank, world)))

    def tensor_files(self, version: int) -> list[str]:
        """Names of the safetensors files of a version."""
        files = self.store.children(self.weights.key(version), dirs=False)
        return [f for f in files if f.endswith(_WEIGHTS_SUFFIX)]

    def tensor_bytes(self, version: int) -> int:
        return sum(self.store.size(self.weights.key(version, f)) for f in self.tensor_files(version))

    @contextmanager
    def writing_tensors(self, version: int, rank: int | None = None, world: int = 1) -> Iterator[Path]:
        """A local path for a version's safetensors file (or with `rank`, its shard)."""
        name = _WEIGHTS_FILE if rank is None else self.shard_name(rank, world)
        with self.store.writing(self.weights.key(version, name)) as tmp:
            yield tmp

    def write_weights_index(self, version: int, index: dict[str, Any]) -> None:
        self.store.write_bytes(
            self.weights.key(version, _WEIGHTS_INDEX), json.dumps(index, indent=1).encode()
        )

    @contextmanager
    def writing_weights_dir(self, version: int) -> Iterator[Path]:
        """A local directory for a version's metadata (config, tokenizer)."""
        with self.store.writing_dir(self.weights.key(version)) as path:
            yield path

    def handshake_key(self, version: int, kind: Handshake) -> str:
        return self.weights.key(version, kind.value)

    def read_handshake(self, version: int, kind: Handshake) -> bytes | None:
        return self.store.read_bytes(self.handshake_key(version, kind))

    def write_handshake(self, version: int, kind: Handshake, body: bytes) -> None:
        self.store.write_bytes(self.handshake_key(version, kind), body)

    def has_handshake(self, version: int, kind: Handshake) -> bool:
        return self.store.exists(self.handshake_key(version, kind))

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
