"""Where the orchestrator runs code it does not own: rewards, responses, metrics, tools, agents.

A coroutine function is awaited on the event loop (it must not block it). Anything else runs
in a worker thread, one call at a time per worker, so that the loop keeps generating, checking health and
following weights while it runs, and an `asyncio.timeout` around the call can fire. These
threads are not the loop's default executor, which publishes batches and polls markers: a
hung reward cannot starve those.

A thread cannot be stopped. A call whose caller gives up (its time ran out) returns at once,
and its worker counts as *stuck* until the function returns; then it serves other calls. While
`orchestrator.max_stuck_calls` workers are stuck, new calls fail at once with one line naming
the function and the cap, rather than pile up threads. Workers are daemon threads, so a stuck
one does not keep the process from exiting (`concurrent.futures` joins its workers at exit,
which is why this is not a `ThreadPoolExecutor`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import queue
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
class _Job:
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[Any]
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict[str, Any]
    started: bool = False
    finished: bool = False
    abandoned: bool = False


class Workers:
    """Daemon worker threads for sync untrusted calls, reused, with a cap on the stuck ones.

    A call never waits for a busy worker: it takes an idle one or starts one, so its time limit
    counts its own run only, and there are at most as many workers as calls ever ran at once."""

    def __init__(self, max_stuck: int) -> None:
        self.max_stuck = max_stuck
        self.stuck = 0
        self.threads = 0
        self._lock = threading.Lock()
        self._idle = threading.Semaphore(0)
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) in a worker thread; a cancelled caller leaves it stuck until it returns."""
        with self._lock:
            if self.stuck >= self.max_stuck:
                raise TooManyStuck(
                    f"not calling {name_of(fn)}: {self.stuck} untrusted calls ran past their time limit and "
                    f"are still running (orchestrator.max_stuck_calls = {self.max_stuck}); "
                    "make the reward, tool or agent return in time"
                )
        loop = asyncio.get_running_loop()
        job = _Job(loop, loop.create_future(), fn, args, kwargs)
        if not self._idle.acquire(blocking=False):
            self._start_worker()
        self._jobs.put(job)
        try:
            return await job.done
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    def _start_worker(self) -> None:
        with self._lock:
            self.threads += 1
            name = f"triad-untrusted-{self.threads}"
        threading.Thread(target=self._serve, daemon=True, name=name).start()

    def _abandon(self, job: _Job) -> None:
        with self._lock:
            job.abandoned = True
            if not job.started or job.finished:
                return
            self.stuck += 1
            stuck = self.stuck
        if stuck == self.max_stuck:
            log.warning("%d untrusted calls are stuck, the last %s (orchestrator.max_stuck_calls): "
                        "new ones fail until some return", stuck, name_of(job.fn))  # fmt: skip

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            outcome = self._work(job)
            self._idle.release()  # before the caller hears back, so that its next call reuses this worker
            if outcome is not None:
                with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                    job.loop.call_soon_threadsafe(_settle, job.done, *outcome)

    def _work(self, job: _Job) -> tuple[Any, BaseException | None] | None:
        """(result, error) of the job; None if its caller gave up before it started."""
        with self._lock:
            if job.abandoned:
                return None
            job.started = True
        result: Any = None
        error: BaseException | None = None
        try:
            result = job.fn(*job.args, **job.kwargs)
        except BaseException as e:  # the caller's to handle, whatever it is
            error = e
        with self._lock:
            job.finished = True
            if job.abandoned:
                self.stuck -= 1
        return result, error


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
