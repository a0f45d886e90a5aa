"""200 short steps with `triad up`: the run directory stays under the bound docs/reliability.md states.

The bound, for keep_weights W, keep_checkpoints K, checkpoint_every E, keep_rollouts R and
async level eta (weights of size S, a checkpoint about 3 S with AdamW, batches of size B):
    weights <= (W + K + 1) S (a new version is complete before the oldest goes),
    checkpoints <= (K + 1) 3 S (likewise),
    rollouts <= (R + E + eta + 2) B,  plus logs and metrics that grow by at most 4 KB a step.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from pathlib import Path

import pytest

from shared.metrics import read_metrics
from shared.rundir import CHECKPOINTS, ROLLOUTS, WEIGHTS, RunDir
from tests.helpers import free_port, run_triad

pytestmark = pytest.mark.integration
STEPS = 200
MB = 1 << 20


def size(path: Path) -> int:
    """Bytes in regular files below `path`; what is pruned while we walk is skipped
    (os.walk passes over a directory that vanishes, where Path.rglob raises)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(root, name))
                total += st.st_size if stat.S_ISREG(st.st_mode) else 0
    return total


class Sampler(threading.Thread):
    """Measures the run directory every 0.2 s while the run goes on."""

    def __init__(self, root: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.peak, self.peaks = root, 0, {WEIGHTS: 0, CHECKPOINTS: 0, ROLLOUTS: 0}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            if self.root.exists():
                self.peak = max(self.peak, size(self.root))
                for kind in self.peaks:
                    self.peaks[kind] = max(self.peaks[kind], size(self.root / kind))


def test_run_dir_stays_bounded_over_200_steps(tmp_path, tiny_model):
    run_dir = tmp_path / "run"
    sets = [
        f"run_dir={run_dir}", f"max_steps={STEPS}", f"inference.port={free_port()}",
        "orchestrator.batch_size=4", "orchestrator.group_size=4", "orchestrator.max_tokens=4",
        "orchestrator.eval_every=0", "trainer.checkpoint_every=25",
    ]  # fmt: skip
    sampler = Sampler(run_dir)
    sampler.start()
    try:
        result = run_triad("up", *[f"--set={s}" for s in sets], timeout=900)
        assert sampler.is_alive(), "the disk sampler died: the peaks below would not cover the run"
    finally:
        sampler.done.set()
        sampler.join()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rundir = RunDir(run_dir)
    assert [r["step"] for r in read_metrics(rundir.metrics_file("trainer"))] == list(range(1, STEPS + 1))

    weights_size = size(rundir.weights_dir(STEPS))
    checkpoint_size = size(rundir.checkpoint_dir(STEPS))
    batch_size = max(size(rundir.rollout_dir(s)) for s in rundir.steps(ROLLOUTS))
    w, k, e, r, eta = 3, 2, 25, 4, 1  # the defaults and the settings above
    bound = {
        WEIGHTS: (w + k + 1) * weights_size,
        CHECKPOINTS: (k + 1) * checkpoint_size,
        ROLLOUTS: (r + e + eta + 2) * batch_size,
    }
    print(f"peak {sampler.peak / MB:.1f} MB; by kind {sampler.peaks}; bound {bound}")
    # step directories of one kind differ by a few bytes (marker times, metadata): 1% slack
    assert all(sampler.peaks[kind] <= 1.01 * bound[kind] for kind in bound), (sampler.peaks, bound)
    logs_and_metrics = size(run_dir / "logs") + size(run_dir / "metrics")
    assert logs_and_metrics < STEPS * 4096 + 256 * 1024, logs_and_metrics
    assert sampler.peak < 40 * MB, sampler.peak  # the figure docs/reliability.md gives for this run
