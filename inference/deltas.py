"""Delta versions on the inference side: rebuilding the full weights of version V.

A delta version's directory holds the packed difference from version V-1 (`shared/delta.py`),
and its marker names that base (`delta_base`) and its version digest (`base_digest`). The
server applies it to the weights it serves only when they are that base, which the digests its
workers reported for them prove; otherwise, and for a server that serves nothing of this chain
yet (a joiner), it walks the markers back to the newest snapshot at or before V, loads that and
applies every delta after it. Each delta's `base_digest` must equal the version digest its base's
marker vouches for, and the rebuilt weights must have exactly the digests of V's marker before
a worker sees them. The rebuilt version is written as one safetensors file into this process's
private directory (`work`), which vLLM's reload then reads like any published version.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from shared.delta import DeltaMismatch, apply, from_words, to_words
from shared.digest import tensor_digest, version_digest
from shared.errors import TriadError
from shared.faults import INFERENCE_MID_APPLY, failpoint
from shared.objectcache import sweep_dead_dirs
from shared.rundir import DeltaFiles, Marker, RunDir, pull_step_dir
from shared.tmpname import TMP_PREFIX, owner_tag

log = logging.getLogger("triad.inference")
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


class Weights:
    """A full version in memory: each tensor's words, dtype and shape."""

    def __init__(self, words: dict[str, Any], layout: dict[str, tuple[torch.dtype, list[int]]]) -> None:
        self.words, self.layout = words, layout

    @classmethod
    def read(cls, directory: Path) -> Weights:
        words, layout = {}, {}
        files = RunDir.tensor_files_at(directory)
        if not files:
            raise FileNotFoundError(f"no safetensors files in {directory}")
        for file in files:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is no dict)
                    tensor = f.get_tensor(name)
                    words[name], layout[name] = to_words(tensor), (tensor.dtype, list(tensor.shape))
        return cls(words, layout)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: from_words(w, *self.layout[n]) for n, w in self.words.items()}

    def digests(self) -> dict[str, str]:
        return {name: tensor_digest(t) for name, t in self.tensors().items()}


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
                start = self._snapshot(base)
                break
            chain.append((base, base_marker, base_blob))
        return self._apply(start, chain)

    def _held(self, base: int, base_digest: str) -> Weights | None:
        """The served weights, if they are `base` exactly (by digest) and still readable."""
        if self.held is None or self.held[0] != base or self.held[2] != base_digest:
            return None
        try:
            return Weights.read(self.held[1])
        except OSError as e:  # pruned from a local run directory meanwhile: go by the snapshot
            log.info("the served version %d is gone (%s): rebuilding from its snapshot", base, e)
            self.held = None
            return None

    def _check_link(self, link: tuple[int, Marker, bytes], base: int, base_marker: Marker) -> None:
        vouched = version_digest(dict(getattr(base_marker, "tensor_digests", {}) or {}))
        if link[1].base_digest != vouched:
            raise ChainBroken(f"weights version {link[0]} names a base whose digest is not version {base}'s")

    def _snapshot(self, version: int) -> Weights:
        served, path = pull_step_dir(self.rundir, self.rundir.weights.relative(version))
        try:
            log.info("rebuilding from the snapshot of version %d", version)
            return self._read(path, f"the snapshot of version {version}")
        finally:
            self.rundir.store.drop_local(served)

    @staticmethod
    def _read(directory: Path, what: str) -> Weights:
        try:
            return Weights.read(directory)
        except OSError as e:
            raise ChainBroken(f"cannot read {what} ({e})") from None

    def _apply(self, start: Weights, chain: list[tuple[int, Marker, bytes | None]]) -> Path:
        words = start.words
        for version, _, blob in reversed(chain):
            if blob is None:
                raise ChainBroken(f"weights version {version} has a marker but no delta")
            try:
                words = apply(words, blob)
            except DeltaMismatch as e:
                raise ChainBroken(f"weights version {version}: {e}") from None
        version, marker, _ = chain[0]
        rebuilt = Weights(words, start.layout)
        failpoint(INFERENCE_MID_APPLY, version)
        if rebuilt.digests() != dict(marker.tensor_digests):
            raise ChainBroken(f"weights version {version} rebuilt from deltas differs from its digests")
        return self._write(version, rebuilt)

    def _write(self, version: int, rebuilt: Weights) -> Path:
        target = self.work / self.rundir.weights.relative(version).replace("/", "-")
        staging = self.work / f"{TMP_PREFIX}{target.name}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        name = self.rundir.weights_file(version).name
        save_file(rebuilt.tensors(), str(staging / name), metadata={"format": "pt"})
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        log.info("rebuilt weights version %d from deltas", version)
        return target
