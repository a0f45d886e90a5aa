"""The orchestrator's batches in the run directory: which it keeps once the trainer is done
with them. The orchestrator writes them, so it prunes them, each time the weight follower
sees a new version."""

from __future__ import annotations

from shared.resume import newest_checkpoint
from shared.rundir import RunDir


class BatchRetention:
    """Keeps the newest `keep` batches the trainer is done with (`orchestrator.keep_rollouts`)."""

    def __init__(self, rundir: RunDir, run_id: str, keep: int) -> None:
        self.rundir, self.run_id, self.keep = rundir, run_id, keep

    def prune_consumed(self, version: int) -> None:
        """A batch is done with once trained *and* checkpointed: a resumed trainer restarts after C.
        Store reads and removals: run it in a thread."""
        consumed = min(version, newest_checkpoint(self.rundir, self.run_id))
        self.rundir.rollouts.prune(self.keep, done_upto=consumed)
