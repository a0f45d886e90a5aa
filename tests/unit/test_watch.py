"""`shared/watch.py`: what a directory watch sees (inotify, so Linux only)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest

from shared.rundir import RunDir
from shared.watch import open_watch

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def test_a_watch_sees_writes_in_its_root_and_in_every_step_directory_old_or_new(tmp_path):
    steps = RunDir(tmp_path).weights
    steps.path(1).mkdir(parents=True)
    watch = steps.watch()
    assert watch is not None and watch.root == steps.path(1).parent
    assert watch.drain() is False  # nothing written yet

    steps.marker_path(1).write_bytes(b"{}")  # in a directory there before the watch
    assert watch.drain() is True
    steps.path(2).mkdir()  # a new one: watched from its creation event on
    assert watch.drain() is True
    steps.marker_path(2).write_bytes(b"{}")
    assert watch.drain() is True
    scratch = watch.root / ".tmp-9-write"  # a directory written under a temporary name, renamed
    scratch.mkdir()
    os.rename(scratch, steps.path(3))
    watch.drain()
    part = steps.path(3) / ".tmp-9-marker"
    part.write_bytes(b"{}")
    watch.drain()
    os.replace(part, steps.marker_path(3))  # a marker renamed into place
    assert watch.drain() is True
    assert watch.drain() is False

    watched = len(watch.dirs)
    steps.clear(2)
    watch.drain()
    assert len(watch.dirs) == watched - 1  # a removed directory's watch is gone with it
    watch.close()


def test_an_async_wait_ends_when_a_marker_is_written_not_at_its_timeout(tmp_path):
    steps = RunDir(tmp_path).rollouts
    watch = steps.watch()  # its directory is created if missing
    assert watch is not None and watch.root.is_dir()
    steps.path(1).mkdir()
    watch.drain()

    async def wait() -> None:
        writer = threading.Timer(0.2, steps.marker_path(1).write_bytes, [b"{}"])
        writer.start()
        await asyncio.wait_for(watch.wait_async(600), timeout=60)  # not woken: the test fails
        writer.join()

    asyncio.run(wait())
    assert steps.marker_path(1).exists()
    watch.close()


def test_a_blocking_wait_returns_at_its_timeout_or_when_something_is_written(tmp_path):
    watch = open_watch(tmp_path)
    assert watch is not None
    watch.wait(0.01)
    assert watch.drain() is False

    waiter = threading.Thread(target=watch.wait, args=(600,))
    waiter.start()
    (tmp_path / "marker").write_bytes(b"{}")
    waiter.join(timeout=60)
    assert not waiter.is_alive()  # woken by the write, not by its 600 s timeout
    watch.close()
