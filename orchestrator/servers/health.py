"""The pool's health watcher: every `servers.health_interval_s` each server's /health is asked; one
that stops answering is taken out of rotation (unless it answered a request lately: busy, not
stuck), one that comes back (a restart, say) is given the run's current weights before it serves
rollouts again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from orchestrator.servers.pool import Server, ServerPool, last_answer
from shared.errors import TriadError

log = logging.getLogger("triad.orchestrator")


async def watch_health(pool: ServerPool, realign: Callable[[Server], Awaitable[None]]) -> None:
    """Forever: take out servers that stop answering, re-align and re-admit those back."""
    while True:
        await asyncio.sleep(pool.oc.servers.health_interval_s)
        await asyncio.gather(*(check(pool, s, realign) for s in pool.servers))


async def check(pool: ServerPool, server: Server, realign: Callable[[Server], Awaitable[None]]) -> None:
    health = await server.client.health()
    if not health.ok and health.slow and pool.answered_lately(server):
        why = f"{health.why}, but {last_answer(server)}"
        log.debug("inference server %s is busy, not stuck: %s", server.url, why)
        return
    if not health.ok:
        pool.take_out(server, health.why)
        return
    server.answered_at = time.time()
    if server.loading.locked():
        return
    try:
        served = (await server.backend.current()).version
        if not server.healthy or served != server.version:
            await realign(server)
    except TriadError as e:
        pool.take_out(server, f"could not give it the current weights: {e}")
        return
    if not server.healthy and pool.has(server):
        pool.readmit(server)
