"""What the trainer has published in `weights/`, as the orchestrator reads it."""

from __future__ import annotations

from shared.admin_api import WeightsInfo
from shared.errors import TriadError
from shared.rundir import Marker, RunDir


class TrainerRewound(TriadError):
    """The trainer restarted from a checkpoint older than the weights being served."""


class PublishedWeights:
    def __init__(self, rundir: RunDir, run_id: str) -> None:
        self.rundir, self.run_id = rundir, run_id

    def newest(self, after: int, loadable: bool = False) -> int | None:
        """The newest version of this run with a valid marker, if newer than `after`;
        with `loadable`, only one written as files (not by broadcast only)."""
        found = self.newest_marked(after, loadable)
        return None if found is None else found[0]

    def newest_marked(self, after: int, loadable: bool = False) -> tuple[int, Marker] | None:
        """`newest`, with the marker it read (in an object store each read is a round trip)."""
        for v in reversed(self.rundir.weights.steps()):
            if v <= after:
                return None
            marker = self.rundir.weights.marker(v, self.run_id)
            if marker is not None and (not loadable or getattr(marker, "files", True)):
                return v, marker
        return None

    def holds(self, info: WeightsInfo) -> bool:
        """Whether a server's weights are this run's: its base model, or a
        published version of this run (not one left from another run)."""
        if info.path == info.base_path:
            return info.version == 0
        marker = self.rundir.weights.marker(info.version, self.run_id)
        return marker is not None and info.path == self.rundir.weights.relative(info.version)

    def check_lineage(self, followed: int, followed_created: float) -> None:
        """A restarted trainer deletes weights newer than its checkpoint, and may publish
        a version again: if the version we followed is gone or replaced, raise."""
        if followed == 0:
            return
        marker = self.rundir.weights.marker(followed, self.run_id)
        if marker is None:
            back_to = self.newest(after=-1) or 0
            if back_to < followed:
                raise TrainerRewound(
                    f"the trainer went back from version {followed} to {back_to} "
                    "(it resumed from a checkpoint): starting over from there"
                )
        elif marker.created_at != followed_created:
            raise TrainerRewound(
                f"version {followed} was published again by a resumed trainer: "
                "starting over from its checkpoint"
            )
