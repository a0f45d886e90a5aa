"""A weights version's files in its step directory: safetensors (one file, or a shard per rank),
the index, metadata, and the broadcast handshake files."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shared.rundir.names import _WEIGHTS_FILE, _WEIGHTS_INDEX, _WEIGHTS_SUFFIX, Handshake
from shared.rundir.steps import Steps
from shared.storage import Storage


class WeightsFiles:
    """Part of `RunDir`: its weights versions' files (`store` and `weights` are RunDir's)."""

    store: Storage
    weights: Steps

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
