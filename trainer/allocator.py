"""The host allocator: keep freed memory in the process between training steps.

glibc returns large freed blocks to the OS (munmap, or trimming the heap top),
and every step then faults the same pages in again: on a small CPU model that
cost 15-25% of step time in the trainer, whose publishing and batch reading
between steps keep pushing glibc's adaptive thresholds back down. Fixing both
thresholds keeps blocks under 32 MB on the heap and up to 256 MB of free heap
held for the next step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Set glibc's malloc thresholds for this process; False where that is not possible
    (not Linux, or a C library without mallopt, such as musl's stub)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
