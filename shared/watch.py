"""Waking on a new file instead of at the next poll: Linux inotify on a directory of step
directories (`weights/`, `rollouts/`) and on each step directory in it, so that a marker
written into any of them ends the wait at once.

A wait on a marker still polls at its `Backoff` intervals (`shared/waiting.py`): the watch
only ends each interval early when something is written. What it cannot see (a writer on
another machine of a network filesystem, a platform without inotify) is seen at the next
poll, as without it. Object stores have no watch.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import select
import struct
from pathlib import Path

from shared.libc import libc_function

log = logging.getLogger("triad.watch")

IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100
IN_IGNORED, IN_ISDIR, IN_ONLYDIR = 0x8000, 0x40000000, 0x01000000
WRITTEN = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
EVENT = struct.Struct("iIII")  # wd, mask, cookie, len; then `len` bytes of name
READ_BYTES = 64 * 1024


class DirWatch:
    """An inotify instance watching `root` and each directory directly in it (those there at
    the start and those created later). `wait(timeout)` and `wait_async(timeout)` return when
    something was written into one of them, or when `timeout` seconds have passed."""

    def __init__(self, fd: int, root: Path, add_watch) -> None:
        self.fd, self.root, self.add_watch = fd, root, add_watch
        self.dirs: dict[int, Path] = {}

    def add(self, path: Path) -> bool:
        wd = self.add_watch(self.fd, os.fsencode(path), WRITTEN | IN_ONLYDIR)
        if wd < 0:
            code = ctypes.get_errno()
            if code not in (errno.ENOENT, errno.ENOTDIR):  # gone again: nothing to watch
                log.warning("cannot watch %s (%s): polling it only", path, os.strerror(code))
            return False
        self.dirs[wd] = path
        return True

    def drain(self) -> bool:
        """Read the pending events, watching each new directory in the root; whether any."""
        try:
            data = os.read(self.fd, READ_BYTES)
        except BlockingIOError:
            return False
        offset = 0
        while offset < len(data):
            wd, mask, _, size = EVENT.unpack_from(data, offset)
            name = data[offset + EVENT.size : offset + EVENT.size + size].rstrip(b"\0")
            offset += EVENT.size + size
            if mask & IN_IGNORED:
                self.dirs.pop(wd, None)
            elif mask & IN_ISDIR and self.dirs.get(wd) == self.root and name:
                self.add(self.root / os.fsdecode(name))
        return True

    def wait(self, timeout: float) -> None:
        readable, _, _ = select.select([self.fd], [], [], timeout)
        if readable:
            self.drain()

    async def wait_async(self, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        woken = loop.create_future()
        loop.add_reader(self.fd, lambda: woken.done() or woken.set_result(None))
        try:
            await asyncio.wait([woken], timeout=timeout)
        finally:
            loop.remove_reader(self.fd)
        self.drain()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def open_watch(root: Path) -> DirWatch | None:
    """A watch on `root` (created if missing) and its directories; None where inotify is
    not available (the waits then poll only)."""
    init = libc_function("inotify_init1", [ctypes.c_int])
    add_watch = libc_function("inotify_add_watch", [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32])
    if init is None or add_watch is None:
        return None
    root.mkdir(parents=True, exist_ok=True)
    fd = init(os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        log.warning("inotify unavailable (%s): polling %s only", os.strerror(ctypes.get_errno()), root)
        return None
    watch = DirWatch(fd, root, add_watch)
    if not watch.add(root):
        watch.close()
        return None
    for child in sorted(root.iterdir()):
        if child.is_dir():
            watch.add(child)
    return watch
