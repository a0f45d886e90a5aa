"""Waits with a deadline and a message: nothing in triad hangs silently."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from shared.errors import WaitTimeout

T = TypeVar("T")
log = logging.getLogger("triad.waiting")


class _Progress:
    def __init__(self, what: str, timeout: float, log_every: float) -> None:
        self.what, self.timeout, self.log_every = what, timeout, log_every
        self.start = self.last_log = time.monotonic()

    def tick(self) -> None:
        now = time.monotonic()
        waited = now - self.start
        if waited >= self.timeout:
            raise WaitTimeout(f"gave up after {self.timeout:.0f} s waiting for {self.what}")
        if now - self.last_log >= self.log_every:
            self.last_log = now
            log.info("still waiting for %s (%.0f s of %.0f s)", self.what, waited, self.timeout)


def wait_for(
    check: Callable[[], T | None],
    what: str,
    timeout: float,
    poll: float = 0.1,
    log_every: float = 15.0,
) -> T:
    """Call `check` until it returns something other than None, or time out."""
    progress = _Progress(what, timeout, log_every)
    while (result := check()) is None:
        progress.tick()
        time.sleep(poll)
    return result


async def async_wait_for(
    check: Callable[[], Awaitable[T | None]],
    what: str,
    timeout: float,
    poll: float = 0.1,
    log_every: float = 15.0,
) -> T:
    progress = _Progress(what, timeout, log_every)
    while (result := await check()) is None:
        progress.tick()
        await asyncio.sleep(poll)
    return result
