"""A trainer that bounds the step borrows inference's cores under `triad up` (`trainer/cores.py`).

The embedded default on a machine `inference.cpus = "auto"` splits, its trainer made the bound
by micro-batches of one sample (`trainer.parallel.micro_batch_tokens = 16`): its batches are
there when it asks, so after its warm-up and a window on its own core it moves onto inference's
as well, times a window there and keeps them or moves back. Asserted from the run: the launch's
line, the trainer's log, and each step's `cores` in the trainer's metrics.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from services.placement import has_gpu, placement
from shared.config import load_config
from shared.cpus import format_cpus, parse_cpus
from shared.rundir import TRAINER, RunDir
from tests.helpers import free_port, run_triad, server_tracebacks
from trainer.cores import DECIDED, WARMUP, WINDOW

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = DECIDED + 3


@pytest.mark.skipif(
    has_gpu() or len(os.sched_getaffinity(0)) < 2, reason="nothing is split: a GPU, or one core"
)
def test_a_trainer_that_bounds_the_step_borrows_inference_s_cores_and_decides_once(
    tmp_path: Path, tiny_model
):
    cores = sorted(os.sched_getaffinity(0))
    split = placement(load_config(None, ['inference.cpus="auto"']), cores, gpu=False)
    own = sorted(parse_cpus(split[TRAINER]))  # the trainer's, as `inference.cpus = "auto"` splits them
    sets = [
        f"run_dir={tmp_path / 'run'}",
        f"max_steps={STEPS}",
        f"inference.port={free_port()}",
        "trainer.parallel.micro_batch_tokens=16",
    ]
    result = run_triad("up", *[f"--set={s}" for s in sets], timeout=900)
    rundir = RunDir(tmp_path / "run")
    trainer_log = rundir.log_file("trainer").read_text()
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{trainer_log[-3000:]}"
    assert re.search(
        r"the trainer on \S+, and on \S+ too while it bounds the step \(cpus auto\)$", result.stdout, re.M
    )

    moves = re.findall(
        r"the trainer moves to cores (\S+) with (\d+) thread\(s\) a rank: (.*)$", trainer_log, re.M
    )
    assert moves[0][:2] == (format_cpus(cores), str(len(cores))), moves  # one rank: a thread a core
    assert re.fullmatch(r"its steps took [\d.]+ s, [\d.]+ s of them waiting for batches", moves[0][2]), moves
    kept = re.search(
        r"the trainer keeps the borrowed cores: [\d.]+ s a step against [\d.]+ s on its own", trainer_log
    )
    if kept:
        assert len(moves) == 1
    else:
        assert [m[:2] for m in moves[1:]] == [(format_cpus(own), str(len(own)))]
        assert moves[1][2].startswith("no faster with them: ")
    used = [r["cores"] for r in rundir.metrics.rows("trainer")]
    moved = WARMUP + WINDOW
    after = len(cores) if kept else len(own)
    assert used == [len(own)] * moved + [len(cores)] * (DECIDED - moved) + [after] * (STEPS - DECIDED), used
    assert "Traceback" not in trainer_log
    assert server_tracebacks(rundir.log_file("inference").read_text()) == []
