"""Process-level settings of a trainer worker on Linux, through the C library.

- The host allocator: glibc returns large freed blocks to the OS (munmap, or
  trimming the heap top), and every step then faults the same pages in again:
  on a small CPU model that cost 15-25% of step time in the trainer, whose
  publishing and batch reading between steps keep pushing glibc's adaptive
  thresholds back down. Fixing both thresholds keeps blocks under 32 MB on the
  heap and up to 256 MB of free heap held for the next step.
- The launcher's lifetime: torchrun starts every worker in a session of its
  own, so a `kill -9` of torchrun (the OOM killer, a scheduler, a test) leaves
  the ranks running, training and writing the run directory beside a restarted
  trainer. Each worker asks the kernel for SIGKILL when its parent dies.
"""

from __future__ import annotations

import ctypes
import os
import signal

from shared.libc import libc_function, set_parent_death_signal

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # from glibc's malloc.h


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Set glibc's malloc thresholds for this process; False where that is not possible."""
    mallopt = libc_function("mallopt", [ctypes.c_int, ctypes.c_int])
    if mallopt is None:
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def die_with_launcher(launcher_pid: int) -> bool:
    """Under torchrun (`TORCHELASTIC_RUN_ID` set): SIGKILL this process when its parent
    `launcher_pid` dies, and exit at once if it already has. False where not applicable."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return False
    if not set_parent_death_signal(signal.SIGKILL):
        return False
    if os.getppid() != launcher_pid:  # it died before the request took effect
        os._exit(1)
    return True
