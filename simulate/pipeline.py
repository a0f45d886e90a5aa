"""triad's pipeline as events: the producer and assembler (orchestrator/loop.py), the η guard
(orchestrator/batches/staleness.py), the trainer (wait, train, publish) and the weight follower.

What waits for what, as in triad: a group starts only if fewer than `max_inflight` are pending
and the served version is fresh enough for the batch it will most likely land in; the assembler
takes groups in the order they finish and drops those too stale for its batch, and writes a full
batch (`batch_overhead_s`) before it assembles the next; the trainer takes batch n once written,
trains, and publishes version n; the follower has every server load the newest published version
(all at once, each held `load_s`; with `mode = "abort"` running sequences are also aborted and
resubmitted), and only then is it the served version."""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from collections.abc import Callable

from simulate.result import Result
from simulate.server import Group, Server
from simulate.setup import Setup


def oldest_allowed_version(step: int, max_async_level: int) -> int:
    """orchestrator/batches/staleness.py's bound (a unit test holds the two equal)."""
    return max(step - 1 - max_async_level, 0)


class Pipeline:
    def __init__(self, setup: Setup) -> None:
        self.s = setup
        self.rng = random.Random(setup.seed)
        self.jitter = random.Random(setup.seed + 1)  # the spread of trainer steps and requests
        self.events: list = []  # (when, order, handler, argument)
        self.order = itertools.count()
        self.servers = [
            Server(i, setup.inference, setup.prompt_tokens, self.events, self.order, self.group_done)
            for i in range(setup.servers)
        ]
        self.least = [(0, i) for i in range(setup.servers)]  # (groups held, server), lazily updated
        self.step, self.accepted, self.pending, self.writing = 1, 0, 0, False
        self.batch: list[Group] = []
        self.queue: deque[Group] = deque()
        self.ready: deque[tuple[int, int, float]] = deque()  # written batches: (step, tokens, sq_tokens)
        self.trainer_busy, self.published, self.served, self.loading = False, 0, 0, 0
        self.dropped = 0
        self.guard_since: tuple[float, int] = (0.0, 0)  # (since, free slots) while the guard holds
        self.r = Result(setup)

    # -- events ---------------------------------------------------------------
    def at(self, when: float, fn: Callable[[float, object], None], arg: object = None) -> None:
        heapq.heappush(self.events, (when, next(self.order), fn, arg))

    def run(self) -> Result:
        self.try_start(0.0)
        events, r, steps, pop = self.events, self.r, self.s.max_steps, heapq.heappop
        while events and r.trained < steps:
            now, _, fn, arg = pop(events)
            fn(now, arg)
        self.r.finish(self.servers, self.dropped)
        return self.r

    # -- the producer ---------------------------------------------------------
    def target(self) -> int:
        return self.step + (self.accepted + self.pending) // self.s.batch_size

    def may_start(self) -> bool:
        target = self.target()
        return (
            self.pending < self.s.max_inflight
            and target <= self.s.max_steps
            and self.served >= oldest_allowed_version(target, self.s.max_async_level)
        )

    def pick(self) -> Server:
        while True:
            held, i = self.least[0]
            if held == self.servers[i].groups:
                return self.servers[i]
            heapq.heappop(self.least)  # the server has a newer entry

    def try_start(self, now: float) -> None:
        while self.may_start():
            self.pending += 1
            group = Group(self.target(), now, self.s.group_size, self.served)
            server = self.pick()
            group.server = server.idx
            server.admit(now, group, self.s.lengths.draws(self.rng, self.s.group_size), self.served)
            heapq.heapreplace(self.least, (server.groups, server.idx))
            server.schedule(now)
        self.observe_guard(now)

    def observe_guard(self, now: float) -> None:
        """The η guard's empty slot-seconds, as the orchestrator's `guard_idle_slot_s` counts them:
        `pending` and the served version change only where `try_start` follows."""
        since, free = self.guard_since
        if free:
            self.r.guard_idle(self.step, (now - since) * free)
        target = self.target()
        held = (
            self.pending < self.s.max_inflight
            and target <= self.s.max_steps
            and self.served < oldest_allowed_version(target, self.s.max_async_level)
        )
        self.guard_since = (now, self.s.max_inflight - self.pending if held else 0)

    def group_done(self, now: float, g: Group, server: Server) -> None:
        """The last sample of `g` ended on `server` (which no longer counts it); with a request
        spread, its answer comes a drawn factor of its time later."""
        heapq.heappush(self.least, (server.groups, server.idx))
        latency = now - g.started
        if self.s.request_factors:
            latency *= self.jitter.choice(self.s.request_factors)
        g.done = g.started + latency
        self.r.latencies.append(latency)
        self.at(g.done + self.s.group_overhead_s, self.on_scored, g)

    def on_scored(self, now: float, group: Group) -> None:
        self.queue.append(group)
        self.assemble(now)

    # -- the assembler ----------------------------------------------------------
    def assemble(self, now: float) -> None:
        while self.queue and not self.writing:
            g = self.queue.popleft()
            self.pending -= 1
            self.r.outside.append((self.step, now - g.done))
            if g.version < oldest_allowed_version(self.step, self.s.max_async_level):
                self.dropped += self.s.group_size
            else:
                self.batch.append(g)
                self.accepted += 1
            if len(self.batch) == self.s.batch_size:
                self.writing = True
                self.r.generated(self.step, now)
                self.at(now + self.s.batch_overhead_s, self.on_written)
        self.try_start(now)

    def on_written(self, now: float, _: None = None) -> None:
        """The batch's tokens, as the orchestrator's `tokens` counts them and the trainer trains on
        them: each sample's prompt and completion."""
        samples = self.s.batch_size * self.s.group_size
        tokens = sum(g.tokens for g in self.batch) + self.s.prompt_tokens * samples
        busy = sum(server.busy_s for server in self.servers)
        self.r.written(self.step, now, tokens, samples, busy)
        self.ready.append((self.step, tokens, sum(g.sq_tokens for g in self.batch)))
        self.step, self.accepted, self.batch, self.writing = self.step + 1, 0, [], False
        self.train(now)
        self.assemble(now)

    # -- the trainer and the weight follower -------------------------------------
    def train(self, now: float) -> None:
        if self.trainer_busy or not self.ready:
            return
        step, tokens, sq_tokens = self.ready.popleft()
        self.trainer_busy = True
        spread = self.jitter.choice(self.s.trainer_factors) if self.s.trainer_factors else 1.0
        trained = now + self.s.trainer.train_s(tokens, self.s.train_gpus, sq_tokens) * spread
        published = trained + self.s.trainer.publish_s() * spread
        self.r.trainer_step(step, now, trained, published)
        self.at(published, self.on_published, step)

    def on_published(self, now: float, step: int) -> None:
        self.trainer_busy, self.published = False, step
        self.follow(now)
        self.train(now)

    def follow(self, now: float) -> None:
        if self.loading or self.published <= self.served:
            return
        self.loading = version = self.published
        done, load_s = now, self.s.inference.load_s
        abort_under = version if self.s.mode == "abort" else None
        for server in self.servers:
            done = max(done, server.load(now, load_s, abort_under))
        self.r.load(version, now, done)
        self.at(done, self.on_loaded, version)

    def on_loaded(self, now: float, version: int) -> None:
        self.served, self.loading = version, 0
        self.try_start(now)
        self.follow(now)


def simulate(setup: Setup) -> Result:
    return Pipeline(setup).run()
