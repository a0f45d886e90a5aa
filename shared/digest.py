"""Digests of published weights, so inference can prove it serves what the trainer sent.

A tensor's digest is an exact integer checksum of its raw bytes. The bytes are read as
64-bit words (the last one zero-padded) laid out in rows of `WIDTH`; the digest is the
byte count, `R = sum_r (2r + 1) * rowsum_r` and `C = sum_c (2c + 1) * colsum_c`, all
sums mod 2^64 (two's-complement wrap-around, so the order of summation does not matter and
CPU and GPU agree). The weights are odd, hence invertible mod 2^64: a change to any one
word always changes both R and C; words moved between rows change R, within a row C.
It costs one pass over the bytes where the tensors already are (the trainer's gathered
tensors, the inference worker's loaded ones; `bench/` measures it against the hand-off):
on a GPU two torch reductions; on the CPU a numba kernel that reads each word once and
adds it to its row's and its column's sum, on the calling thread, over the tensor's own
memory. Not torch there: its CPU reductions split each sum over its OpenMP threads, and
next to a busy inference process one of them waits for a core, so each of the hundreds
of reductions of a publish waited a scheduler slice; not numpy's two reductions, which
read the bytes twice (bench/README.md has the figures). The kernel is compiled on first
use and cached beside this file. It guards against corruption (a flipped byte in a file
or a bucket), not against an attacker, who could forge it.

A version's digest is a BLAKE2b of its tensors' names and digests in name order.

torch, numpy and numba are imported inside the functions that take tensors: the rest of
`shared/` stays free of them.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

WIDTH = 64  # words per row
MOD = 1 << 64


def _bytes(tensor: Any) -> Any:
    """The tensor's raw bytes, a flat uint8 view (a copy only if it was not contiguous)."""
    import torch

    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


@functools.cache
def _row_col_kernel() -> Any:
    """`(R, C)` of a 1-D int64 array in one pass (wrapping int64, so mod 2^64), compiled
    once per machine by numba and cached beside this file."""
    import numba
    import numpy as np

    @numba.njit(cache=True, nogil=True)
    def row_col_sums(words):  # row i holds words[i * WIDTH : (i + 1) * WIDTH], the last maybe short
        col_sums = np.zeros(WIDTH, np.int64)
        r = np.int64(0)
        for i in range(words.size // WIDTH + 1):
            row_sum = np.int64(0)
            for c in range(min(WIDTH, words.size - i * WIDTH)):
                word = words[i * WIDTH + c]
                row_sum += word
                col_sums[c] += word
            r += (2 * i + 1) * row_sum
        c_total = np.int64(0)
        for c in range(WIDTH):
            c_total += (2 * c + 1) * col_sums[c]
        return r, c_total

    return row_col_sums


def load_cpu_kernel() -> None:
    """Load (or compile) the CPU kernel now, off the hand-off's path: from numba's cache it
    takes about 0.5 s, which the first publish would otherwise spend."""
    import numpy as np

    _row_col_kernel()(np.zeros(WIDTH, dtype=np.int64))


def _cpu_sums(raw: Any) -> tuple[int, int]:
    """R and C of a CPU tensor's bytes, on this thread, without a copy."""
    import numpy as np

    data = raw.numpy()
    if data.ctypes.data % 8:  # a view into a bucket: int64 words need aligned memory
        data = data.copy()
    whole = data.size // 8 * 8
    words = data[:whole].view(np.int64)
    r, c = (int(x) for x in _row_col_kernel()(words))
    if whole < data.size:  # the last word, zero-padded, adds its own terms to R and C
        tail = np.zeros(8, dtype=np.uint8)
        tail[: data.size - whole] = data[whole:]
        word, (row, col) = int(tail.view(np.int64)[0]), divmod(words.size, WIDTH)
        r, c = r + (2 * row + 1) * word, c + (2 * col + 1) * word
    return r % MOD, c % MOD


def _device_sums(raw: Any) -> tuple[int, int]:
    """R and C of a device (GPU) tensor's bytes, reduced by torch where they are."""
    import torch

    if raw.storage_offset() % 8:  # a view into a bucket: int64 views need aligned storage
        raw = raw.clone()
    whole = raw.numel() // 8 * 8
    words = raw[:whole].view(torch.int64)
    if whole < raw.numel():
        tail = torch.zeros(8, dtype=torch.uint8, device=raw.device)
        tail[: raw.numel() - whole] = raw[whole:]
        words = torch.cat([words, tail.view(torch.int64)])
    rows = words.numel() // WIDTH
    grid, rest = words[: rows * WIDTH].view(rows, WIDTH), words[rows * WIDTH :]
    row_sums = torch.cat([grid.sum(1), rest.sum().reshape(1)])
    col_sums = grid.sum(0)
    col_sums[: rest.numel()] += rest
    device = words.device
    r = (row_sums * torch.arange(1, 2 * rows + 3, 2, dtype=torch.int64, device=device)).sum()
    c = (col_sums * torch.arange(1, 2 * WIDTH + 1, 2, dtype=torch.int64, device=device)).sum()
    r_c = torch.stack([r, c]).tolist()
    return r_c[0] % MOD, r_c[1] % MOD


def tensor_digest(tensor: Any) -> str:
    """The digest of a torch tensor's raw bytes (any dtype, any device)."""
    nbytes = tensor.numel() * tensor.element_size()
    raw = _bytes(tensor)
    r, c = _cpu_sums(raw) if raw.device.type == "cpu" else _device_sums(raw)
    return f"{nbytes:x}-{r:016x}{c:016x}"


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
