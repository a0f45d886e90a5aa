"""What a restarted run keeps: the rules every service applies the same way.

The trainer resumes from its newest valid checkpoint C (the model after update
C). Weights newer than C, and batches sampled from them, belong to a lineage
the resumed trainer will not reproduce: they are discarded. Batches sampled
from versions <= C stay valid and are trained as they are. The orchestrator
continues after the newest batch that remains.
"""

from __future__ import annotations

import logging

from shared.rundir import RunDir

log = logging.getLogger("triad.resume")


def discard_after_checkpoint(rundir: RunDir, run_id: str, checkpoint_step: int) -> list[str]:
    """Before the trainer resumes from `checkpoint_step`: delete the weights newer than it
    and the batches it will not train on (`discard_batches_after`)."""
    removed = []
    for step in rundir.weights.steps():
        if step > checkpoint_step:
            rundir.weights.clear(step)
            removed.append(rundir.weights.relative(step))
    removed += discard_batches_after(rundir, run_id, checkpoint_step)
    if removed:
        log.info("resuming after update %d: discarded %s", checkpoint_step, ", ".join(removed))
    return removed


def discard_batches_after(rundir: RunDir, run_id: str, checkpoint_step: int) -> list[str]:
    """Delete every published batch after the checkpoint from the first one that was sampled from
    newer weights (or follows a gap or an unpublished batch) on, so that the batches left after
    it are an unbroken run C+1, C+2, ... the trainer can consume.

    A batch without its marker is not deleted: a live orchestrator may be writing it (a trainer
    started after the orchestrator, or restarted beside it), and one that restarts writes it
    again from the start (`publish_batch` clears it first).

    This is all an orchestrator that sees the trainer rewind may apply: by then the resumed
    trainer may have published versions after C again, and those are its own."""
    removed = []
    expected = checkpoint_step + 1
    for step in (s for s in rundir.rollouts.steps() if s > checkpoint_step):
        if not rundir.rollouts.has_marker(step):
            expected = -1  # nothing published after it is kept
            continue
        marker = rundir.rollouts.marker(step, run_id)  # None: another run's, or unreadable
        newest_version = getattr(marker, "max_policy_version", None) if marker else None
        if step == expected and newest_version is not None and newest_version <= checkpoint_step:
            expected += 1
            continue
        expected = -1  # the run is broken: nothing after this point is kept
        rundir.rollouts.clear(step)
        removed.append(rundir.rollouts.relative(step))
    return removed


def newest_batch(rundir: RunDir, run_id: str) -> int:
    """The newest published batch of this run; 0 if none."""
    return rundir.rollouts.newest(run_id)


def newest_checkpoint(rundir: RunDir, run_id: str) -> int:
    """The newest complete checkpoint of this run; 0 if none."""
    return rundir.checkpoints.newest(run_id)


def checkpointed_steps(rundir: RunDir, run_id: str) -> frozenset[int]:
    return frozenset(rundir.checkpoints.done_steps(run_id))
