"""Delta versions on the inference side: rebuilding the full weights of version V.

A delta version's directory holds the packed difference from version V-1 (`shared/delta.py`),
and its marker names that base (`delta_base`) and its version digest (`base_digest`). The
server applies it to the weights it serves only when they are that base, which the digests its
workers reported for them prove; otherwise, and for a server that serves nothing of this chain
yet (a joiner), it walks the markers back to the newest snapshot at or before V, loads that and
applies every delta after it. Each delta's `base_digest` must equal the version digest its base's
marker vouches for, and the rebuilt weights must have exactly the digests of V's marker before
a worker sees them. The rebuild streams: each tensor is read from the base's files, carried through
the chain and checked against its digest, then written, in safetensors files of at most
`SHARD_BYTES`, into this process's private directory (`work`), which vLLM's reload then reads like
any published version; the process holds the deltas and one file's tensors, not whole models.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import _TYPES as _TORCH_DTYPES  # the map vLLM reads safetensors dtypes by
from safetensors.torch import save_file

from shared.delta import WORD_TYPES, Delta, DeltaMismatch, from_words, to_words
from shared.digest import tensor_digest, version_digest
from shared.errors import TriadError
from shared.faults import INFERENCE_MID_APPLY, failpoint
from shared.objectcache import sweep_dead_dirs
from shared.rundir import DeltaFiles, Marker, RunDir, pull_step_dir
from shared.tmpname import TMP_PREFIX, owner_tag

log = logging.getLogger("triad.inference")
SHARD_BYTES = 64 * 2**20  # a rebuilt version's files: one is in memory at a time while written
WORK_PREFIX = "triad-deltas-"  # + "<pid>@<host>-<random>": a server's private directory of rebuilt versions


def work_dir(parent: Path | None = None) -> Path:
    """A new private directory for this process's rebuilt versions, in the system's temporary
    directory; the directories of processes gone (a server killed mid-run) are removed first."""
    parent = parent or Path(tempfile.gettempdir())
    if sweep_dead_dirs(parent.glob(f"{WORK_PREFIX}*"), WORK_PREFIX):
        log.info("removed the rebuilt weights of servers gone from %s", parent)
    return Path(tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{owner_tag()}-", dir=parent))


class ChainBroken(TriadError):
    """A delta chain that cannot be rebuilt exactly: a version pruned, a digest that differs."""


def is_delta(marker: Marker | None) -> bool:
    return marker is not None and getattr(marker, "delta_base", None) is not None


class BaseFiles:
    """The tensors of a full version's safetensors files, read one at a time (`safe_open`)."""

    def __init__(self, directory: Path) -> None:
        files = RunDir.tensor_files_at(directory)
        if not files:
            raise FileNotFoundError(f"no safetensors files in {directory}")
        self._stack = ExitStack()
        self.files, self.layout = {}, {}  # name: open file; name: (dtype, shape)
        for file in files:
            f = self._stack.enter_context(safe_open(file, framework="pt"))
            for name in f.keys():  # noqa: SIM118 (safe_open is no dict)
                part = f.get_slice(name)
                self.files[name] = f
                self.layout[name] = (_TORCH_DTYPES[part.get_dtype()], list(part.get_shape()))

    def words(self, name: str) -> Any:
        return to_words(self.files[name].get_tensor(name))

    def shapes(self) -> dict[str, Any]:
        """What `Delta.check` compares: each tensor's word count and word type."""
        import numpy as np

        return {
            name: SimpleNamespace(size=math.prod(shape), dtype=np.dtype(WORD_TYPES[dtype.itemsize]))
            for name, (dtype, shape) in self.layout.items()
        }

    def close(self) -> None:
        self._stack.close()


def shard_plan(layout: dict[str, tuple[torch.dtype, list[int]]], bound: int) -> list[list[str]]:
    """The tensors in file order, cut into files of at most `bound` bytes (or one tensor)."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, (dtype, shape) in layout.items():
        nbytes = dtype.itemsize * math.prod(shape)
        if shards[-1] and size + nbytes > bound:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    return shards


class DeltaChain:
    """Rebuilds delta versions for one server; `held` is the local directory of the version it
    serves (full safetensors), the base the next delta most likely names."""

    def __init__(self, rundir: RunDir, work: Path | None = None) -> None:
        self.rundir, self.files = rundir, DeltaFiles(rundir.weights)
        self._work = work  # made on the first rebuild: a server that never rebuilds leaves nothing
        self.held: tuple[int, Path, str] | None = None  # version, directory, version digest

    @property
    def work(self) -> Path:
        """This server's private directory of rebuilt versions (`work_dir`)."""
        if self._work is None:
            self._work = work_dir()
        return self._work

    def served(self, version: int, directory: Path | None, digest: str | None) -> None:
        """After a load: what the server now holds; rebuilt versions older than it are removed."""
        self.held = (version, directory, digest) if directory is not None and digest else None
        for old in self._work.iterdir() if self._work is not None and self._work.is_dir() else []:
            if directory is None or old != directory:
                shutil.rmtree(old, ignore_errors=True)

    def rebuild(self, version: int, marker: Marker, blob: bytes) -> Path:
        """The local directory of delta version `version` rebuilt exactly (see the module
        docstring); ChainBroken if it cannot be."""
        chain = [(version, marker, blob)]  # newest first
        pulled = None  # the snapshot's copy in the store's cache, dropped after the rebuild
        while True:
            base = chain[-1][1].delta_base
            start = self._held(base, chain[-1][1].base_digest)
            if start is not None:
                break
            base_marker, base_blob = self.files.read(base)
            if base_marker is None:
                raise ChainBroken(f"weights version {base}, the base of {chain[-1][0]}, is gone")
            self._check_link(chain[-1], base, base_marker)
            if not is_delta(base_marker):
                pulled, start = self._snapshot(base)
                break
            chain.append((base, base_marker, base_blob))
        try:
            return self._apply(self._open(start, f"the start of version {version}'s chain"), chain)
        finally:
            if pulled is not None:
                self.rundir.store.drop_local(pulled)

    def _held(self, base: int, base_digest: str) -> Path | None:
        """The served weights' directory, if they are `base` exactly (by digest) and still there."""
        if self.held is None or self.held[0] != base or self.held[2] != base_digest:
            return None
        if not RunDir.tensor_files_at(self.held[1]):  # pruned from a local run directory meanwhile
            log.info("the served version %d is gone: rebuilding from its snapshot", base)
            self.held = None
            return None
        return self.held[1]

    def _check_link(self, link: tuple[int, Marker, bytes], base: int, base_marker: Marker) -> None:
        vouched = version_digest(dict(getattr(base_marker, "tensor_digests", {}) or {}))
        if link[1].base_digest != vouched:
            raise ChainBroken(f"weights version {link[0]} names a base whose digest is not version {base}'s")

    def _snapshot(self, version: int) -> tuple[str, Path]:
        """The snapshot `version` in a local directory: (its key to drop after, the directory)."""
        log.info("rebuilding from the snapshot of version %d", version)
        return pull_step_dir(self.rundir, self.rundir.weights.relative(version))

    @staticmethod
    def _open(directory: Path, what: str) -> BaseFiles:
        try:
            return BaseFiles(directory)
        except OSError as e:
            raise ChainBroken(f"cannot read {what} ({e})") from None

    def _apply(self, base: BaseFiles, chain: list[tuple[int, Marker, bytes | None]]) -> Path:
        """Every delta of `chain` (newest first) applied to `base`, tensor by tensor: one tensor
        of the rebuilt version is in memory at a time beside the file being written."""
        try:
            deltas = []
            for version, _, blob in reversed(chain):
                if blob is None:
                    raise ChainBroken(f"weights version {version} has a marker but no delta")
                try:
                    delta = Delta(blob)
                    delta.check(base.shapes())
                except DeltaMismatch as e:
                    raise ChainBroken(f"weights version {version}: {e}") from None
                deltas.append((version, delta))
            version, marker, _ = chain[0]
            failpoint(INFERENCE_MID_APPLY, version)
            if sorted(marker.tensor_digests) != sorted(base.layout):
                raise ChainBroken(f"weights version {version}'s digests name other tensors than its base")
            return self._write(version, dict(marker.tensor_digests), base, deltas)
        finally:
            base.close()

    def _rebuilt(self, name: str, base: BaseFiles, deltas: list[tuple[int, Delta]]) -> torch.Tensor:
        words = base.words(name)
        for version, delta in deltas:
            try:
                words = delta.apply_one(name, words)
            except DeltaMismatch as e:
                raise ChainBroken(f"weights version {version}: {e}") from None
        return from_words(words, *base.layout[name])

    def _write(self, version: int, digests: dict[str, str], base: BaseFiles, deltas: list) -> Path:
        """The rebuilt tensors, each checked against its digest, written in files of at most
        `SHARD_BYTES` into a staging directory that becomes the version's only when all match."""
        target = self.work / self.rundir.weights.relative(version).replace("/", "-")
        staging = self.work / f"{TMP_PREFIX}{target.name}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        shards = shard_plan(base.layout, SHARD_BYTES)
        for i, names in enumerate(shards):
            tensors = {}
            for name in names:
                tensors[name] = self._rebuilt(name, base, deltas)
                if tensor_digest(tensors[name]) != digests[name]:
                    shutil.rmtree(staging, ignore_errors=True)
                    raise ChainBroken(
                        f"weights version {version} rebuilt from deltas differs from its digests ({name})"
                    )
            single = self.rundir.weights_file(version).name
            file = single if len(shards) == 1 else self.rundir.shard_name(i, len(shards))
            save_file(tensors, str(staging / file), metadata={"format": "pt"})
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        log.info("rebuilt weights version %d from deltas", version)
        return target
