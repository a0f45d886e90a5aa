"""What a sample, a model output, an environment or one server call can do to an episode: never end the run.

An episode that cannot go on (a request its server refused: a prompt over the
context, a template that cannot render a turn; an environment's `respond` that
raised or ran past `orchestrator.environment.timeout_s`; the episode past
`orchestrator.environment.episode_timeout_s`) is dropped with its group before its first
model turn, and ends truncated after it, its turns so far kept. A group whose
reward or metrics function raises, or whose request failed on every retry, is
dropped (`RolloutFailed`); with `orchestrator.partial_groups` a group may train on
its finished episodes alone (`orchestrator/episodes/run.py`). Each case is counted under its cause (`CAUSES`)
in the step's metrics; `orchestrator.max_failed_groups` groups failed in a row
stop the run with one line naming the cause.
"""

from __future__ import annotations

import logging
from collections import Counter

from shared.errors import TriadError

log = logging.getLogger("triad.orchestrator")
CAUSES = {
    "server": "every retry of a request failed",
    "context": "the ids so far fill the model's context",
    "generate": "the server refused a generation request (4xx)",
    "render": "the server refused to render the chat (4xx: over the context, a template that raises)",
    "derender": "the server refused to parse a model turn (4xx)",
    "tokenize": "the server refused to tokenize an environment reply (4xx)",
    "prompt": "the environment gave a malformed chat prompt",
    "respond": "the environment's respond raised, returned no str, or ran past its bound "
    "(orchestrator.environment.timeout_s)",
    "reward": "the environment's reward raised, ran past its bound (orchestrator.environment.timeout_s) or "
    "gave no finite number",
    "metrics": "the environment's metrics raised or returned no dict of numbers",
    "timeout": "the episode ran past orchestrator.environment.episode_timeout_s",
}


class RolloutFailed(TriadError):
    """A group cannot be trained on: it is dropped, counted under `cause`, and the run goes on."""

    def __init__(self, message: str, cause: str = "server") -> None:
        super().__init__(message)
        self.cause = cause


class EpisodeEnded(TriadError):
    """An episode cannot go on: before its first model turn its group is dropped, after it the
    episode ends truncated."""

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause


class Failures:
    """Groups dropped and episodes cut short since the last step, by cause, and groups failed in a
    row, so that a run in which every group fails stops instead of retrying for ever."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_a_row = 0
        self.groups: Counter[str] = Counter()
        self.truncated: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def group_failed(self, error: RolloutFailed) -> None:
        self.in_a_row += 1
        self.groups[error.cause] += 1
        if self.in_a_row >= self.limit:
            raise TriadError(
                f"{self.in_a_row} groups failed in a row (orchestrator.max_failed_groups); the last, "
                f"of cause {error.cause!r} ({CAUSES.get(error.cause, error.cause)}): {error}"
            )

    def succeeded(self) -> None:
        self.in_a_row = 0

    def episode_truncated(self, cause: str) -> None:
        self.truncated[cause] += 1

    def episode_dropped(self, cause: str) -> None:
        self.dropped[cause] += 1

    def take(self) -> dict[str, int]:
        """`groups_failed` and the non-zero counts by cause since the last call."""
        out = {"groups_failed": sum(self.groups.values())}
        for prefix, counts in (
            ("groups_failed", self.groups),
            ("episodes_truncated", self.truncated),
            ("episodes_dropped", self.dropped),
        ):
            out |= {f"{prefix}_{cause}": n for cause, n in sorted(counts.items()) if n}
        self.groups, self.truncated, self.dropped = Counter(), Counter(), Counter()
        return out
