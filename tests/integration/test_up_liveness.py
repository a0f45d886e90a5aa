"""`kill -9` of `triad up` mid-run: nothing of the run is left; a second `triad up` on a run
directory in use is refused in one line; once the holder is gone the restart resumes, and every
update is trained exactly once. The embedded default, with few steps."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from shared.resume import newest_checkpoint
from shared.rundir import TRAINER, RunDir
from shared.waiting import wait_for
from tests.helpers import free_port, run_triad, triad_cmd

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 8
KILL_AFTER = 3  # trainer updates (the checkpoint of update 2 exists by then)


def descendants(root: int) -> set[int]:
    """Every live process below `root` (Linux /proc), at any depth."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_kill_9_of_triad_up_leaves_nothing_a_second_start_is_refused_and_the_restart_resumes_once(
    tmp_path: Path, tiny_model: str
) -> None:
    run_dir = tmp_path / "run"
    sets = [
        f"--set={s}" for s in (f"run_dir={run_dir}", f"max_steps={STEPS}", f"inference.port={free_port()}")
    ]
    sets.append("--set=trainer.checkpoint.every=2")
    started = time.monotonic()
    up = subprocess.Popen(triad_cmd("up", *sets), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rundir = RunDir(run_dir)

    def trained() -> int | None:
        assert up.poll() is None, "triad up ended before the kill"
        rows = rundir.metrics.rows(TRAINER) if rundir.run_file.exists() else []
        return len(rows) if len(rows) >= KILL_AFTER else None

    wait_for(trained, f"{KILL_AFTER} trainer updates", 600, poll=0.2)
    print(f"{KILL_AFTER} updates trained, {time.monotonic() - started:.0f} s after the start", flush=True)
    second = run_triad("up", *sets, timeout=120)
    assert second.returncode != 0
    (line,) = second.stderr.strip().splitlines()
    assert "another " in line and "holds this run directory" in line and "pid " in line, line

    run = descendants(up.pid)
    assert len(run) >= 4, run  # the three services' wrappers and services, vLLM's engine, the rank
    up.send_signal(signal.SIGKILL)
    up.wait()
    killed = time.monotonic()
    while any(running(pid) for pid in run) and time.monotonic() - killed < 20:
        time.sleep(0.1)
    left = [pid for pid in run if running(pid)]
    for pid in left:  # nothing may outlive the test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} of the run's {len(run)} processes outlived triad up"
    assert time.monotonic() - killed < 10
    print(f"{len(run)} processes gone {time.monotonic() - killed:.1f} s after the kill", flush=True)

    checkpoint = newest_checkpoint(rundir, rundir.read_run().run_id)
    assert checkpoint >= 2
    kept = [r for r in rundir.metrics.rows(TRAINER) if r["step"] <= checkpoint]
    resumed = run_triad("up", *sets, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert f"resuming after update {checkpoint}" in resumed.stdout
    rows = rundir.metrics.rows(TRAINER)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # each update exactly once
    assert rows[:checkpoint] == kept
