"""The embedded default, as a user runs it, through both ways a run is stopped: it learns; a
second `triad up` on the run directory in use is refused in one line; Ctrl-C stops it; `kill -9`
of `triad up` leaves nothing of the run behind; each restart resumes from the newest checkpoint,
and every update is trained exactly once. One run for both stops: each `triad up` start is
about half a minute of this suite on 2 cores."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path
from statistics import mean

import pytest

from shared.resume import newest_checkpoint
from shared.rundir import TRAINER, RunDir
from shared.waiting import wait_for
from tests.helpers import descendants, free_port, processes_mentioning, run_triad, running, triad_cmd

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 100
CHECKPOINT_EVERY = 25
INTERRUPT_AFTER = 50  # Ctrl-C once this update's checkpoint exists
KILL_AFTER = 77  # kill -9 once this many updates are trained (the checkpoint of 75 exists)


class Demo:
    """`triad up` of the embedded default in `run_dir`, started and stopped as a user would."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.rundir = run_dir, RunDir(run_dir)
        sets = (f"run_dir={run_dir}", f"max_steps={STEPS}", f"inference.port={free_port()}")
        self.sets = [*(f"--set={s}" for s in sets), f"--set=trainer.checkpoint.every={CHECKPOINT_EVERY}"]

    def checkpointed(self) -> int:
        exists = self.rundir.run_file.exists()
        return newest_checkpoint(self.rundir, self.rundir.read_run().run_id) if exists else 0

    def trained(self) -> list[dict]:
        return self.rundir.metrics.rows(TRAINER) if self.rundir.run_file.exists() else []

    def wait(self, up: subprocess.Popen, done, what: str) -> None:
        def ready() -> bool | None:
            if done():
                return True
            assert up.poll() is None, f"triad up ended before {what}"
            return None

        wait_for(ready, what, 600, poll=0.2)

    def resume(self) -> subprocess.CompletedProcess:
        """`triad up` again, to the end; it says it resumes from the newest checkpoint."""
        checkpoint = self.checkpointed()
        resumed = run_triad("up", *self.sets, timeout=900)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert f"resuming after update {checkpoint}" in resumed.stdout
        # this start's own progress: its services' start, then the steps it trains, not the
        # first starts' (their rows and log lines are still in the run directory)
        starting = [line for line in resumed.stdout.splitlines() if line.startswith("starting: ")]
        assert starting[0].startswith("starting: inference (vLLM) "), starting[0]
        printed = [int(m) for m in re.findall(r"^step +(\d+)/", resumed.stdout, re.MULTILINE)]
        assert printed == list(range(printed[0], STEPS + 1)) and printed[0] > checkpoint, printed
        return resumed


def ctrl_c(demo: Demo) -> None:
    """Started with SIGINT ignored, as under nohup or from a script's background job, and
    refused a second start while it runs; Ctrl-C still stops it within 10 s, leaving nothing."""
    up = subprocess.Popen(
        triad_cmd("up", *demo.sets),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    demo.wait(up, lambda: len(demo.trained()) >= 1, "its first update")
    second = run_triad("up", *demo.sets, timeout=120)
    assert second.returncode != 0
    (line,) = second.stderr.strip().splitlines()
    assert "another " in line and "holds this run directory" in line and "pid " in line, line

    interruptible = f"the checkpoint of update {INTERRUPT_AFTER}"
    demo.wait(up, lambda: demo.checkpointed() >= INTERRUPT_AFTER, interruptible)
    up.send_signal(signal.SIGINT)  # what Ctrl-C sends
    start = time.monotonic()
    output = up.communicate(timeout=30)[0].decode()
    assert time.monotonic() - start < 10, "triad up took more than 10 s to stop"
    assert processes_mentioning(str(demo.run_dir)) == [], "a service outlived triad up"
    assert all(ch == "\n" or ch.isprintable() for ch in output), "control characters in piped output"


def kill_9(demo: Demo, log: Path) -> None:
    """The run resumed after Ctrl-C, killed with SIGKILL: every process of it is gone within 10 s."""
    checkpoint = demo.checkpointed()
    with open(log, "wb") as out:
        up = subprocess.Popen(triad_cmd("up", *demo.sets), stdout=out, stderr=subprocess.STDOUT)
    demo.wait(up, lambda: len(demo.trained()) >= KILL_AFTER, f"{KILL_AFTER} updates")
    assert f"resuming after update {checkpoint}" in log.read_text()
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


def test_the_demo_learns_through_a_ctrl_c_and_a_kill_9_and_trains_each_update_once(
    tmp_path: Path, tiny_model: str
) -> None:
    demo = Demo(tmp_path / "demo")
    ctrl_c(demo)
    # updates after a checkpoint (51, 52 if it was quick) are trained again by the resumed run
    kept = [r for r in demo.trained() if r["step"] <= demo.checkpointed()]
    kill_9(demo, tmp_path / "up-killed.log")
    assert demo.trained()[: len(kept)] == kept  # continued, not restarted
    assert demo.checkpointed() >= CHECKPOINT_EVERY * (KILL_AFTER // CHECKPOINT_EVERY)
    kept = [r for r in demo.trained() if r["step"] <= demo.checkpointed()]
    demo.resume()

    trainer_rows = demo.trained()
    assert [r["step"] for r in trainer_rows] == list(range(1, STEPS + 1))  # each update once
    assert trainer_rows[: len(kept)] == kept
    rewards = [r["reward_mean"] for r in demo.rundir.metrics.rows("orchestrator")]
    first, last = mean(rewards[:10]), mean(rewards[-10:])
    assert last - first >= 0.2, f"reward {first:.3f} -> {last:.3f}: no clear rise"
    evals = demo.rundir.metrics.rows("eval")
    assert evals and evals[-1]["step"] == STEPS, evals  # held-out evaluation ran, the last at the end
    assert all(0 <= r["eval_pass@1"] <= r["eval_pass@4"] <= 1 for r in evals), evals
    assert demo.rundir.plot_file().exists()
