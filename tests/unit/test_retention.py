"""`orchestrator/batches/retention.py`: trained batches are pruned down to those a resume could train."""

from __future__ import annotations

import pytest

from orchestrator.batches.retention import BatchRetention
from shared.resume import discard_batches_after
from shared.rundir import RunDir


def publish(rundir: RunDir, run_id: str, steps: range) -> None:
    """Batches sampled on-policy (max_async_level 0): batch s from version s - 1."""
    for step in steps:
        rundir.rollouts.write_marker(step, run_id, min_policy_version=step - 1, max_policy_version=step - 1)


@pytest.mark.parametrize(
    ("checkpoint", "kept"), [(0, [1, 17, 18, 19, 20, 21]), (10, [11, 17, 18, 19, 20, 21])]
)
def test_trained_batches_go_but_those_a_resume_would_train(tmp_path, checkpoint, kept):
    """With `trainer.checkpoint.every = 0` (no checkpoint) the batches stay bounded: the newest
    `keep` trained ones, the one not yet trained, and batch 1, which a resume from scratch trains."""
    rundir = RunDir(tmp_path)
    run_id = rundir.ensure_run({}).run_id
    publish(rundir, run_id, range(1, 22))
    if checkpoint:
        rundir.checkpoints.write_marker(checkpoint, run_id)
    BatchRetention(rundir, run_id, keep=4).prune_consumed(20)
    assert rundir.rollouts.steps() == kept
    # what a resume from the checkpoint keeps of them is exactly what was protected
    discard_batches_after(rundir, run_id, checkpoint)
    assert rundir.rollouts.steps() == [s for s in kept if s <= checkpoint + 1]
