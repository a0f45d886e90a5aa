"""Calls into the environment's own code (rewards, responses, metrics, tools, agents) off the event loop.

This is no sandbox: the code runs in this process, with its memory, files and rights. What this
module gives is that a slow or hung call does not stop the loop: a coroutine function is awaited on
the loop (it must not block it); anything else runs in a bounded pool of worker threads, so that the
loop keeps generating, checking health and following weights while it runs, and the caller's
`asyncio.timeout` can fire. These threads are not the loop's default executor, which publishes
batches and polls markers: a hung reward cannot starve those.

The pool has at most `orchestrator.environment.threads` threads; a call that finds none free waits in a
queue. The caller's time limit counts from the moment it called, its wait for a thread included:
the limit bounds how long an episode waits for the environment, which is what holds up a step. A
call whose caller gave up before a thread took it never runs.

A thread cannot be stopped. A call whose caller gives up while it runs returns at once, and its
thread counts as *stuck* until the function returns; then it serves other calls. While
`orchestrator.environment.max_stuck_calls` threads are stuck, no new thread is started: a new call waits for a
stuck one to return, within its caller's time limit. A call whose limit passes there never runs,
and `not_started()` gives its caller the one line that says so, naming the function and the cap.
(Failing such calls at once instead made a burst of slow calls fail every group in flight within
a second, and the run stop on `orchestrator.max_failed_groups`, although the calls came back.)

Threads are daemons, so a stuck one does not keep the process from exiting (`concurrent.futures`
joins its workers at exit, which is why this is not a `ThreadPoolExecutor`).

Agent episodes (`episodes/agents.py`) have a pool of their own, sized by the episodes that may run at once,
and run there whether `run_agent` is a coroutine function or not: an `async def` gets an event loop
of its own in its thread, so a blocking call in it cannot stall the loop that serves its proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import queue
import threading
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from shared.config import OrchestratorConfig
from shared.errors import TriadError

log = logging.getLogger("triad.orchestrator")
# why the current task's last call never ran, set when its caller gave up while it waited at the cap
_NOT_STARTED: ContextVar[str | None] = ContextVar("not_started", default=None)


class TooManyStuck(TriadError):
    """The cap on stuck threads held for the whole of a call's time limit: the call never ran."""


def not_started() -> str | None:
    """Why the current task's last call never ran (its time limit passed while it waited at the
    cap on stuck threads); None if it did run. Read once: a second read gives None."""
    why = _NOT_STARTED.get()
    _NOT_STARTED.set(None)
    return why


def name_of(fn: Callable[..., Any]) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(type(fn).__call__)


class ThreadLoop:
    """fn(*args) in the calling thread; an awaitable it returns is run to its end on a new event loop
    of that thread's own. `cancel` (from any thread) cancels that awaitable at its next await."""

    def __init__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.__qualname__ = name_of(fn)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._cancelled = False

    def __call__(self) -> Any:
        result = self.fn(*self.args, **self.kwargs)
        if not inspect.isawaitable(result):
            return result
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)  # for code that asks asyncio.get_event_loop()
        try:
            with self._lock:
                self._loop, self._task = loop, loop.create_task(_awaited(result))
                if self._cancelled:
                    self._task.cancel()
            return loop.run_until_complete(self._task)
        finally:
            with self._lock:
                self._loop = None
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
            asyncio.set_event_loop(None)
            loop.close()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            if self._loop is not None and self._task is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    self._loop.call_soon_threadsafe(self._task.cancel)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


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


class EnvThreads:
    """A bounded pool of daemon threads for sync environment calls, with a cap on the stuck ones.

    A call takes an idle thread, or starts one while there are fewer than `size`, or waits in the
    queue for one. Counted, for the step's metrics: calls waiting now, threads stuck now, and calls
    whose caller gave up while they ran (`overran`, since the last `take`)."""

    def __init__(self, size: int, max_stuck: int, name: str = "env-call") -> None:
        self.size, self.max_stuck, self.name = size, max_stuck, name
        self.stuck = 0
        self.threads = 0
        self.idle = 0  # threads waiting for a job
        self.queued = 0  # jobs no thread has taken yet
        self.waiting = 0  # calls waiting for a stuck thread to return (the cap reached)
        self.overran = 0
        self.waited = 0  # calls that found the cap reached and waited for a stuck one to return
        self.not_started = 0  # calls whose time limit passed in that wait
        self._lock = threading.Lock()
        self._waiters: list[asyncio.Future[None]] = []
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()

    def configure(self, size: int, max_stuck: int) -> None:
        with self._lock:
            self.size, self.max_stuck = size, max_stuck

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """fn(*args, **kwargs) in a pool thread; a cancelled caller leaves it stuck until it returns."""
        _NOT_STARTED.set(None)
        await self._room(fn)
        loop = asyncio.get_running_loop()
        job = _Job(loop, loop.create_future(), fn, args, kwargs)
        with self._lock:
            start = self.idle <= self.queued and self.threads < self.size
            if start:
                self.threads += 1
                self.idle += 1
                name = f"triad-{self.name}-{self.threads}"
            self.queued += 1
        if start:
            threading.Thread(target=self._serve, daemon=True, name=name).start()
        self._jobs.put(job)
        try:
            return await job.done
        except asyncio.CancelledError:
            self._abandon(job)
            raise

    async def _room(self, fn: Callable[..., Any]) -> None:
        """Returns once fewer than `max_stuck` threads are stuck; until then the call waits, for as
        long as its caller's time limit allows."""
        counted = False
        while True:
            with self._lock:
                if self.stuck < self.max_stuck:
                    return
                waiter = asyncio.get_running_loop().create_future()
                self._waiters.append(waiter)
                self.waiting += 1
                if not counted:  # once per call, however often it is woken
                    self.waited += 1
                    counted = True
                why = (
                    f"did not start {name_of(fn)}: {self.stuck} environment calls ran past their time "
                    f"limit and none returned within this one's (orchestrator.environment.max_stuck_calls = "
                    f"{self.max_stuck}); make the reward, tool or agent return in time"
                )
            try:
                await waiter
            except asyncio.CancelledError:
                _NOT_STARTED.set(why)
                with self._lock:
                    self.not_started += 1
                raise
            finally:
                with self._lock:
                    self.waiting -= 1
                    if waiter in self._waiters:
                        self._waiters.remove(waiter)

    def _abandon(self, job: _Job) -> None:
        with self._lock:
            job.abandoned = True
            if not job.started or job.finished:
                return
            self.stuck += 1
            self.overran += 1
            stuck = self.stuck
        if isinstance(job.fn, ThreadLoop):
            job.fn.cancel()
        if stuck == self.max_stuck:
            log.warning(
                "%d environment calls are stuck, the last %s (orchestrator.environment.max_stuck_calls): "
                "new ones wait until some return",
                stuck,
                name_of(job.fn),
            )

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            with self._lock:
                self.idle -= 1
                self.queued -= 1
            outcome = self._work(job)
            with self._lock:
                self.idle += 1  # before the caller hears back, so that its next call reuses this thread
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
        waiters: list[asyncio.Future[None]] = []
        with self._lock:
            job.finished = True
            if job.abandoned:
                self.stuck -= 1
                waiters, self._waiters = self._waiters, []
        for waiter in waiters:  # each looks again: one of them takes the room
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody waits any more
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)
        return result, error

    def take(self) -> dict[str, int]:
        """Now: calls waiting for a thread (a free one, or at the cap a stuck one to return) and
        stuck threads; since the last call: calls that overran, that waited at the cap, and that
        did not start within their time limit there."""
        with self._lock:
            out = {
                "queued": self.queued + self.waiting,
                "stuck": self.stuck,
                "overran": self.overran,
                "waited": self.waited,
                "not_started": self.not_started,
            }
            self.overran = self.waited = self.not_started = 0
        return out


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _settle(done: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if done.done():
        return
    if error is None:
        done.set_result(result)
    else:
        done.set_exception(error)


def agent_episodes_at_once(oc: OrchestratorConfig) -> int:
    """Agent episodes that may run at once: the groups in flight, and an evaluation's."""
    return oc.max_inflight * oc.group_size + oc.eval.size * oc.eval.k


_DEFAULTS = OrchestratorConfig()
THREADS = EnvThreads(_DEFAULTS.environment.threads, _DEFAULTS.environment.max_stuck_calls)
AGENT_THREADS = EnvThreads(agent_episodes_at_once(_DEFAULTS), _DEFAULTS.environment.max_stuck_calls, "agent")


def configure(oc: OrchestratorConfig) -> None:
    THREADS.configure(oc.environment.threads, oc.environment.max_stuck_calls)
    AGENT_THREADS.configure(agent_episodes_at_once(oc), oc.environment.max_stuck_calls)


def take_counts() -> dict[str, int]:
    """The step's metrics of both pools: `env_calls_queued`, `env_calls_stuck`, `env_calls_overran`,
    `env_calls_waited`, `env_calls_not_started` (`EnvThreads.take`)."""
    calls, agents = THREADS.take(), AGENT_THREADS.take()
    return {f"env_calls_{key}": calls[key] + agents[key] for key in calls}


async def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs): a coroutine function on the loop, anything else in a thread of the pool
    (a result that is awaitable is then awaited on the loop)."""
    if is_async(fn):
        _NOT_STARTED.set(None)
        return await fn(*args, **kwargs)
    result = await THREADS.run(fn, *args, **kwargs)
    return await result if inspect.isawaitable(result) else result


async def run_episode(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) in a thread of the agent pool, an awaitable it returns on that thread's own loop;
    a cancelled caller cancels that awaitable (it stops at its next await)."""
    return await AGENT_THREADS.run(ThreadLoop(fn, *args, **kwargs))
