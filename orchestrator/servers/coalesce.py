"""Requests asked for in one turn of the event loop under the same key, sent together.

The producer starts every group the staleness guard frees in one go (a whole batch at η = 1), and
each group asks for its samples at once. vLLM's completions API takes a list of prompts, so the
pool sends such first requests as one HTTP request per healthy server instead of one per group:
the server's front end parses, schedules and answers once, not once per group. The embedded
default's step: 7-13% shorter, medians of two sittings of A B runs (`bench/results/quick_profile.md`).

`Coalescer` is the waiting room alone: what a key means and how a list of items is sent are the
caller's (`pool.ServerPool`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
P = TypeVar("P")
R = TypeVar("R")


class Coalescer(Generic[K, P, R]):
    """`ask(key, item)` waits until the event loop has run every task ready when it was called, so
    that the items asked for meanwhile under the same key go to `send` together, split into
    `parts()` lists (one per server). `send(key, items)` answers each item: its result, or the
    exception that item alone failed with; an exception `send` raises fails every item of its list.
    A caller cancelled leaves the others' answer alone; a list whose callers are all gone is
    cancelled."""

    def __init__(
        self,
        send: Callable[[K, list[P]], Awaitable[list[R | BaseException]]],
        parts: Callable[[], int],
    ) -> None:
        self.send, self.parts = send, parts
        self.waiting: dict[K, list[tuple[P, asyncio.Future[R]]]] = {}
        self.sending: set[asyncio.Task] = set()

    async def ask(self, key: K, item: P) -> R:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[R] = loop.create_future()
        waiting = self.waiting.setdefault(key, [])
        waiting.append((item, answer))
        if len(waiting) == 1:  # after the tasks already ready: the rest of this turn's askers
            loop.call_soon(self._flush, key)
        return await answer

    def _flush(self, key: K) -> None:
        members = self.waiting.pop(key)
        parts = max(1, min(self.parts(), len(members)))
        for part in range(parts):
            chunk = members[part::parts]
            task = asyncio.ensure_future(self._send(key, chunk))
            self.sending.add(task)
            task.add_done_callback(self.sending.discard)
            for _, answer in chunk:
                answer.add_done_callback(lambda _, chunk=chunk, task=task: self._abandoned(chunk, task))

    @staticmethod
    def _abandoned(chunk: list[tuple[P, asyncio.Future[R]]], task: asyncio.Task) -> None:
        if all(answer.cancelled() for _, answer in chunk):
            task.cancel()

    async def _send(self, key: K, chunk: list[tuple[P, asyncio.Future[R]]]) -> None:
        try:
            results = await self.send(key, [item for item, _ in chunk])
        except asyncio.CancelledError:
            for _, answer in chunk:
                answer.cancel()
            raise
        except Exception as e:
            results = [e] * len(chunk)
        for (_, answer), result in zip(chunk, results, strict=True):
            if answer.done():
                continue
            if isinstance(result, BaseException):
                answer.set_exception(result)
            else:
                answer.set_result(result)
