"""Several inference servers behind one call: balancing, retries, health checks.

A request goes to the healthy server with the fewest requests in flight (or the
one a multi-turn episode already uses). A failed or timed-out request (a 5xx,
408 or 429 answer, a cut or invalid body, a dropped connection) is retried on
another server after an exponential backoff, or the server's `Retry-After`
if longer (both bounded by MAX_BACKOFF_S); a refused one (another 4xx) is not.
A server that fails `servers.max_failures` times in a row is taken out of
rotation with a warning. Failed attempts are counted by kind in each step's metrics.
The health watcher polls every server: one that stops answering is taken out,
one that comes back (a restart, say) is given the run's current weights before
it serves rollouts again. With no healthy server for `servers.ready_timeout_s` the
orchestrator stops with an error that names each server and why it is out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from orchestrator.failures import RolloutFailed
from orchestrator.servers.backends.base import WeightBackend
from orchestrator.servers.calls import failure_kind
from orchestrator.servers.client import Completion, InferenceClient, RequestRejected
from shared.config import OrchestratorConfig
from shared.errors import TriadError

T = TypeVar("T")
log = logging.getLogger("triad.orchestrator")
MAX_BACKOFF_S = 30.0


@dataclass
class Server:
    client: InferenceClient
    backend: WeightBackend
    version: int = 0  # the weights version it serves
    healthy: bool = True
    failures: int = 0  # consecutive
    why_out: str = ""
    answered_at: float | None = None  # wall clock of its last finished request or /health answer
    loading: asyncio.Lock = field(default_factory=asyncio.Lock)  # one weight load at a time

    @property
    def url(self) -> str:
        return self.client.base_url

    @property
    def alive_at(self) -> float | None:
        """Its last sign of life: a finished request, a /health answer or a streamed chunk."""
        seen = [t for t in (self.answered_at, self.client.progressed_at) if t]
        return max(seen) if seen else None


def last_answer(server: Server, now: float | None = None) -> str:
    alive = server.alive_at
    if alive is None:
        return "it has not answered yet"
    now = time.time() if now is None else now
    at = time.strftime("%H:%M:%S UTC", time.gmtime(alive))
    return f"it last answered {max(now - alive, 0):.0f} s ago (at {at})"


class ServerPool:
    def __init__(self, servers: list[Server], oc: OrchestratorConfig) -> None:
        self.servers, self.oc = servers, oc
        self.latencies: list[float] = []  # of successful requests since the last `take_latencies`
        self.spans: list[list[float]] = []  # [wall-clock start, seconds] of those requests
        self.failed: Counter[str] = Counter()  # failed request attempts since `take_requests`, by kind
        self.none_healthy_since: float | None = None  # monotonic; `check_some_healthy`'s

    def add(self, server: Server) -> None:
        self.servers.append(server)
        if server.healthy:
            self.none_healthy_since = None

    def remove(self, server: Server, why: str) -> None:
        """Drop a server from the pool for good (requests in flight on it fail and are retried)."""
        if self.has(server):
            log.warning("removing inference server %s from the pool: %s", server.url, why)
            self.servers[:] = [s for s in self.servers if s is not server]
        server.healthy, server.why_out = False, why

    def has(self, server: Server) -> bool:
        return any(s is server for s in self.servers)

    def healthy(self) -> list[Server]:
        return [s for s in self.servers if s.healthy]

    def answered_lately(self, server: Server) -> bool:
        """Whether `server` made progress (a rollout answer or chunk, a finished request, a /health
        answer) within `request_timeout_s`: the bound on a request's lack of progress also bounds
        a server's."""
        alive = server.alive_at
        return alive is not None and time.time() - alive < self.oc.servers.request_timeout_s

    def take_out(self, server: Server, why: str) -> None:
        why = f"{why}; {last_answer(server)}"
        if server.healthy:
            log.warning("taking inference server %s out of rotation: %s", server.url, why)
        server.healthy, server.why_out = False, why

    async def pick(self, prefer: Server | None = None) -> Server:
        deadline = time.monotonic() + self.oc.servers.ready_timeout_s
        while True:
            if prefer is not None and prefer.healthy:
                return prefer
            healthy = self.healthy()
            if healthy:
                return min(healthy, key=lambda s: s.client.inflight)
            if time.monotonic() > deadline:
                raise self.none_healthy()
            await asyncio.sleep(0.1)

    def none_healthy(self) -> TriadError:
        out = "; ".join(f"{s.url}: {s.why_out}" for s in self.servers)
        return TriadError(f"no inference server healthy for {self.oc.servers.ready_timeout_s:g} s ({out})")

    def check_some_healthy(self) -> None:
        """For a wait polled while the servers must load weights (not `pick`ing one): TriadError once
        no server has been healthy for `servers.ready_timeout_s`, as `pick` ends. The clock starts
        at the first call that finds none, and a server coming back (`add`, the health watcher)
        stops it, whether or not a call saw it."""
        now = time.monotonic()
        if self.healthy():
            self.none_healthy_since = None
        elif self.none_healthy_since is None:
            self.none_healthy_since = now
        elif now - self.none_healthy_since > self.oc.servers.ready_timeout_s:
            raise self.none_healthy()

    async def complete(
        self,
        prompt: str | list[int],
        n: int,
        prefer: Server | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> tuple[list[Completion], Server, int]:
        """Completions, the server that made them, and the version it served when asked; `seed`
        (a retry sends the same): the request's, from `episodes.seeds`."""
        max_tokens = max_tokens or self.oc.sampling.max_tokens

        async def ask(server: Server) -> tuple[list[Completion], int, float, float]:
            version, started, wall = server.version, time.monotonic(), time.time()
            model = server.backend.model(version)  # a LoRA run's adapter of that version
            room = server.client.room(prompt, max_tokens)
            out = await server.client.complete(prompt, n, room, self.oc.sampling.temperature, model, seed)
            return out, version, time.monotonic() - started, wall

        (out, version, latency, wall), server = await self.request(ask, "a rollout", prefer)
        self.latencies.append(latency)
        self.spans.append([round(wall, 3), round(latency, 4)])
        return out, server, version

    async def request(
        self, call: Callable[[Server], Awaitable[T]], what: str, prefer: Server | None = None
    ) -> tuple[T, Server]:
        """`call` on a healthy server (`prefer` first); a failure is retried on another with backoff,
        a server that keeps failing is taken out, and a request the server refuses (4xx) is not retried.
        RolloutFailed once every attempt failed: its group is dropped, the run goes on."""
        error: TriadError | None = None
        for attempt in range(self.oc.servers.max_retries + 1):
            server = await self.pick(prefer)
            try:
                out = await call(server)
            except RequestRejected as e:
                self.failed[failure_kind(e)] += 1
                raise
            except TriadError as e:
                error, prefer = e, None
                self.failed[failure_kind(e)] += 1
                server.failures += 1
                if server.failures >= self.oc.servers.max_failures:
                    self.take_out(server, f"{server.failures} failed requests in a row, the last: {e}")
                asked = getattr(e, "retry_after", None) or 0.0  # the server's Retry-After, if it gave one
                await asyncio.sleep(
                    min(max(self.oc.servers.retry_backoff_s * 2**attempt, asked), MAX_BACKOFF_S)
                )
                continue
            server.failures, server.answered_at = 0, time.time()
            return out, server
        raise RolloutFailed(f"{what} failed {self.oc.servers.max_retries + 1} times; the last error: {error}")

    def take_latencies(self) -> list[float]:
        out, self.latencies = self.latencies, []
        return out

    def take_requests(self) -> dict[str, object]:
        """Since the last call: the failed request attempts, in all and by kind (`failure_kind`),
        and each successful rollout request's [wall-clock start, seconds]."""
        out: dict[str, object] = {"requests_failed": self.failed.total()}
        out |= {f"requests_failed_{kind}": n for kind, n in sorted(self.failed.items())}
        out["request_spans"] = self.spans
        self.failed, self.spans = Counter(), []
        return out

    async def watch_health(self, realign: Callable[[Server], Awaitable[None]]) -> None:
        """Forever: take out servers that stop answering, re-align and re-admit those back."""
        while True:
            await asyncio.sleep(self.oc.servers.health_interval_s)
            await asyncio.gather(*(self._check(s, realign) for s in self.servers))

    async def _check(self, server: Server, realign: Callable[[Server], Awaitable[None]]) -> None:
        health = await server.client.health()
        if not health.ok and health.slow and self.answered_lately(server):
            why = f"{health.why}, but {last_answer(server)}"
            log.debug("inference server %s is busy, not stuck: %s", server.url, why)
            return
        if not health.ok:
            self.take_out(server, health.why)
            return
        server.answered_at = time.time()
        if server.loading.locked():
            return
        try:
            served = (await server.backend.current()).version
            if not server.healthy or served != server.version:
                await realign(server)
        except TriadError as e:
            self.take_out(server, f"could not give it the current weights: {e}")
            return
        if not server.healthy and self.has(server):
            log.info("inference server %s is back, serving version %d", server.url, server.version)
            server.healthy, server.failures, server.why_out = True, 0, ""
            self.none_healthy_since = None
