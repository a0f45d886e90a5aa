"""One inference server as a fluid continuous batch.

Every running sequence gains one token per decode iteration, so a server keeps one clock `v`: the
tokens each running sequence has decoded since the server began. A sequence that starts at `v0`
with `n` tokens to go ends at `v0 + n`; between events `v` advances at 1 / (iteration time), set by
the batch and the KV tokens it holds when the interval begins. Prefill and weight loads hold
decoding (`frozen_until`).

A running sequence is one tuple, its entry in the server's heap (a run of 1024 GPUs starts,
aborts and finishes millions of them, so no object per sequence):
`(v_end, n, group, v_start, kv, tokens, version, decoded)`: it ends at clock `v_end`; `n` orders
equal ends by start; `kv` is its context at start less `v_start` (its KV tokens at clock `v` are
`kv + v`); `tokens` is what it adds to its group's tokens when it ends; `version` the weights it
last ran under; `decoded` the tokens it had when it last (re)started. A waiting sequence is
`(tokens, group, version)`."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from simulate.setup import Inference


def after(now: float, end: float) -> float:
    """`end`, or the next time the clock can tell from `now` where a remainder of a token is
    shorter than the clock's resolution there: an end event at `now` itself would fire again at
    `now` with the server's clock unmoved, forever."""
    return end if end > now else math.nextafter(now, math.inf)


@dataclass(eq=False, slots=True)
class Group:
    """`group_size` samples of one prompt: one request with n samples, on one server."""

    target: int  # the batch it was started for
    started: float
    remaining: int
    version: int  # the oldest version among its samples (the version served when sent)
    tokens: int = 0
    sq_tokens: float = 0.0  # the sum over its samples of (prompt + completion) squared
    server: int = -1
    done: float = 0.0  # its last sample's end


@dataclass(eq=False, slots=True)
class Server:
    """Schedules its own next end in the pipeline's event heap (`events`, entries `(when, order,
    handler, argument)`) and reports each group whose last sample ended to `group_done`. The hot
    paths (`on_end`, `start`, `abort_all`) spell out `iteration_s` inline, with the same
    arithmetic: a run of 1024 GPUs has millions of their events."""

    idx: int
    inf: Inference
    prompt_tokens: int
    events: list = field(repr=False)
    order: Iterator[int] = field(repr=False)
    group_done: Callable[[float, Group, Server], None] = field(repr=False)
    v: float = 0.0
    t: float = 0.0
    frozen_until: float = 0.0
    running: list = field(default_factory=list)  # heap of sequences (the module's docstring)
    waiting: deque = field(default_factory=deque)
    kv_const: float = 0.0  # sum over running sequences of their `kv`
    stamp: int = 0  # the number of its newest event: older ones are stale
    groups: int = 0  # requests it holds (the pool's `inflight`)
    busy_s: float = 0.0
    frozen_s: float = 0.0
    n: int = 0
    base_s: float = field(init=False, default=0.0)
    per_seq_s: float = field(init=False, default=0.0)
    per_kv_s: float = field(init=False, default=0.0)
    on_end_: Callable[[float, int], None] = field(init=False, repr=False)  # one bound method

    def __post_init__(self) -> None:
        self.base_s, self.per_seq_s = self.inf.iter_base_s, self.inf.iter_per_seq_s
        self.per_kv_s = self.inf.iter_per_kv_token_s
        self.on_end_ = self.on_end

    def iteration_s(self) -> float:
        b = len(self.running)
        return self.base_s + self.per_seq_s * b + self.per_kv_s * (self.kv_const + b * self.v)

    def advance(self, now: float) -> None:
        t, frozen = self.t, self.frozen_until
        start = t if t > frozen else frozen
        if now > start and self.running:
            self.v += (now - start) / self.iteration_s()
            self.busy_s += now - start
        if now > t:
            self.t = now

    def freeze(self, now: float, seconds: float) -> None:
        self.advance(now)
        begin = max(self.frozen_until, now)
        self.frozen_until = begin + seconds
        self.frozen_s += seconds

    def start(self, lengths: list[int], group: Group, version: int) -> None:
        v = self.v
        kv, n, running, push = self.kv_const, self.n, self.running, heapq.heappush
        seq_kv = self.prompt_tokens - v
        for tokens in lengths:
            n += 1
            kv += seq_kv
            push(running, (v + tokens, n, group, v, seq_kv, tokens, version, 0))
        self.kv_const, self.n = kv, n

    def admit(self, now: float, group: Group, lengths: list[int], version: int) -> None:
        """A request of `lengths` samples arrives: its prompt is prefilled once (they share it)."""
        self.freeze(now, self.prompt_tokens / self.inf.prefill_tokens_per_s)
        self.groups += 1
        room = self.inf.max_seqs - len(self.running)
        if room >= len(lengths):
            self.start(lengths, group, version)
            return
        room = max(room, 0)
        self.start(lengths[:room], group, version)
        self.waiting.extend((tokens, group, version) for tokens in lengths[room:])

    def next_end(self, now: float) -> float | None:
        running = self.running
        if not running:
            return None
        left = running[0][0] - self.v
        frozen = self.frozen_until
        begin = now if now > frozen else frozen
        if left <= 0.0:
            return begin
        return after(now, begin + left * self.iteration_s())

    def schedule(self, now: float) -> None:
        """Its next end replaces the event it had (which goes stale)."""
        self.stamp += 1
        end = self.next_end(now)
        if end is not None:
            heapq.heappush(self.events, (end, next(self.order), self.on_end_, self.stamp))

    def on_end(self, now: float, stamp: int) -> None:
        """The sequences done by `now` end (waiting ones take their places); its next end is
        scheduled."""
        if stamp != self.stamp:
            return
        t, frozen = self.t, self.frozen_until
        start = t if t > frozen else frozen
        running = self.running
        base, per_seq, per_kv = self.base_s, self.per_seq_s, self.per_kv_s
        if now > start and running:
            b = len(running)
            self.v += (now - start) / (base + per_seq * b + per_kv * (self.kv_const + b * self.v))
            self.busy_s += now - start
        if now > t:
            self.t = now
        v = self.v
        limit = v + 1e-9
        pop = heapq.heappop
        kv, prompt = self.kv_const, self.prompt_tokens
        while running and running[0][0] <= limit:
            _, _, group, _, seq_kv, tokens, version, _ = pop(running)
            kv -= seq_kv
            group.tokens += tokens
            group.sq_tokens += (prompt + tokens) ** 2
            if version < group.version:
                group.version = version
            group.remaining -= 1
            if not group.remaining:
                self.groups -= 1
                self.group_done(now, group, self)
        self.kv_const = kv
        if self.waiting:
            self.refill()
        self.stamp = stamp = stamp + 1
        if running:
            left = running[0][0] - v
            begin = now if now > frozen else frozen
            b = len(running)
            end = begin + (left if left > 0.0 else 0.0) * (
                base + per_seq * b + per_kv * (self.kv_const + b * v)
            )
            if end <= now:  # see `after`
                end = math.nextafter(now, math.inf)
            heapq.heappush(self.events, (end, next(self.order), self.on_end_, stamp))

    def refill(self) -> None:
        waiting, running = self.waiting, self.running
        max_seqs = self.inf.max_seqs
        while waiting and len(running) < max_seqs:
            tokens, group, version = waiting.popleft()
            self.start([tokens], group, version)

    def load(self, now: float, load_s: float, abort_under: int | None) -> float:
        """A weight load holds the server `load_s`; with `abort_under`, every running sequence is
        first aborted and resubmitted under that version (`abort_all`). Schedules its next end and
        returns when the hold ends."""
        self.advance(now)
        hold = load_s if abort_under is None else load_s + self.abort_all(abort_under)
        begin = max(self.frozen_until, now)
        self.frozen_until = begin + hold
        self.frozen_s += hold
        self.schedule(now)
        return self.frozen_until

    def abort_all(self, version: int) -> float:
        """Interruptible generation: every running sequence is aborted and resubmitted under
        `version` at the server's clock, keeping its tokens; the context is prefilled again.
        Returns that prefill time. The new ends keep the old ones' order (the tokens left,
        rounded) and `n` is given in the heap's own order, so the list, rebuilt in its own order,
        is still a heap."""
        v, prompt, kv, n = self.v, self.prompt_tokens, 0.0, self.n
        decoded = 0
        running: list = []
        append = running.append
        for v_end, _, group, v_start, _, _, _, before in self.running:
            d = before + int(v - v_start)
            decoded += d
            left = v_end - v
            tokens = (round(left) or 1) if left > 0.0 else 1
            seq_kv = prompt + d - v
            kv += seq_kv
            n += 1
            append((v + tokens, n, group, v, seq_kv, tokens + d, version, d))
        context = prompt * len(running) + decoded
        self.running, self.kv_const, self.n = running, kv, n
        return context / self.inf.prefill_tokens_per_s
