"""What a sample, a model output, an environment or one server call can do to an episode: never end the run.

An episode that cannot go on (a request its server refused: a prompt over the
context, a template that cannot render a turn; an environment's `respond` that
raised or ran past `orchestrator.environment.timeout_s`; the episode past
`orchestrator.environment.episode_timeout_s`) is dropped with its group before its first
model turn, and ends truncated after it, its turns so far kept. A group whose
reward or metrics function raises, or whose request failed on every retry, is
dropped (`RolloutFailed`). With `orchestrator.partial_groups` a group trains on
its finished episodes when the others were dropped, if at least
`MIN_PARTIAL_GROUP` finished; its advantages are then relative to the finished
samples alone (still centred, zero-sum for grpo/dr_grpo, with rloo's n the
number finished), which leans toward the episodes that finish: hence off by
default. Each case is counted under its cause (`CAUSES`)
in the step's metrics; `orchestrator.max_failed_groups` groups failed in a row
stop the run with one line naming the cause.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Coroutine
from typing import Any

from orchestrator.client import RequestRejected
from orchestrator.sample import Sample
from shared.errors import TriadError

log = logging.getLogger("triad.orchestrator")
MIN_PARTIAL_GROUP = 2  # fewer finished samples have no group-relative advantage
CAUSES = {
    "server": "every retry of a request failed",
    "context": "the ids so far fill the model's context",
    "generate": "the server refused a generation request (4xx)",
    "render": "the server refused to render the chat (4xx: over the context, a template that raises)",
    "derender": "the server refused to parse a model turn (4xx)",
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


async def run_episode(
    sample: Sample, turns: Coroutine[Any, Any, None], timeout: float, where: str, failures: Failures
) -> Sample:
    """`sample` once `turns` (which fills it) is done, or once it cannot go on: RolloutFailed before
    its first model turn, truncated after it. `timeout` bounds the whole episode (0: unbounded)."""
    bound = asyncio.timeout(timeout or None)
    try:
        async with bound:
            await turns
    except (RequestRejected, EpisodeEnded, TimeoutError) as e:
        if isinstance(e, TimeoutError) and not bound.expired():
            raise
        cause = e.cause if isinstance(e, RequestRejected | EpisodeEnded) else "timeout"
        why = (
            str(e)
            if cause != "timeout"
            else f"ran past orchestrator.environment.episode_timeout_s ({timeout:g} s)"
        )
        if sample.turns == 0:
            raise RolloutFailed(f"{where}: {why}", cause) from None
        sample.truncated = True
        failures.episode_truncated(cause)
        log.info("%s: an episode ended truncated after %d turns: %s", where, sample.turns, why)
    return sample


async def finished_episodes(
    episodes: list[Coroutine[Any, Any, Sample]], partial: bool, failures: Failures
) -> list[Sample]:
    """The samples of a group's episodes, each run to its end. A dropped episode drops the group,
    unless `partial` and at least MIN_PARTIAL_GROUP finished: then it is counted and left out."""
    results = await asyncio.gather(*episodes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, RolloutFailed):
            raise result
    failed = [r for r in results if isinstance(r, RolloutFailed)]
    finished = [r for r in results if isinstance(r, Sample)]
    if failed and (not partial or len(finished) < MIN_PARTIAL_GROUP):
        raise failed[0]
    for error in failed:
        failures.episode_dropped(error.cause)
    return finished
