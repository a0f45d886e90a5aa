"""What a simulation is given: the cluster, the model, the task and triad's knobs.

Every number is a plain field with its unit in the name; `describe()` lists them for the
table of inputs that docs/simulate.md and bench/results show."""

from __future__ import annotations

import math
import random
import re
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from statistics import NormalDist

from shared.errors import TriadError

QUANTILES = 4096
MODES = ("keep", "abort")  # in-flight update: pause and keep the KV cache / abort and resubmit


@dataclass(frozen=True)
class Lengths:
    """Completion lengths: lognormal (median `median_tokens`, log-sd `sigma`) capped at `max_tokens`,
    or drawn from `empirical` when given (e.g. read from a run)."""

    median_tokens: float
    sigma: float
    max_tokens: int
    empirical: tuple[int, ...] = ()

    @cached_property
    def table(self) -> tuple[int, ...]:
        """The distribution at QUANTILES evenly spaced quantiles (or the empirical lengths): a draw
        is one pick from it, `n` draws one call."""
        if self.empirical:
            return self.empirical
        z = NormalDist()
        return tuple(
            max(
                1,
                min(
                    self.max_tokens,
                    int(self.median_tokens * math.exp(self.sigma * z.inv_cdf((i + 0.5) / QUANTILES))),
                ),
            )
            for i in range(QUANTILES)
        )

    def draws(self, rng: random.Random, n: int) -> list[int]:
        return rng.choices(self.table, k=n)

    def draw(self, rng: random.Random) -> int:
        return rng.choice(self.table)

    def mean(self, n: int = 20000) -> float:
        rng = random.Random(1)
        return sum(self.draw(rng) for _ in range(n)) / n


@dataclass(frozen=True)
class Inference:
    """One server (`tp` GPUs): a decode iteration takes `iter_base_s + iter_per_seq_s * b +
    iter_per_kv_token_s * kv` for `b` running sequences holding `kv` tokens; at most
    `max_seqs` run at once (the rest wait); a prompt is prefilled at `prefill_tokens_per_s` with
    decoding held meanwhile; a weight load holds a server `load_s`."""

    iter_base_s: float
    iter_per_seq_s: float
    iter_per_kv_token_s: float
    max_seqs: int
    prefill_tokens_per_s: float
    load_s: float
    tp: int = 1


@dataclass(frozen=True)
class Trainer:
    """A step takes `overhead_s + factor * (active * tokens + attention * sq_tokens) / (gpus *
    peak_flops * mfu)` with `factor = 6 + 2 * (logprob_passes + recompute)`: `tokens` the batch's
    prompt and completion tokens, `sq_tokens` the sum of each sample's (prompt + completion)
    squared (a causal sequence's attention, `hardware.attention_width`), and `active` the parameters
    a token passes through (`active_params`, a mixture of experts' active ones; 0: all of
    `params`): forward and backward, plus a forward pass per recomputation of log-probabilities
    before the update (verl's `old_log_prob`, NeMo-RL's policy logprobs, AReaL's proximal policy)
    and one where activations are recomputed in the backward pass (`recompute`), and
    `step_s_per_param` for each parameter held (all of `params`); publishing moves all
    `2 * params` bytes (bf16) at `handoff_bytes_per_s` plus `publish_overhead_s`."""

    params: float
    peak_flops: float
    mfu: float
    overhead_s: float
    handoff_bytes_per_s: float
    publish_overhead_s: float
    logprob_passes: int = 0
    active_params: float = 0.0
    attention: float = 0.0  # layers x query heads x head dim (0: no attention cost)
    recompute: bool = False
    step_s_per_param: float = 0.0

    def train_s(self, tokens: int, gpus: int, sq_tokens: float = 0.0) -> float:
        factor = 6 + 2 * (self.logprob_passes + self.recompute)  # FLOPs a parameter, a token
        flops = factor * (self.active_params or self.params) * tokens + factor * self.attention * sq_tokens
        held = self.step_s_per_param * self.params
        return self.overhead_s + held + flops / (max(gpus, 1) * self.peak_flops * self.mfu)

    def publish_s(self) -> float:
        return self.publish_overhead_s + 2 * self.params / self.handoff_bytes_per_s


@dataclass(frozen=True)
class Setup:
    """One pipeline: `servers` inference servers, `train_gpus` trainer GPUs, and triad's knobs."""

    servers: int
    train_gpus: int
    inference: Inference
    trainer: Trainer
    lengths: Lengths
    prompt_tokens: int
    batch_size: int  # groups per batch
    group_size: int
    max_inflight: int  # groups generating or queued
    max_async_level: int
    max_steps: int
    mode: str = "keep"
    batch_overhead_s: float = 0.0  # the orchestrator's assemble + write of one batch
    group_overhead_s: float = 0.0  # from a request's end to its group in the queue (scoring, the loop)
    trainer_factors: tuple[float, ...] = ()  # a step's train and publish times one of these, drawn
    # a request's time on its server times one of these, drawn (each >= 1): the spread among requests
    # started together beyond what their lengths give (scheduling, stragglers); the extra is a wait
    # after the server's part that holds none of its capacity
    request_factors: tuple[float, ...] = ()
    colocated: bool = False  # the servers and the trainer take turns on one pool of `train_gpus`
    seed: int = 0
    notes: dict[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise TriadError(f"simulate: mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.request_factors and min(self.request_factors) < 1:
            raise TriadError("simulate: request_factors are each at least 1 (a wait added to a request)")
        if self.servers < 1 or self.batch_size < 1 or self.group_size < 1 or self.max_inflight < 1:
            raise TriadError("simulate: servers, batch_size, group_size and max_inflight must be at least 1")

    @property
    def gpus(self) -> int:
        """The GPUs the setup occupies: one pool when colocated, else the servers' and the trainer's."""
        return self.train_gpus if self.colocated else self.servers * self.inference.tp + self.train_gpus

    def with_(self, **changes: object) -> Setup:
        return replace(self, **changes)

    def describe(self) -> dict[str, object]:
        d = asdict(self)
        d["lengths"] = {k: v for k, v in d["lengths"].items() if k != "empirical"}
        for name in ("trainer_factors", "request_factors"):
            d[name] = spread(d[name])
        d.pop("notes")
        return d


def spread(factors: tuple[float, ...]) -> dict[str, float] | None:
    """A table's summary of a tuple of factors: how many, and their quantiles."""
    if not factors:
        return None
    ordered = sorted(factors)
    at = {q: ordered[min(int(q * len(ordered)), len(ordered) - 1)] for q in (0.1, 0.5, 0.9)}
    return {"n": len(ordered), "p10": at[0.1], "p50": at[0.5], "p90": at[0.9], "max": ordered[-1]}


def parse_count(text: str) -> float:
    """'7B' -> 7e9, '16k' -> 16000, '1.5M' -> 1.5e6, '512' -> 512."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kKmMbBtT]?)\s*", text)
    if not m:
        raise TriadError(f"simulate: {text!r} is not a count (e.g. 7B, 16k, 512)")
    scale = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}[m.group(2).lower()]
    return float(m.group(1)) * scale
