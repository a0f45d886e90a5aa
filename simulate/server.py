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
    done: float = 0.0  # its last sample's end


@dataclass(slots=True)
class Seq:
    group: Group
    tokens: int
    version: int
    v_start: float = 0.0
    context: int = 0


@dataclass(eq=False, slots=True)
class Server:
    """The hot paths (`finish`, `next_end`) spell out `iteration_s` inline, with the same arithmetic:
    a run of 1024 GPUs has millions of their events."""

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
    base_s: float = field(init=False, default=0.0)
    per_seq_s: float = field(init=False, default=0.0)
    per_kv_s: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.base_s, self.per_seq_s = self.inf.iter_base_s, self.inf.iter_per_seq_s
        self.per_kv_s = self.inf.iter_per_kv_token_s

    def iteration_s(self) -> float:
        b = len(self.running)
        return self.base_s + self.per_seq_s * b + self.per_kv_s * (self.kv_const + b * self.v)

    def advance(self, now: float) -> None:
        t, frozen = self.t, self.frozen_until
        start = t if t > frozen else frozen
        if now > start and self.running:
            b = len(self.running)
            self.v += (now - start) / (
                self.base_s + self.per_seq_s * b + self.per_kv_s * (self.kv_const + b * self.v)
            )
            self.busy_s += now - start
        if now > t:
            self.t = now

    def freeze(self, now: float, seconds: float) -> None:
        self.advance(now)
        begin = max(self.frozen_until, now)
        self.frozen_until = begin + seconds
        self.frozen_s += seconds

    def start(self, seq: Seq, context: int) -> None:
        v = self.v
        seq.v_start, seq.context = v, context
        self.n += 1
        self.kv_const += context - v
        heapq.heappush(self.running, (v + seq.tokens, self.n, seq))

    def admit(self, now: float, seqs: list[Seq]) -> None:
        """A request of `seqs` arrives: its prompt is prefilled once (the samples share it)."""
        self.freeze(now, self.prompt_tokens / self.inf.prefill_tokens_per_s)
        self.groups += 1
        room = self.inf.max_seqs - len(self.running)
        for seq in seqs[:room] if room > 0 else ():
            self.start(seq, self.prompt_tokens)
        if room < len(seqs):
            self.waiting.extend(seqs[max(room, 0) :])

    def next_end(self, now: float) -> float | None:
        running = self.running
        if not running:
            return None
        v = self.v
        left = running[0][0] - v
        frozen = self.frozen_until
        begin = now if now > frozen else frozen
        b = len(running)
        it = self.base_s + self.per_seq_s * b + self.per_kv_s * (self.kv_const + b * v)
        return begin + (left if left > 0.0 else 0.0) * it

    def finish(self, now: float) -> tuple[list[Seq], float | None]:
        """The sequences done by `now` (waiting ones take their places), and when the next ends."""
        t, frozen = self.t, self.frozen_until
        start = t if t > frozen else frozen
        running, done = self.running, []
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
        kv = self.kv_const
        while running and running[0][0] <= limit:
            seq = pop(running)[2]
            kv -= seq.context - seq.v_start
            done.append(seq)
        self.kv_const = kv
        if self.waiting:
            self.refill()
        if not running:
            return done, None
        left = running[0][0] - v
        begin = now if now > frozen else frozen
        b = len(running)
        return done, begin + (left if left > 0.0 else 0.0) * (
            base + per_seq * b + per_kv * (self.kv_const + b * v)
        )

    def refill(self) -> None:
        waiting, running = self.waiting, self.running
        max_seqs, prompt = self.inf.max_seqs, self.prompt_tokens
        while waiting and len(running) < max_seqs:
            self.start(waiting.popleft(), prompt)

    def abort_all(self, now: float, version: int) -> float:
        """Interruptible generation: every running sequence is aborted and resubmitted under
        `version`, keeping its tokens; the context is prefilled again. Returns that prefill time.
        The new keys keep the old ones' order (the tokens left, rounded), so the list, rebuilt in
        its own order, is still a heap."""
        self.advance(now)
        v, prompt, kv, n = self.v, self.prompt_tokens, 0.0, self.n
        context = 0
        running = []
        for v_end, _, seq in self.running:
            ctx = prompt + int(v - seq.v_start)
            context += ctx
            seq.version = version
            left = v_end - v
            seq.tokens = int(round(left if left > 0.0 else 0.0)) or 1
            seq.v_start, seq.context = v, ctx
            n += 1
            kv += ctx - v
            running.append((v + seq.tokens, n, seq))
        heapq.heapify(running)
        self.running, self.kv_const, self.n = running, kv, n
        return context / self.inf.prefill_tokens_per_s
