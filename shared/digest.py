"""Digests of published weights, so inference can prove it serves what the trainer sent.

A tensor's digest names its dtype, shape and byte count, and holds two exact integer
checksums of its raw bytes. The bytes are read as unsigned 32-bit words `w_i` (the last
one zero-padded), laid out in `R` rows of `WIDTH` (word i at row r = i // WIDTH, column
c = i % WIDTH, the last row zero-padded); all sums are mod 2^64 (two's-complement
wrap-around, so the order of summation does not matter and CPU and GPU agree):

- `P = sum_i (2i + 1) * w_i`: each word weighted by an odd multiplier of its position. A
  single changed word changes P by (2i + 1) * delta, never 0 mod 2^64 (odd times a nonzero
  delta below 2^32); two different words swapped change it by 2 (i - j) (w_j - w_i), never 0
  for tensors under 2^31 words (8 GiB).
- `Q = sum_i (h_c * (R - r) + k_c) * w_i`, with pseudo-random column weights
  `h_c = mix(c + H_SEED)` and `k_c = mix(c + K_SEED)` (splitmix64's finalizer). It catches
  what P, linear in i, cannot: a 2x2 "rectangle" of +x, -x, -x, +x keeps P (and every row
  and column sum) but changes Q; on the grid's rows and columns by x (h_c - h_c') (r' - r),
  0 mod 2^64 only if the pseudo-random difference has at least 64 - v(x) - v(r' - r)
  factors of two (v: the factors of two; 2^-33 for an odd x one row apart, 2^-9 at worst,
  a sign-bit x 2^24 rows apart); a rectangle off the grid's columns mixes four weights.

Both are one pass of additions: per column, `A_c` sums the words and `B_c` sums `A_c`
after each row, so `B_c = sum_r (R - r) w_rc`; then
`P = sum_c (2c + 1) A_c + 2 WIDTH (R A_c - B_c)` and `Q = sum_c h_c B_c + k_c A_c`.
Reinterpreting the bytes as another dtype, or reshaping them, changes the name, not the sums.

It costs one pass over the bytes where the tensors already are (the trainer's gathered
tensors, the inference worker's loaded ones; `bench/` measures it against the hand-off):
on a GPU a few torch reductions over blocks of rows; on the CPU a numba kernel that reads
each word once and adds it into the column sums (vectorised across the columns), on the
calling thread, over the tensor's own memory. Not torch there: its CPU reductions split
each sum over its OpenMP threads, and next to a busy inference process one of them waits
for a core, so each of the hundreds of reductions of a publish waited a scheduler slice
(bench/README.md has the figures). The kernel is compiled on first use and cached beside this file. It guards
against corruption and mix-ups (a flipped byte in a file or a bucket, a tensor in the wrong
place), not against an attacker, who could forge it.

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
H_SEED, K_SEED = 1 << 32, 1 << 33  # the column weights of Q: mix(c + H_SEED), mix(c + K_SEED)
BLOCK_ROWS = 1 << 16  # rows per torch reduction on a device: int64 temporaries of 32 MiB


def mix(x: int) -> int:
    """splitmix64's finalizer of `x + golden ratio`, mod 2^64."""
    z = (x + 0x9E3779B97F4A7C15) % MOD
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % MOD
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % MOD
    return z ^ (z >> 31)


H = [mix(c + H_SEED) for c in range(WIDTH)]
K = [mix(c + K_SEED) for c in range(WIDTH)]


def combine(rows: int, a: Iterable[int], b: Iterable[int]) -> tuple[int, int]:
    """P and Q from the column sums A and B of `rows` rows."""
    p = q = 0
    for col, (a_c, b_c) in enumerate(zip(a, b, strict=True)):
        p += (2 * col + 1) * a_c + 2 * WIDTH * (rows * a_c - b_c)
        q += H[col] * b_c + K[col] * a_c
    return p % MOD, q % MOD


def _bytes(tensor: Any) -> Any:
    """The tensor's raw bytes, a flat uint8 view (a copy only if it was not contiguous)."""
    import torch

    return tensor.detach().contiguous().reshape(-1).view(torch.uint8)


@functools.cache
def _kernel() -> Any:
    """P and Q of a 1-D uint32 array in one pass, all sums in wrapping uint64 (so mod 2^64),
    compiled once per machine by numba and cached beside this file."""
    import numba
    import numpy as np

    h = np.array(H, np.uint64)
    k = np.array(K, np.uint64)

    @numba.njit(cache=True, nogil=True)
    def p_and_q(words):  # row r holds words[r * WIDTH : (r + 1) * WIDTH], the last maybe short
        full = words.size // WIDTH
        grid = words[: full * WIDTH].reshape(full, WIDTH)
        a = np.zeros(WIDTH, np.uint64)
        b = np.zeros(WIDTH, np.uint64)
        for r in range(full):
            for col in range(WIDTH):
                running = a[col] + grid[r, col]
                a[col] = running
                b[col] += running
        rows = full
        if full * WIDTH < words.size:
            rows += 1
            last = np.zeros(WIDTH, np.uint64)
            last[: words.size - full * WIDTH] = words[full * WIDTH :]
            for col in range(WIDTH):
                a[col] += last[col]
                b[col] += a[col]
        p = np.uint64(0)
        q = np.uint64(0)
        for col in range(WIDTH):  # combine(), in the kernel: one call per tensor, not 64 big-int steps
            p += np.uint64(2 * col + 1) * a[col] + np.uint64(2 * WIDTH) * (np.uint64(rows) * a[col] - b[col])
            q += h[col] * b[col] + k[col] * a[col]
        return p, q

    return p_and_q


def load_cpu_kernel() -> None:
    """Load (or compile) the CPU kernel now, off the hand-off's path: from numba's cache it
    takes about 0.5 s, which the first publish would otherwise spend."""
    import numpy as np

    _kernel()(np.zeros(WIDTH, dtype=np.uint32))


def _cpu_sums(raw: Any) -> tuple[int, int]:
    """P and Q of a CPU tensor's bytes, on this thread, without a copy where aligned."""
    import numpy as np

    data = raw.numpy()
    if data.size % 4 or data.ctypes.data % 4:  # a padded last word, or a view into a bucket
        padded = np.zeros(-(-data.size // 4) * 4, dtype=np.uint8)
        padded[: data.size] = data
        data = padded
    p, q = _kernel()(data.view(np.uint32))
    return int(p), int(q)


def _device_sums(raw: Any) -> tuple[int, int]:
    """P and Q of a device (GPU) tensor's bytes, reduced by torch where they are, a block of
    rows at a time (int64 temporaries stay small)."""
    import torch

    device = raw.device
    if raw.numel() % 4 or raw.storage_offset() % 4:
        padded = torch.zeros(-(-raw.numel() // 4) * 4, dtype=torch.uint8, device=device)
        padded[: raw.numel()] = raw
        raw = padded
    words = raw.view(torch.int32)
    rows = -(-words.numel() // WIDTH)
    sums = torch.zeros(2, WIDTH, dtype=torch.int64, device=device)
    for first in range(0, rows, BLOCK_ROWS):
        block = words[first * WIDTH : (first + BLOCK_ROWS) * WIDTH].to(torch.int64) & 0xFFFFFFFF
        count = -(-block.numel() // WIDTH)
        grid = torch.nn.functional.pad(block, (0, count * WIDTH - block.numel())).view(count, WIDTH)
        left = rows - first - torch.arange(count, dtype=torch.int64, device=device)  # R - r
        sums[0] += grid.sum(0)
        sums[1] += (grid * left[:, None]).sum(0)
    a, b = sums.tolist()
    return combine(rows, a, b)


def tensor_digest(tensor: Any) -> str:
    """The digest of a torch tensor (any dtype, any device): `dtype[shape]:bytes-P-Q`."""
    nbytes = tensor.numel() * tensor.element_size()
    raw = _bytes(tensor)
    p, q = _cpu_sums(raw) if raw.device.type == "cpu" else _device_sums(raw)
    dtype = str(tensor.dtype).removeprefix("torch.")
    shape = "x".join(str(n) for n in tensor.shape)
    return f"{dtype}[{shape}]:{nbytes:x}-{p:016x}{q:016x}"


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
