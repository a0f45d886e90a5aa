"""The first minutes of `triad up`: progress on every wait, and a service's one-line start-up error
reaching the user as that line."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from shared.config import TIED_LM_HEAD
from shared.rundir import ORCHESTRATOR, RunDir
from tests.helpers import free_port, processes_mentioning, run_triad, small_disk, triad_cmd

pytestmark = pytest.mark.integration


def test_the_orchestrator_s_error_line_is_what_up_prints(tmp_path: Path, tiny_model: str) -> None:
    """On a disk too small for what the run keeps (a real 24 MiB tmpfs, the run's plan 32 MiB),
    `triad up` warns first, starts the services, and the orchestrator's error is its last line.
    A second start in the run directory reports its own error, not the first's (the logs keep
    both starts' lines; it used to report the first)."""
    with small_disk(tmp_path / "disk", "24m") as disk:
        run_dir = disk / "run"
        sets = [f"run_dir={run_dir}", f"inference.port={free_port()}", "orchestrator.environment.name=nosuch"]
        out = run_triad("up", *[f"--set={s}" for s in sets], timeout=300)
        again = run_triad(
            "up", *[f"--set={s}" for s in sets[:2]], "--set=orchestrator.environment.name=other", timeout=300
        )
    assert out.returncode == 2, out.stderr
    error = out.stderr.strip().splitlines()
    assert error[0].startswith(f"triad up: warning: the disk of {run_dir} has 24.0 MiB free, and this run ")
    assert "can keep 32.0 MiB there: 6 weights versions of 2.1 MiB" in error[0]
    assert error[-1].startswith("triad up: error: orchestrator: unknown environment 'nosuch': not a built-in")
    assert error[-1].endswith(f"(exit code 2; log: {RunDir(run_dir).log_file(ORCHESTRATOR)})")
    assert "Traceback" not in out.stderr + out.stdout
    assert processes_mentioning(str(run_dir)) == [], "a service outlived triad up"
    assert again.returncode == 2, again.stderr
    error = again.stderr.strip().splitlines()[-1]
    assert error.startswith("triad up: error: orchestrator: unknown environment 'other'"), error


def test_an_adapter_on_the_tied_default_s_lm_head_is_refused_before_launch(tmp_path: Path, tiny_model: str):
    run_dir = tmp_path / "run"
    sets = [f"run_dir={run_dir}", "trainer.lora.rank=8", 'trainer.lora.target_modules=["lm_head"]']
    out = run_triad("up", *[f"--set={s}" for s in sets])
    assert out.returncode == 2 and out.stderr == f"triad up: error: {TIED_LM_HEAD}\n"
    assert not RunDir(run_dir).logs_dir.exists(), "a service was started"


def test_a_piped_up_prints_a_line_at_least_every_30_s_through_build_and_start(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    sets = [f"run_dir={run_dir}", f"inference.port={free_port()}", "max_steps=2"]
    env = {**os.environ, "TRIAD_CACHE": str(tmp_path / "empty-cache")}  # the model is built first
    start = time.monotonic()
    proc = subprocess.Popen(
        triad_cmd("up", *[f"--set={s}" for s in sets]),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    lines = [(time.monotonic(), line.rstrip("\n")) for line in proc.stdout]
    assert proc.wait(timeout=60) == 0, "\n".join(text for _, text in lines)
    first_step = next(i for i, (_, text) in enumerate(lines) if text.startswith("step    1/2"))
    times = [start] + [t for t, _ in lines[: first_step + 1]]
    gaps = [(b - a, lines[i][1]) for i, (a, b) in enumerate(zip(times, times[1:], strict=False))]
    assert max(gaps)[0] < 30, f"{max(gaps)[0]:.0f} s without a line before: {max(gaps)[1]}"
    texts = [text for _, text in lines[:first_step]]
    build = "building builtin:tiny-addition (once; a few seconds): warm-up, step"
    assert any(t.startswith(build) for t in texts)
    assert any(t.startswith("starting: inference (vLLM) ") for t in texts)
    ours = [t for t in texts if t.startswith(("building builtin:", "starting: "))]
    unprintable = [t for t in ours if not t.isprintable()]
    assert not unprintable, f"control characters on a pipe: {unprintable[:3]}"


@pytest.mark.parametrize("command", ["up", "inference"])
def test_a_port_in_use_is_one_line_before_anything_starts(tmp_path: Path, tiny_model: str, command: str):
    run_dir = tmp_path / "run"
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", free_port()))
        holder.listen()
        port = holder.getsockname()[1]
        out = run_triad(command, f"--set=run_dir={run_dir}", f"--set=inference.port={port}", timeout=120)
    assert out.returncode == 2, out.stderr
    line = (
        f"triad {command}: error: cannot listen on 127.0.0.1:{port} (Address already in use): stop the "
        "process that holds the port, or set inference.port to a free one"
    )
    # `triad inference` has imported vLLM, whose import logs a few lines of its own first
    assert out.stderr.splitlines()[-1] == line and "Traceback" not in out.stderr + out.stdout
    assert command != "up" or out.stderr == line + "\n"
    assert not RunDir(run_dir).logs_dir.exists(), "a service was started"
