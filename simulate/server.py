"""One inference server as a fluid continuous batch.

Every running sequence gains one token per decode iteration, so a server keeps one clock `v`: the
tokens each running sequence has decoded since the server began. A sequence that starts at `v0`
with `n` tokens to go ends at `v0 + n`; between events `v` advances at 1 / (iteration time), set by
the batch and the KV tokens it holds when the interval begins. Prefill and weight loads hold
decoding (`frozen_until`)."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

from simulate.setup import Inference


@dataclass(eq=False, slots=True)
class Group:
    """`group_size` samples of one prompt: one request with n samples, on one server."""

    target: int  # the batch it was started for
    started: float
    remaining: int
    version: int  # the oldest version among its samples (the version served when sent)
    tokens: int = 0
    server: int = -1


@dataclass(slots=True)
class Seq:
    group: Group
    tokens: int
    version: int
    v_start: float = 0.0
    context: int = 0


@dataclass(eq=False)
class Server:
    idx: int
    inf: Inference
    prompt_tokens: int
    v: float = 0.0
    t: float = 0.0
    frozen_until: float = 0.0
    running: list = field(default_factory=list)  # heap of (v_end, n, Seq)
    waiting: deque = field(default_factory=deque)
    kv_const: float = 0.0  # sum over running sequences of (context at start - v_start)
    stamp: int = 0
    groups: int = 0  # requests it holds (the pool's `inflight`)
    busy_s: float = 0.0
    frozen_s: float = 0.0
    n: int = 0

    def iteration_s(self) -> float:
        b = len(self.running)
        kv = self.kv_const + b * self.v
        return self.inf.iter_base_s + self.inf.iter_per_seq_s * b + self.inf.iter_per_kv_token_s * kv

    def advance(self, now: float) -> None:
        start = self.t if self.t > self.frozen_until else self.frozen_until
        if now > start and self.running:
            self.v += (now - start) / self.iteration_s()
            self.busy_s += now - start
        if now > self.t:
            self.t = now

    def freeze(self, now: float, seconds: float) -> None:
        self.advance(now)
        begin = max(self.frozen_until, now)
        self.frozen_until = begin + seconds
        self.frozen_s += seconds

    def start(self, seq: Seq, context: int) -> None:
        seq.v_start, seq.context = self.v, context
        self.n += 1
        self.kv_const += context - self.v
        heapq.heappush(self.running, (self.v + seq.tokens, self.n, seq))

    def admit(self, now: float, seqs: list[Seq]) -> None:
        """A request of `seqs` arrives: its prompt is prefilled once (the samples share it)."""
        self.freeze(now, self.prompt_tokens / self.inf.prefill_tokens_per_s)
        self.groups += 1
        for seq in seqs:
            if len(self.running) < self.inf.max_seqs:
                self.start(seq, self.prompt_tokens)
            else:
                self.waiting.append(seq)

    def next_end(self, now: float) -> float | None:
        if not self.running:
            return None
        left = self.running[0][0] - self.v
        begin = now if now > self.frozen_until else self.frozen_until
        return begin + (left if left > 0.0 else 0.0) * self.iteration_s()

    def finish(self, now: float) -> list[Seq]:
        """The sequences done by `now`; waiting ones take their places."""
        self.advance(now)
        done = []
        while self.running and self.running[0][0] <= self.v + 1e-9:
            _, _, seq = heapq.heappop(self.running)
            self.kv_const -= seq.context - seq.v_start
            done.append(seq)
        while self.waiting and len(self.running) < self.inf.max_seqs:
            self.start(self.waiting.popleft(), self.prompt_tokens)
        return done

    def abort_all(self, now: float, version: int) -> float:
        """Interruptible generation: every running sequence is aborted and resubmitted under
        `version`, keeping its tokens; the context is prefilled again. Returns that prefill time."""
        self.advance(now)
        seqs = [(v_end, seq) for v_end, _, seq in self.running]
        self.running, self.kv_const = [], 0.0
        context = 0
        for v_end, seq in seqs:
            done = int(self.v - seq.v_start)
            context += self.prompt_tokens + done
            seq.version = version
            left = max(v_end - self.v, 0.0)
            seq.tokens = int(round(left)) or 1
            self.start(seq, self.prompt_tokens + done)
        return context / self.inf.prefill_tokens_per_s
