"""The embedded default, as a user runs it: it learns, Ctrl-C stops it, `triad up` resumes it."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from statistics import mean

import pytest

from shared.resume import newest_checkpoint
from shared.rundir import RunDir
from shared.waiting import wait_for
from tests.helpers import free_port, processes_mentioning, run_triad, triad_cmd

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 100
INTERRUPT_AFTER = 50  # checkpoint


def test_interrupted_and_resumed_demo_learns(tmp_path: Path, tiny_model: str) -> None:
    run_dir = tmp_path / "demo"
    sets = [
        f"--set={s}" for s in (f"run_dir={run_dir}", f"max_steps={STEPS}", f"inference.port={free_port()}")
    ]
    sets.append("--set=trainer.checkpoint.every=25")
    # started with SIGINT ignored, as under nohup or from a script's background job: Ctrl-C still stops it
    proc = subprocess.Popen(
        triad_cmd("up", *sets),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    rundir = RunDir(run_dir)

    def checkpointed() -> int:
        return newest_checkpoint(rundir, rundir.read_run().run_id) if rundir.run_file.exists() else 0

    def interruptible() -> bool | None:
        if checkpointed() >= INTERRUPT_AFTER:
            return True
        assert proc.poll() is None, proc.stdout.read().decode()
        return None

    wait_for(interruptible, f"the checkpoint of update {INTERRUPT_AFTER}", 600, poll=0.5)

    proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
    start = time.monotonic()
    first_output = proc.communicate(timeout=30)[0].decode()
    assert time.monotonic() - start < 10, "triad up took more than 10 s to stop"
    assert processes_mentioning(str(run_dir)) == [], "a service outlived triad up"
    assert all(ch == "\n" or ch.isprintable() for ch in first_output), "control characters in piped output"

    resume_from = checkpointed()
    # updates after the checkpoint (51, 52 if it was quick) are trained again by the resumed run
    checkpointed_rows = [r for r in rundir.metrics.rows("trainer") if r["step"] <= resume_from]
    resumed = run_triad("up", *sets, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "resuming after update" in resumed.stdout

    trainer_rows = rundir.metrics.rows("trainer")
    assert [r["step"] for r in trainer_rows] == list(range(1, STEPS + 1))  # each update once
    assert trainer_rows[:resume_from] == checkpointed_rows  # continued, not restarted
    rewards = [r["reward_mean"] for r in rundir.metrics.rows("orchestrator")]
    first, last = mean(rewards[:10]), mean(rewards[-10:])
    assert last - first >= 0.2, f"reward {first:.3f} -> {last:.3f}: no clear rise"
    evals = rundir.metrics.rows("eval")
    assert evals and evals[-1]["step"] == STEPS, evals  # held-out evaluation ran, the last at the end
    assert all(0 <= r["eval_pass@1"] <= r["eval_pass@4"] <= 1 for r in evals), evals
    assert rundir.plot_file().exists()
