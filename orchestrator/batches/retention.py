"""The orchestrator's batches in the run directory: which it keeps once the trainer is done
with them. The orchestrator writes them, so it prunes them, each time the weight follower
sees a new version."""

from __future__ import annotations

from shared.resume import newest_checkpoint
from shared.rundir import RunDir


class BatchRetention:
    """Keeps the newest `keep` batches the trainer is done with (`orchestrator.keep_rollouts`),
    and those a resume could still train."""

    def __init__(self, rundir: RunDir, run_id: str, keep: int) -> None:
        self.rundir, self.run_id, self.keep = rundir, run_id, keep

    def prune_consumed(self, version: int) -> None:
        """Batches up to `version` are trained. A resumed trainer restarts after its newest
        checkpoint C and trains again only the batches after C sampled from versions <= C
        (`shared/resume.py` discards the rest): those are kept, every other trained batch but
        the newest `keep` goes. Without checkpoints (`trainer.checkpoint.every = 0`, C = 0)
        that bounds the batches kept too. Store reads and removals: run it in a thread."""
        checkpoint = newest_checkpoint(self.rundir, self.run_id)
        resumable = frozenset(
            step
            for step in self.rundir.rollouts.steps()
            if checkpoint < step <= version and self.sampled_upto(step) <= checkpoint
        )
        self.rundir.rollouts.prune(self.keep, done_upto=version, protect=resumable)

    def sampled_upto(self, step: int) -> float:
        """The newest policy version in batch `step` (infinite for a batch without its marker)."""
        marker = self.rundir.rollouts.marker(step, self.run_id)
        newest = getattr(marker, "max_policy_version", None) if marker else None
        return float("inf") if newest is None else newest
