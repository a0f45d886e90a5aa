"""One episode run to its end, and a group's episodes: the loop every kind of rollout shares.

An episode that cannot go on ends truncated after its first model turn, and drops its group
before it (`orchestrator/failures.py`). With `orchestrator.partial_groups` a group trains on
its finished episodes when the others were dropped, if at least `MIN_PARTIAL_GROUP` finished;
its advantages are then relative to the finished samples alone (still centred, zero-sum for
grpo/dr_grpo, with rloo's n the number finished), which leans toward the episodes that finish:
hence off by default.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from orchestrator.episodes.sample import Sample
from orchestrator.failures import EpisodeEnded, Failures, RolloutFailed
from orchestrator.servers.client import RequestRejected

log = logging.getLogger("triad.orchestrator")
MIN_PARTIAL_GROUP = 2  # fewer finished samples have no group-relative advantage


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
