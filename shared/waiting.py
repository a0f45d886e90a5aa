"""Waits with a deadline and a message: nothing in triad hangs silently."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from shared.errors import WaitTimeout

T = TypeVar("T")
log = logging.getLogger("triad.waiting")
BACKOFF = 1.5  # each empty poll waits this much longer, from the floor up to `poll`
MARKER_POLL_CAP_S = 0.1  # the longest interval between looks at a marker on the critical path


def poll_cap(floor: float) -> float:
    """The longest interval of a marker wait whose polls start at `floor`: ten times the floor
    (a look costs about a floor: at most ~10% of a core spent looking), at most 0.1 s, at
    least the floor. Locally 20 ms; in an object store 0.1 s."""
    return max(floor, min(MARKER_POLL_CAP_S, 10 * floor))


class Backoff:
    """Poll intervals that start at `floor` and grow by `BACKOFF` up to `cap`: an event that
    comes soon after the wait starts is seen within milliseconds, a long wait costs few polls.
    `reset()` after each event."""

    def __init__(self, floor: float, cap: float) -> None:
        self.floor, self.cap = min(floor, cap), cap
        self.interval = self.floor

    def next(self) -> float:
        """The interval to sleep now; the next one is longer, up to the cap."""
        interval = self.interval
        self.interval = min(self.interval * BACKOFF, self.cap)
        return interval

    def reset(self) -> None:
        self.interval = self.floor


class Peer(Protocol):
    """The side a wait waits on (`shared/liveness.py` `PeerWatch`): `check` raises WaitTimeout
    once it has made no progress for its stall bound."""

    def reset(self) -> None: ...

    def check(self, what: str) -> None: ...

    def last_sign(self) -> str: ...


class _Progress:
    def __init__(self, what: str, timeout: float | None, log_every: float, peer: Peer | None = None) -> None:
        self.what, self.timeout, self.log_every, self.peer = what, timeout, log_every, peer
        self.start = self.last_log = time.monotonic()
        if peer is not None:
            peer.reset()

    def tick(self) -> None:
        now = time.monotonic()
        waited = now - self.start
        if self.timeout is not None and waited >= self.timeout:
            raise WaitTimeout(f"gave up after {self.timeout:.0f} s waiting for {self.what}")
        if self.peer is not None:
            self.peer.check(self.what)
        if now - self.last_log >= self.log_every:
            self.last_log = now
            if self.peer is not None:
                log.info("still waiting for %s (%.0f s; %s)", self.what, waited, self.peer.last_sign())
            else:
                log.info("still waiting for %s (%.0f s of %.0f s)", self.what, waited, self.timeout)


def wait_for(
    check: Callable[[], T | None],
    what: str,
    timeout: float | None,
    poll: float = 0.1,
    log_every: float = 15.0,
    floor: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    peer: Peer | None = None,
) -> T:
    """Call `check` until it returns something other than None, or time out: after `timeout`
    seconds, or (`peer`) once the side it waits on has stopped making progress. Every `poll`
    seconds, or with `floor` at intervals growing from `floor` to `poll` (`Backoff`). `sleep`
    may end an interval early (`shared/watch.py`'s `DirWatch.wait`)."""
    progress = _Progress(what, timeout, log_every, peer)
    intervals = Backoff(poll if floor is None else floor, poll)
    while (result := check()) is None:
        progress.tick()
        sleep(intervals.next())
    return result


async def async_wait_for(
    check: Callable[[], Awaitable[T | None]],
    what: str,
    timeout: float,
    poll: float = 0.1,
    log_every: float = 15.0,
    floor: float | None = None,
) -> T:
    progress = _Progress(what, timeout, log_every)
    intervals = Backoff(poll if floor is None else floor, poll)
    while (result := await check()) is None:
        progress.tick()
        await asyncio.sleep(intervals.next())
    return result
