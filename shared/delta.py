"""Delta versions: version V as the exact difference from version V-1.

A tensor is seen as a flat array of unsigned words of its element size (uint16 for bf16 and
fp16, uint32 for fp32). A delta holds, for every tensor with changed words, their positions
and the XOR of old and new word, so `new = base ^ xor` at those positions restores the new
version bit for bit. On the wire (one file per version, `RunDir.writing_delta`):

    b"TRIADDELTA1\\n" | u64 header length | header (JSON) | zstd(positions) | zstd(values)

The header names each tensor (`name`, `words`, `itemsize`, `changed`) in order and the
compressed and raw sizes of both streams. Positions are stored as gaps (the first absolute,
then the distance to the previous one) in uint32; both streams are split into byte planes
before compression (all first bytes, then all second bytes, ...): the high bytes of small gaps
and of XORs that keep sign and exponent are zero, which zstd (pyarrow's codec) packs to
almost nothing.

`pack` and `apply` are pure: numpy arrays in, bytes or arrays out. numpy and pyarrow are
imported inside them, torch only in `to_words`/`from_words`, which the services use at their
edges.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

MAGIC = b"TRIADDELTA1\n"
CODEC = "zstd"
LEVEL = 3
WORD_TYPES = {2: "uint16", 4: "uint32", 8: "uint64"}


class DeltaMismatch(ValueError):
    """A delta that does not fit the base it is applied to, or a pair of versions that one
    delta cannot join (tensors added, removed, resized or of another element size)."""


def _planes(raw: Any, itemsize: int) -> Any:
    """Words split into byte planes (an `itemsize` x n uint8 array), a plane at a time: a
    strided read into contiguous rows, about twice as fast as copying the transposed view."""
    import numpy as np

    columns = raw.view(np.uint8).reshape(-1, itemsize)
    out = np.empty((itemsize, len(columns)), np.uint8)
    for byte in range(itemsize):
        out[byte] = columns[:, byte]
    return out


def _unplanes(planes: Any, itemsize: int, dtype: str) -> Any:
    """The inverse of `_planes`: byte planes back into a flat array of `dtype` words."""
    import numpy as np

    rows = planes.reshape(itemsize, -1)
    out = np.empty((rows.shape[1], itemsize), np.uint8)
    for byte in range(itemsize):
        out[:, byte] = rows[byte]
    return out.view(dtype).reshape(-1)


def _compress(data: Any) -> bytes:
    """zstd of a contiguous array's bytes (read in place, no copy)."""
    import pyarrow as pa

    return pa.Codec(CODEC, compression_level=LEVEL).compress(data.reshape(-1), asbytes=True)


def _decompress(data: bytes, size: int) -> Any:
    import numpy as np
    import pyarrow as pa

    if size == 0:
        return np.zeros(0, np.uint8)
    return np.frombuffer(pa.Codec(CODEC).decompress(data, decompressed_size=size, asbytes=True), np.uint8)


def check_pair(base: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Both versions hold the same tensors, each the same number of words of the same size."""
    if sorted(base) != sorted(new):
        gone, added = sorted(set(base) - set(new)), sorted(set(new) - set(base))
        raise DeltaMismatch(f"the tensors differ (missing {gone[:3]}, added {added[:3]})")
    for name, words in new.items():
        if words.dtype != base[name].dtype or words.size != base[name].size:
            raise DeltaMismatch(
                f"tensor {name}: {base[name].size} words of {base[name].dtype} became "
                f"{words.size} of {words.dtype}"
            )


def pack(base: Mapping[str, Any], new: Mapping[str, Any]) -> bytes:
    """The delta that turns `base` into `new` (name -> flat unsigned-word array, same names,
    sizes and word types); `DeltaMismatch` if one cannot."""
    import numpy as np

    check_pair(base, new)
    tensors, gaps, values = [], [], {}
    for name in sorted(new):
        old, now = base[name].reshape(-1), new[name].reshape(-1)
        if now.size >= 1 << 32:
            raise DeltaMismatch(f"tensor {name} has {now.size} words: positions are 32-bit")
        where = np.flatnonzero(old != now)
        count = {"words": int(now.size), "itemsize": now.itemsize, "changed": len(where)}
        tensors.append({"name": name, **count})
        gaps.append(np.diff(where, prepend=0).astype(np.uint32))
        values.setdefault(now.itemsize, []).append(old[where] ^ now[where])
    gap_raw = _planes(np.concatenate(gaps) if gaps else np.zeros(0, np.uint32), 4)
    value_raw = [_planes(np.concatenate(v), size).reshape(-1) for size, v in sorted(values.items())]
    value_raw = np.concatenate(value_raw) if len(value_raw) > 1 else (value_raw or [np.zeros(0, np.uint8)])[0]
    streams = [_compress(gap_raw), _compress(value_raw)]
    header = {
        "tensors": tensors,
        "codec": CODEC,
        "sizes": [[len(streams[0]), gap_raw.size], [len(streams[1]), value_raw.size]],
    }
    head = json.dumps(header).encode()
    return MAGIC + struct.pack("<Q", len(head)) + head + streams[0] + streams[1]


def read_header(blob: bytes) -> tuple[dict, int]:
    """The header of a delta and where its streams start; `DeltaMismatch` for anything else."""
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + 8:
        raise DeltaMismatch("not a triad delta (bad magic)")
    (length,) = struct.unpack_from("<Q", blob, len(MAGIC))
    start = len(MAGIC) + 8
    try:
        header = json.loads(blob[start : start + length])
    except ValueError:
        raise DeltaMismatch("a delta with a corrupt header") from None
    return header, start + length


def apply(base: Mapping[str, Any], blob: bytes) -> dict[str, Any]:
    """`base` turned into the version `blob` was packed for: new arrays for changed tensors,
    the base's own for the others (never changed in place)."""
    delta = Delta(blob)
    delta.check(base)
    return {name: delta.apply_one(name, words) for name, words in base.items()}


class Delta:
    """One packed delta, decompressed once and applied tensor by tensor, so a rebuild can hold
    one tensor at a time (`inference/deltas.py`)."""

    def __init__(self, blob: bytes) -> None:
        header, at = read_header(blob)
        (gap_packed, gap_size), (value_packed, value_size) = header["sizes"]
        gaps = _decompress(blob[at : at + gap_packed], gap_size)
        values = _decompress(blob[at + gap_packed : at + gap_packed + value_packed], value_size)
        self.tensors = {t["name"]: t for t in header["tensors"]}
        positions = _unplanes(gaps, 4, "uint32")
        xor_by_size, offset = _split_values(header["tensors"], values), 0
        taken: dict[int, int] = {}
        self._changes: dict[str, tuple[Any, Any]] = {}  # name: (position gaps, xor words)
        for t in header["tensors"]:
            count, size = t["changed"], t["itemsize"]
            if count == 0:
                continue
            first = taken.get(size, 0)
            self._changes[t["name"]] = (
                positions[offset : offset + count],
                xor_by_size[size][first : first + count],
            )
            taken[size] = first + count
            offset += count

    def check(self, base: Mapping[str, Any]) -> None:
        """`base` (each tensor's words, or anything with their `size` and `dtype`) fits the delta."""
        check_pair(base, {name: _Shape(t) for name, t in self.tensors.items()})

    def apply_one(self, name: str, words: Any) -> Any:
        """Tensor `name` of the new version from its base `words`: a new array if it changed,
        `words` itself if not."""
        import numpy as np

        if name not in self._changes:
            return words
        gaps, xor = self._changes[name]
        where = np.cumsum(gaps, dtype=np.int64)
        if where[-1] >= self.tensors[name]["words"]:
            raise DeltaMismatch(f"tensor {name}: a position past its {self.tensors[name]['words']} words")
        new = words.reshape(-1).copy()
        new[where] ^= xor
        return new


def _split_values(tensors: list[dict], values: Any) -> dict[int, Any]:
    """The XOR stream cut into one word array per element size (packed in size order)."""
    counts: dict[int, int] = {}
    for t in tensors:
        counts[t["itemsize"]] = counts.get(t["itemsize"], 0) + t["changed"]
    out, at = {}, 0
    for size, count in sorted(counts.items()):
        out[size] = _unplanes(values[at : at + size * count], size, WORD_TYPES[size])
        at += size * count
    if at != values.size:
        raise DeltaMismatch(f"a delta whose values hold {values.size} bytes, its header {at}")
    return out


class _Shape:
    """What `check_pair` needs of a tensor the header describes."""

    def __init__(self, t: dict) -> None:
        import numpy as np

        self.size, self.dtype = t["words"], np.dtype(WORD_TYPES[t["itemsize"]])


def changed_words(blob: bytes) -> tuple[int, int]:
    """(changed words, all words) of a delta, from its header."""
    header, _ = read_header(blob)
    return sum(t["changed"] for t in header["tensors"]), sum(t["words"] for t in header["tensors"])


def to_words(tensor: Any) -> Any:
    """A CPU tensor's bytes as a flat numpy array of unsigned words of its element size (no copy
    if contiguous)."""
    import torch

    flat = tensor.detach().contiguous().reshape(-1)
    signed = {2: torch.int16, 4: torch.int32, 8: torch.int64}[flat.element_size()]
    return flat.view(signed).numpy().view(WORD_TYPES[flat.element_size()])


def from_words(words: Any, dtype: Any, shape: list[int]) -> Any:
    """The tensor of `dtype` and `shape` whose bytes are `words` (no copy)."""
    import numpy as np
    import torch

    signed = {2: np.int16, 4: np.int32, 8: np.int64}[words.itemsize]
    return torch.from_numpy(words.view(signed)).view(dtype).reshape(shape)
