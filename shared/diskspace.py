"""A full disk, said in one line: where, how much is free, and what to do.

The libraries that write a run's files report a full disk each their own way: an `OSError`
with errno ENOSPC (Python, pyarrow), a `SafetensorError` that carries the OS's text
(safetensors), a `CheckpointException` whose text holds each rank's (torch.distributed.checkpoint).
What they share is the operating system's message, so that is what `is_disk_full` reads.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shared.errors import TriadError

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
FULL_TEXTS = tuple(os.strerror(code) for code in FULL_ERRNOS)


class DiskFull(TriadError):
    """A write found no space left (or the quota spent) on the disk under a run's files."""


def is_disk_full(error: BaseException) -> bool:
    """Whether `error`, or an error it was raised from, is a full disk or a spent quota."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in FULL_ERRNOS:
            return True
        if any(text in str(current) for text in FULL_TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False


def disk_usage(path: Path) -> tuple[int, int] | None:
    """(free, total) bytes of the filesystem holding `path` (its nearest existing parent); None
    where it cannot be read."""
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return None
    return usage.free, usage.total


def free_space(path: Path) -> str:
    """'1.2 GiB free of 20.0 GiB' on the filesystem holding `path`."""
    usage = disk_usage(path)
    if usage is None:
        return "free space unknown"
    return f"{size_text(usage[0])} free of {size_text(usage[1])}"


def size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n // 1024} KiB"


def disk_full_error(where: Path, what: str, advice: str) -> DiskFull:
    return DiskFull(
        f"no space left on the disk of {where} while writing {what} ({free_space(where)}): {advice}; "
        "what was written before is intact, and the same command resumes once there is room"
    )


RUN_DIR_ADVICE = "free space there, keep fewer versions (weights.keep) or give run_dir a larger disk"
CACHE_ADVICE = "free space there or point TRIAD_CACHE (this machine's cache of triad) at a larger disk"


@contextmanager
def full_disk_is_one_line(where: Path, what: str, advice: str = RUN_DIR_ADVICE) -> Iterator[None]:
    """Raise `DiskFull` naming `where` and `what` in place of whatever error a full disk
    caused inside the block; any other error passes unchanged."""
    try:
        yield
    except TriadError:
        raise
    except BaseException as e:  # torch.distributed.checkpoint's CheckpointException is one
        if not is_disk_full(e):
            raise
        raise disk_full_error(where, what, advice) from None
