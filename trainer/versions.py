"""Writing one weights version into the run directory, whatever its payload.

Every version is written the same way: its directory cleared, the payload's files, their size
and the tensors' digests, then `DONE` (the payload's own fields beside the digests), then old
versions pruned. The payload is the strategy: full safetensors (`FullWeights`), a delta from
the version before (`Delta`) or a LoRA adapter (`Adapter`). Versions whose files other ranks
wrote (shards, `index_shards`) or that have none (a broadcast) are finished with
`finish_version` alone.
`VersionWriter` chooses between a full snapshot and a delta for each version.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors.torch import save_file

from shared.delta import DeltaMismatch, pack, to_words
from shared.digest import tensor_digest, version_digest
from shared.faults import TRAINER_BEFORE_DELTA_MARKER, failpoint
from shared.resume import checkpointed_steps
from shared.rundir import DeltaFiles, RunDir

log = logging.getLogger("triad.trainer")


@dataclass(frozen=True)
class Written:
    """What writing a version took: the seconds of the files with the digests, of the digests
    alone, and the tensors' digests."""

    write_s: float
    digest_s: float
    digests: dict[str, str]


def timed_digests(state: dict[str, torch.Tensor]) -> tuple[dict[str, str], float]:
    """Each tensor's digest, and the seconds they took (the `digest_s` metric)."""
    started = time.monotonic()
    digests = {name: tensor_digest(tensor) for name, tensor in state.items()}
    return digests, time.monotonic() - started


class Metadata:
    """A version's metadata files (config, tokenizer, generation config): rendered with
    `save_pretrained` for the first version this process publishes, then linked (copied in an
    object store) from the previous version it published; rendered again if that is gone."""

    def __init__(self, rundir: RunDir, save: Callable[[Path], None]) -> None:
        self.rundir, self.save = rundir, save
        self.names: list[str] = []  # the files `save` writes
        self.last: int | None = None  # the newest version holding them, written by this process

    def put(self, version: int) -> None:
        """The metadata files into `weights/step_V/` (cleared by the caller)."""
        if self.last is not None and self.rundir.weights.copy_files(self.last, version, self.names):
            self.last = version
            return
        with self.rundir.writing_weights_dir(version) as directory:
            self.save(directory)
            self.names = sorted(p.name for p in directory.iterdir() if p.is_file())
        self.last = version


class Payload(Protocol):
    state: dict[str, torch.Tensor]  # the tensors the version's digests are of

    def write_files(self, rundir: RunDir, version: int) -> None:
        """The version's files, into its cleared directory."""

    def marker_fields(self) -> dict[str, Any]:
        """What `DONE` says of this payload, beside the size and the digests."""


@dataclass(frozen=True)
class FullWeights:
    """The whole model: config, tokenizer and one safetensors file, as Hugging Face lays it out."""

    state: dict[str, torch.Tensor]
    metadata: Metadata

    def write_files(self, rundir: RunDir, version: int) -> None:
        self.metadata.put(version)
        with rundir.writing_tensors(version) as tmp:
            save_file(self.state, tmp, metadata={"format": "pt"})

    def marker_fields(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class DeltaBase:
    """A version this process published as files, kept as the base of the next delta."""

    version: int
    words: dict[str, Any]  # a copy of each tensor's words (`shared/delta.py`): never the live parameters
    digests: dict[str, str]

    @classmethod
    def of(cls, version: int, state: dict[str, torch.Tensor], digests: dict[str, str]) -> DeltaBase:
        return cls(version, {n: to_words(t).copy() for n, t in state.items()}, digests)


class Delta:
    """The difference from `base` (config, tokenizer and the packed difference, `shared/delta.py`);
    packed when made, so `DeltaMismatch` comes before anything is written."""

    def __init__(self, state: dict[str, torch.Tensor], base: DeltaBase, metadata: Metadata) -> None:
        self.state, self.base, self.metadata = state, base, metadata
        self.blob = pack(base.words, {n: to_words(t) for n, t in state.items()})

    def write_files(self, rundir: RunDir, version: int) -> None:
        self.metadata.put(version)
        with DeltaFiles(rundir.weights).writing(version) as tmp:
            tmp.write_bytes(self.blob)
        failpoint(TRAINER_BEFORE_DELTA_MARKER, version)

    def marker_fields(self) -> dict[str, Any]:
        return {"delta_base": self.base.version, "base_digest": version_digest(self.base.digests)}


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter alone, in PEFT's layout (`adapter_config.json`, adapter safetensors)."""

    state: dict[str, torch.Tensor]
    config: dict

    def write_files(self, rundir: RunDir, version: int) -> None:
        rundir.adapters.write_config(version, self.config)
        with rundir.adapters.writing(version) as tmp:
            save_file(self.state, tmp, metadata={"format": "pt"})

    def marker_fields(self) -> dict[str, Any]:
        return {"adapter": True}


def write_version(
    rundir: RunDir,
    run_id: str,
    version: int,
    payload: Payload,
    keep_last: int,
    protect: frozenset[int] = frozenset(),
) -> Written:
    """`weights/step_V/` with `payload`'s files, then its `DONE` with the tensors' digests, then
    the versions no consumer needs pruned (`protect`ed ones kept)."""
    started = time.monotonic()
    rundir.weights.clear(version)
    payload.write_files(rundir, version)
    size = rundir.weights.size(version)
    digests, digest_s = timed_digests(payload.state)
    written = Written(time.monotonic() - started, digest_s, digests)
    finish_version(rundir, run_id, version, size, digests, keep_last, protect, **payload.marker_fields())
    return written


def finish_version(
    rundir: RunDir,
    run_id: str,
    version: int,
    size: int,
    digests: dict[str, str],
    keep_last: int,
    protect: frozenset[int],
    files: bool = True,
    **fields: Any,
) -> None:
    """`DONE` for version V, whose files (`size` bytes) are all in place, or which has none
    (`files` false: a broadcast), with the digests of its tensors; then old versions pruned."""
    digest = {"digest": version_digest(digests), "tensor_digests": digests}
    rundir.weights.write_marker(version, run_id, version=version, bytes=size, files=files, **fields, **digest)
    rundir.weights.prune(keep_last, done_upto=version, protect=protect)


def index_shards(rundir: RunDir, version: int, names: list[str], world: int) -> int:
    """The Hugging Face index of a version written as one shard per rank (tensor i in shard
    i mod world); returns the tensors' bytes."""
    size = rundir.tensor_bytes(version)
    weight_map = {name: rundir.shard_name(i % world, world) for i, name in enumerate(names)}
    rundir.write_weights_index(version, {"metadata": {"total_size": size}, "weight_map": weight_map})
    return size


class VersionWriter:
    """Rank 0's choice between a full snapshot and a delta for each version published as files
    (`weights.snapshot_every` = K), and the version the next delta starts from."""

    def __init__(self, rundir: RunDir, metadata: Metadata, every: int, keep: int) -> None:
        self.rundir, self.metadata, self.every, self.keep = rundir, metadata, every, keep
        self.base: DeltaBase | None = None  # the last version written
        self.snapshot = 0  # the newest full snapshot

    def delta_base(self, version: int, snapshot: bool) -> DeltaBase | None:
        if snapshot or self.every == 1 or version % self.every == 0:
            return None
        return self.base if self.base is not None and self.base.version == version - 1 else None

    def write(self, version: int, run_id: str, exported: dict[str, torch.Tensor], snapshot: bool) -> Written:
        """Version V as a delta from V-1, unless `snapshot` (a checkpoint), V is a multiple of
        K or there is no V-1 to start from. Kept from pruning: checkpointed versions, and the
        newest snapshot with every delta after it."""
        base = self.delta_base(version, snapshot)
        if base is not None:
            protect = checkpointed_steps(self.rundir, run_id) | frozenset(range(self.snapshot, version + 1))
            try:
                delta = Delta(exported, base, self.metadata)
            except DeltaMismatch as e:
                log.warning("version %d: publishing a full snapshot, not a delta: %s", version, e)
            else:
                written = write_version(self.rundir, run_id, version, delta, self.keep, protect)
                self.base = self.next_base(version, exported, written.digests)
                return written
        protect = checkpointed_steps(self.rundir, run_id) | frozenset([version])
        full = FullWeights(exported, self.metadata)
        written = write_version(self.rundir, run_id, version, full, self.keep, protect)
        self.snapshot, self.base = version, self.next_base(version, exported, written.digests)
        return written

    def next_base(
        self, version: int, exported: dict[str, torch.Tensor], digests: dict[str, str]
    ) -> DeltaBase | None:
        """A copy of version V, the base of V+1's delta; none (no second model in memory) when
        V+1 is a full snapshot anyway: deltas off (K = 1), or V+1 a multiple of K."""
        if self.every == 1 or (version + 1) % self.every == 0:
            return None
        return DeltaBase.of(version, exported, digests)
