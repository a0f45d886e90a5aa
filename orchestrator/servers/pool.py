"""Several inference servers behind one call: balancing, retries, health checks.

A request goes to the healthy server with the fewest prompts in flight (or the
one a multi-turn episode already uses); first requests asked for together share
one HTTP request per server (`coalesce.py`). A failed or timed-out request (a 5xx,
408 or 429 answer, a cut or invalid body, a dropped connection) is retried on
another server after an exponential backoff, or the server's `Retry-After`
if longer (both bounded by MAX_BACKOFF_S); a refused one (another 4xx) is not.
A server that fails `servers.max_failures` times in a row is taken out of
rotation with a warning. Failed attempts are counted by kind in each step's metrics.
The health watcher (`health.py`) takes out a server that stops answering and
re-admits one that comes back. With no healthy server for `servers.ready_timeout_s` the
orchestrator stops with an error that names each server and why it is out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from orchestrator.failures import RolloutFailed
from orchestrator.servers.backends.base import WeightBackend
from orchestrator.servers.calls import failure_kind
from orchestrator.servers.client import Completion, ContextFull, InferenceClient, RequestRejected
from orchestrator.servers.coalesce import Coalescer
from shared.config import OrchestratorConfig
from shared.errors import TriadError

T = TypeVar("T")
log = logging.getLogger("triad.orchestrator")
MAX_BACKOFF_S = 30.0


class Sampling(NamedTuple):
    """What first requests must share to share one HTTP request (`ServerPool.complete`)."""

    n: int
    max_tokens: int
    seed: int | None
    text: bool  # text prompts or token ids: one request takes a list of one kind


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
        self.latencies: list[float] = []  # of successful rollout requests (a prompt each) since the last take
        self.spans: list[list[float]] = []  # [wall-clock start, seconds] of those requests
        self.failed: Counter[str] = Counter()  # failed request attempts since `take_requests`, by kind
        self.none_healthy_since: float | None = None  # monotonic; `check_some_healthy`'s
        self.first_requests = Coalescer(self._send_first_requests, lambda: len(self.healthy()))

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

    def may_share(self, prompt: str | list[int], max_tokens: int) -> bool:
        """Whether a request for `prompt` may share one with others: every server takes a list of
        prompts and has room for `max_tokens` after this one (a text prompt: as far as is known here)."""
        try:
            return all(
                s.backend.lists_prompts and s.client.room(prompt, max_tokens) == max_tokens
                for s in self.servers
            )
        except ContextFull:
            return False

    async def complete(
        self,
        prompt: str | list[int],
        n: int,
        prefer: Server | None = None,
        max_tokens: int | None = None,
        seed: int | None = None,
    ) -> tuple[list[Completion], Server, int]:
        """Completions, the server that made them, and the version it served when asked; `seed`
        (a retry sends the same): the request's, from `episodes.seeds`. A first request (no
        `prefer`) that `may_share` shares one HTTP request with those asked for
        in the same turn of the event loop with the same sampling (`coalesce.py`)."""
        max_tokens = max_tokens or self.oc.sampling.max_tokens
        if prefer is None and self.may_share(prompt, max_tokens):
            key = Sampling(n, max_tokens, seed, text=isinstance(prompt, str))
            return await self.first_requests.ask(key, prompt)
        return (await self.complete_many([prompt], n, prefer, max_tokens, seed))[0]

    async def _send_first_requests(
        self, key: Sampling, prompts: list
    ) -> list[tuple[list[Completion], Server, int] | BaseException]:
        """The coalesced first requests of `key`, as one request; if it is refused (vLLM refuses
        the whole request for one prompt over its context, say), each prompt alone, so that a
        refusal ends its own episode only."""
        try:
            return list(await self.complete_many(prompts, key.n, None, key.max_tokens, key.seed))
        except RequestRejected:
            if len(prompts) == 1:
                raise
        alone = (self.complete_many([p], key.n, None, key.max_tokens, key.seed) for p in prompts)
        answers = await asyncio.gather(*alone, return_exceptions=True)
        return [a if isinstance(a, BaseException) else a[0] for a in answers]

    async def complete_many(
        self,
        prompts: list,
        n: int,
        prefer: Server | None,
        max_tokens: int,
        seed: int | None,
    ) -> list[tuple[list[Completion], Server, int]]:
        """`n` completions of each prompt from one request to one server (`prefer` if healthy),
        with the server and the version it served when asked, each prompt's; retried as a whole."""

        async def ask(server: Server) -> tuple[list[list[Completion]], int, float, float]:
            version, started, wall = server.version, time.monotonic(), time.time()
            model = server.backend.model(version)  # a LoRA run's adapter of that version
            rooms = [server.client.room(prompt, max_tokens) for prompt in prompts]
            temperature = self.oc.sampling.temperature
            if len(set(rooms)) == 1:
                out = await server.client.complete_many(prompts, n, rooms[0], temperature, model, seed)
            else:  # one request shares its max_tokens: on a server with less context (one that
                # joined since `may_share` said yes, or took a retry) each prompt asks alone
                alone = (
                    server.client.complete(prompt, n, room, temperature, model, seed)
                    for prompt, room in zip(prompts, rooms, strict=True)
                )
                out = list(await asyncio.gather(*alone))
            return out, version, time.monotonic() - started, wall

        (out, version, latency, wall), server = await self.request(ask, "a rollout", prefer)
        self.latencies += [latency] * len(prompts)  # each prompt's request took the shared one's time
        self.spans += [[round(wall, 3), round(latency, 4)] for _ in prompts]
        return [(completions, server, version) for completions in out]

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

    def readmit(self, server: Server) -> None:
        """`server`, taken out and now healthy and aligned, back in rotation."""
        log.info("inference server %s is back, serving version %d", server.url, server.version)
        server.healthy, server.failures, server.why_out = True, 0, ""
        self.none_healthy_since = None
