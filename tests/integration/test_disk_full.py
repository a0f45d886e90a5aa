"""The run directory's disk fills in the middle of `triad up` (another job took the space): the
run stops with one line that says where, how much is free and what to do, prints no traceback,
and once there is room again the same command resumes it from its checkpoint and finishes
every step exactly once.

The disk is a real one that fills: a tmpfs mounted for the test (root; skipped otherwise), filled
by a file once the first checkpoint is complete, to a few KiB short of the next weights version.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shared.rundir import RunDir
from shared.waiting import wait_for
from tests.helpers import REPO, run_triad, short_up_sets, small_disk, triad_cmd

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 10
EVERY = 3
LEFT_FREE = 64 * 1024  # smaller than a weights version of the tiny model (~1 MiB)


def sets(run_dir: Path) -> list[str]:
    return [f"--set={s}" for s in short_up_sets(run_dir, STEPS, EVERY)]


def fill(disk: Path, leave: int) -> Path:
    """A file that takes all of `disk`'s free space but `leave` bytes (retried while the run's own
    writes move the figure)."""
    filler = disk / "someone-elses-data"
    for _ in range(20):
        want = shutil.disk_usage(disk).free - leave
        with contextlib.suppress(FileNotFoundError):
            filler.unlink()
        fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.posix_fallocate(fd, 0, want)
            return filler
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
        finally:
            os.close(fd)
    raise AssertionError(f"could not fill {disk}: the run kept writing")


def first_checkpoint_done(rundir: RunDir) -> bool:
    return rundir.run_file.exists() and rundir.checkpoints.newest(rundir.read_run().run_id) >= EVERY


def test_a_disk_that_fills_mid_run_stops_it_in_one_line_and_it_resumes(tmp_path, tiny_model):
    with small_disk(tmp_path / "disk", "48m") as disk:
        run_dir = disk / "run"
        rundir = RunDir(run_dir)
        up = subprocess.Popen(
            triad_cmd("up", *sets(run_dir)),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(
                lambda: (up.poll() is not None or first_checkpoint_done(rundir)) or None,
                timeout=300,
                what="the run's first checkpoint",
            )
            assert up.poll() is None, up.communicate()
            filler = fill(disk, LEFT_FREE)
            out, err = up.communicate(timeout=300)
        finally:
            if up.poll() is None:
                up.kill()
        assert up.returncode == 2, out[-2000:] + err[-2000:]
        error_lines = [line for line in err.splitlines() if line.startswith("triad up: error:")]
        assert len(error_lines) == 1, err
        assert f"no space left on the disk of {run_dir}" in error_lines[0], error_lines[0]
        # what is free when the write fails: the 64 KiB left plus what the run freed after the
        # filler came (a pruned version or batch: 1.7 MiB once, still less than the write needed)
        assert "weights.keep" in error_lines[0], error_lines[0]
        assert re.search(r"\(\d+(\.\d+)? (KiB|MiB) free of 48\.0 MiB\)", error_lines[0]), error_lines[0]
        print(error_lines[0])
        assert "Traceback" not in out + err, out + err
        trained = [r["step"] for r in rundir.metrics.rows("trainer")]
        assert EVERY <= len(trained) < STEPS, trained

        filler.unlink()
        resumed = run_triad("up", *sets(run_dir), timeout=600)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert "triad up: resuming after update" in resumed.stdout, resumed.stdout
        assert [r["step"] for r in rundir.metrics.rows("trainer")] == list(range(1, STEPS + 1))
