"""Where the orchestrator runs code it does not own: rewards, responses, metrics, tools, agents.

A coroutine function is awaited on the event loop (it must not block it). Anything else runs
in a worker thread of its own, so that the loop keeps generating, checking health and
following weights while it runs, and an `asyncio.timeout` around the call can fire. These
threads are not the loop's default executor, which publishes batches and polls markers: a
hung reward cannot starve those.

A thread cannot be stopped. A call whose caller gives up (its time ran out) returns at once,
and its worker counts as *stuck* until the function returns. While
`orchestrator.max_stuck_calls` workers are stuck, new calls fail at once with one line naming
the function and the cap, rather than pile up threads. Workers are daemon threads, so a stuck
one does not keep the process from exiting (`concurrent.futures` would join it at exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shared.config import OrchestratorConfig
from shared.errors import TriadError

log = logging.getLogger("triad.orchestrator")


class TooManyStuck(TriadError):
    """The cap on stuck workers is reached: the call was not started."""


def name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


@dataclass
class _Call:
    finished: bool = False
    abandoned: bool = False


class Workers:
    """Worker threads for sync untrusted calls, with a cap on the stuck ones."""

    def __init__(self, max_stuck: int) -> None:
        self.max_stuck = max_stuck
        self.stuck = 0
        self._lock = threading.Lock()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) in a new worker thread; a cancelled caller leaves it stuck until it returns."""
        with self._lock:
            if self.stuck >= self.max_stuck:
                raise TooManyStuck(
                    f"not calling {name_of(fn)}: {self.stuck} untrusted calls ran past their time limit and "
                    f"are still running (orchestrator.max_stuck_calls = {self.max_stuck}); "
                    "make the reward, tool or agent return in time"
                )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        call = _Call()
        worker = threading.Thread(
            target=self._work, args=(loop, done, call, fn, args, kwargs), daemon=True, name=name_of(fn)
        )
        worker.start()
        try:
            return await done
        except asyncio.CancelledError:
            self._abandon(call, fn)
            raise

    def _abandon(self, call: _Call, fn: Callable[..., Any]) -> None:
        with self._lock:
            if call.finished:
                return
            call.abandoned = True
            self.stuck += 1
            stuck = self.stuck
        if stuck == self.max_stuck:
            log.warning("%d untrusted calls are stuck, the last %s (orchestrator.max_stuck_calls): "
                        "new ones fail until some return", stuck, name_of(fn))  # fmt: skip

    def _work(self, loop: asyncio.AbstractEventLoop, done: asyncio.Future[Any], call: _Call,
              fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> None:  # fmt: skip
        result: Any = None
        error: BaseException | None = None
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # the caller's to handle, whatever it is
            error = e
        with self._lock:
            call.finished = True
            if call.abandoned:
                self.stuck -= 1
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, done, result, error)


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)


WORKERS = Workers(OrchestratorConfig.model_fields["max_stuck_calls"].default)


def configure(oc: OrchestratorConfig) -> None:
    WORKERS.max_stuck = oc.max_stuck_calls


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs): a coroutine function on the loop, anything else in a worker thread
    (a result that is awaitable is then awaited on the loop)."""
    if is_async(fn):
        return await fn(*args, **kwargs)
    result = await WORKERS.run(fn, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result
