"""100 short steps of `triad up` (ten checkpoint cycles): the run directory stays under the bound
docs/reliability.md states. The run is on-policy (max_async_level 0), so it also shows that guard
over 100 batches: every sample's policy version is its step's previous one (lag 0).

The bound, for weights.keep W, trainer.checkpoint.keep K, trainer.checkpoint.every E,
orchestrator.keep_rollouts R and async level eta (weights of size S, a checkpoint about 3 S
with AdamW, batches of size B):
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

from services.disk_plan import disk_plan, model_size
from shared.batch import load_batch
from shared.config import load_config
from shared.rundir import TRAINER, RunDir, Steps
from tests.helpers import run_triad, short_up_sets

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 100
EVERY = 10
ETA = 0
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


def area_dir(area: Steps) -> Path:
    """The directory that holds the step directories of one kind."""
    return area.store.local_path(area.kind)


class Sampler(threading.Thread):
    """Measures the run directory every 0.2 s while the run goes on."""

    def __init__(self, rundir: RunDir) -> None:
        super().__init__(daemon=True)
        self.root, self.peak = rundir.root, 0
        self.areas = {a.kind: a for a in (rundir.weights, rundir.checkpoints, rundir.rollouts)}
        self.peaks = dict.fromkeys(self.areas, 0)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            if self.root.exists():
                self.peak = max(self.peak, size(self.root))
                for kind, area in self.areas.items():
                    self.peaks[kind] = max(self.peaks[kind], size(area_dir(area)))


def test_run_dir_stays_bounded_over_100_steps(tmp_path, tiny_model):
    run_dir = tmp_path / "run"
    sets = [*short_up_sets(run_dir, STEPS, EVERY), f"max_async_level={ETA}"]
    rundir = RunDir(run_dir)
    sampler = Sampler(rundir)
    sampler.start()
    try:
        result = run_triad("up", *[f"--set={s}" for s in sets], timeout=900)
        assert sampler.is_alive(), "the disk sampler died: the peaks below would not cover the run"
    finally:
        sampler.done.set()
        sampler.join()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert [r["step"] for r in rundir.metrics.rows("trainer")] == list(range(1, STEPS + 1))

    weights_size = size(rundir.weights.path(STEPS))
    checkpoint_size = size(rundir.checkpoints.path(STEPS))
    batch_size = max(size(rundir.rollouts.path(s)) for s in rundir.rollouts.steps())
    lags = {
        step - 1 - v
        for step in rundir.rollouts.steps()
        for v in load_batch(rundir, step).column("policy_version").to_pylist()
    }
    assert lags == {ETA}, lags  # the batches still kept (the newest R + E or so); for all of them:
    assert [r["lag_max"] for r in rundir.metrics.rows("orchestrator")] == [ETA] * STEPS
    w, k, e, r, eta = 3, 2, EVERY, 4, ETA  # the defaults and the settings above
    bound = {
        rundir.weights.kind: (w + k + 1) * weights_size,
        rundir.checkpoints.kind: (k + 1) * checkpoint_size,
        rundir.rollouts.kind: (r + e + eta + 2) * batch_size,
    }
    print(f"peak {sampler.peak / MB:.1f} MB; by kind {sampler.peaks}; bound {bound}")
    # step directories of one kind differ by a few bytes (marker times, metadata): 1% slack
    assert all(sampler.peaks[kind] <= 1.01 * bound[kind] for kind in bound), (sampler.peaks, bound)
    logs_and_metrics = size(rundir.logs_dir) + size(rundir.metrics_file(TRAINER).parent)
    assert logs_and_metrics < STEPS * 4096 + 256 * 1024, logs_and_metrics
    assert sampler.peak < 40 * MB, sampler.peak  # the figure docs/reliability.md gives for this run
    # `triad up`'s disk plan (services/disk_plan.py), from the model's headers, against what was written
    plan = disk_plan(load_config(None, sets), model_size(Path(tiny_model)))
    assert (plan.versions, plan.checkpoints) == (w + k + 1, k + 1)
    assert 0.9 < plan.version_bytes / weights_size < 1.1, (plan, weights_size)
    assert 0.9 < plan.checkpoint_bytes / checkpoint_size < 1.1, (plan, checkpoint_size)
