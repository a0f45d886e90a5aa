"""Digests of published weights, so inference can prove it serves what the trainer sent.

A tensor's digest is an exact integer checksum of its raw bytes. The bytes are read as
64-bit words (the last one zero-padded) laid out in rows of `WIDTH`; the digest is the
byte count, `R = sum_r (2r + 1) * rowsum_r` and `C = sum_c (2c + 1) * colsum_c`, all
sums mod 2^64 (two's-complement wrap-around, so the order of summation does not matter and
CPU and GPU agree). The weights are odd, hence invertible mod 2^64: a change to any one
word always changes both R and C; words moved between rows change R, within a row C.
It costs two memory-bound reductions, computed where the tensors already
are (the trainer's gathered tensors, the inference worker's loaded ones): with
numpy on the CPU, single-threaded, with torch on a GPU; `bench/` measures it
against the hand-off. It guards against corruption (a flipped byte in a
file or a bucket), not against an attacker, who could forge it.

A version's digest is a BLAKE2b of its tensors' names and digests in name order.

torch is imported inside the function that takes tensors: the rest of `shared/` stays
free of it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

WIDTH = 64  # words per row
MOD = 1 << 64


def _words(tensor: Any) -> Any:
    """The tensor's bytes as int64 words, the last zero-padded."""
    import torch

    raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if raw.storage_offset() % 8:  # a view into a bucket: int64 views need aligned storage
        raw = raw.clone()
    whole = raw.numel() // 8 * 8
    words = raw[:whole].view(torch.int64)
    if whole == raw.numel():
        return words
    tail = torch.zeros(8, dtype=torch.uint8, device=raw.device)
    tail[: raw.numel() - whole] = raw[whole:]
    return torch.cat([words, tail.view(torch.int64)])


def _numpy_sums(words: Any) -> tuple[int, int]:
    """R and C (mod 2^64) of int64 words on the CPU, with numpy: one thread, never an OpenMP team
    (torch's reductions start one, which waits for cores that inference holds: 1.9 ms against
    45 ms for the embedded model's tensors on a busy 2-core machine)."""
    import numpy as np

    w = words.numpy()
    rows = w.size // WIDTH
    grid, rest = w[: rows * WIDTH].reshape(rows, WIDTH), w[rows * WIDTH :]
    with np.errstate(over="ignore"):  # int64 arithmetic wraps around: the sums are mod 2^64
        row_sums = np.concatenate([grid.sum(1), rest.sum(keepdims=True)])
        col_sums = grid.sum(0)
        col_sums[: rest.size] += rest
        r = (row_sums * np.arange(1, 2 * rows + 3, 2, dtype=np.int64)).sum()
        c = (col_sums * np.arange(1, 2 * WIDTH + 1, 2, dtype=np.int64)).sum()
    return int(r), int(c)


def tensor_digest(tensor: Any) -> str:
    """The digest of a torch tensor's raw bytes (any dtype, any device)."""
    nbytes = tensor.numel() * tensor.element_size()
    words = _words(tensor)
    r, c = _numpy_sums(words) if words.device.type == "cpu" else _torch_sums(words)
    return f"{nbytes:x}-{r % MOD:016x}{c % MOD:016x}"


def _torch_sums(words: Any) -> tuple[int, int]:
    """R and C (mod 2^64) of int64 words with torch, on the words' device (a GPU)."""
    import torch

    rows = words.numel() // WIDTH
    grid, rest = words[: rows * WIDTH].view(rows, WIDTH), words[rows * WIDTH :]
    row_sums = torch.cat([grid.sum(1), rest.sum().reshape(1)])
    col_sums = grid.sum(0)
    col_sums[: rest.numel()] += rest
    device = words.device
    r = (row_sums * torch.arange(1, 2 * rows + 3, 2, dtype=torch.int64, device=device)).sum()
    c = (col_sums * torch.arange(1, 2 * WIDTH + 1, 2, dtype=torch.int64, device=device)).sum()
    r_c = torch.stack([r, c]).tolist()
    return r_c[0], r_c[1]


def version_digest(tensors: Mapping[str, str]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(tensors):
        h.update(f"{name}\0{tensors[name]}\n".encode())
    return h.hexdigest()


def digesting(named: Iterable[tuple[str, Any]], into: dict[str, str]) -> Iterator[tuple[str, Any]]:
    """Pass `(name, tensor)` pairs through, recording each tensor's digest in `into`."""
    for name, tensor in named:
        into[name] = tensor_digest(tensor)
        yield name, tensor


def agreed(per_worker: list[dict[str, str]]) -> dict[str, str]:
    """One digest per tensor from every worker's: where workers disagree, a value naming
    each, so it differs from any expected digest."""
    names = sorted({name for digests in per_worker for name in digests})
    out = {}
    for name in names:
        seen = [digests.get(name, "missing") for digests in per_worker]
        out[name] = seen[0] if len(set(seen)) == 1 else "workers disagree: " + ", ".join(seen)
    return out


def first_difference(
    expected: Mapping[str, str], got: Mapping[str, str], order: Iterable[str] = ()
) -> str | None:
    """The first tensor (in `order`, then by name) whose digest differs or that is missing on
    either side; None when they match."""
    names = list(dict.fromkeys([*order, *sorted({*expected, *got})]))
    for name in names:
        if expected.get(name) != got.get(name):
            return name
    return None
