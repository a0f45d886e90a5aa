"""`triad simulate --from RUN_DIR`: a run's own settings and measured phase times as a Setup.

Read from the run directory alone (its run record and metrics rows):
- the trainer: `read_s + train_s` against the batch's tokens (a line: overhead and per token),
  `publish_s` (its mean);
- the weight load: inference rows' `load_s`; the orchestrator's `assemble_s + write_batch_s`;
- lengths: a lognormal capped at `max_tokens` whose mean and truncated fraction match the rows'
  `tokens / samples` and `truncated_frac`;
- the spread the means leave out, drawn in the simulation: each trainer step's time over the
  fitted line, and each request's time over its batch's median (at least 1: a batch waits for its
  slowest request);
- the decode iteration: fitted so that the simulated mean request latency equals the rows' mean
  request time (`request_spans`; `request_latency_s_p50` in runs without them), at the run's own
  concurrency, so one parameter."""

from __future__ import annotations

import math
from statistics import mean, median
from typing import Any

from shared.config import ORCHESTRATOR_TABLES
from shared.errors import TriadError
from shared.rundir import INFERENCE, ORCHESTRATOR, TRAINER, RunDir
from simulate.result import WARMUP_FRACTION
from simulate.setup import Inference, Lengths, Setup, Trainer

CPU_PEAK_FLOPS = 1e11  # nominal; the fitted MFU carries the real rate (only their product matters)
TINY_PARAMS = 5e5


def steady(rows: list[dict]) -> list[dict]:
    return rows[max(1, int(len(rows) * WARMUP_FRACTION)) :]


def line_fit(xs: list[float], ys: list[float], min_spread: float = 0.2) -> tuple[float, float]:
    """Least squares y = a + b x with a, b >= 0; a flat line through the mean when x spreads less than
    `min_spread` of its mean (the slope would be noise: a batch's tokens hardly vary in most runs)."""
    mx, my = mean(xs), mean(ys)
    if max(xs) - min(xs) <= min_spread * abs(mx):
        return my, 0.0
    var = sum((x - mx) ** 2 for x in xs)
    b = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var, 0.0)
    if my - b * mx < 0:
        return 0.0, my / mx
    return my - b * mx, b


def phi(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def capped_mean(median_tokens: float, sigma: float, cap: int) -> float:
    """E[min(X, cap)] for X lognormal (an integer draw: about half a token less)."""
    mu, lc = math.log(median_tokens), math.log(cap)
    body = math.exp(mu + sigma**2 / 2) * phi((lc - mu - sigma**2) / sigma)
    return body + cap * (1 - phi((lc - mu) / sigma)) - 0.5


def fit_lengths(mean_tokens: float, truncated: float, max_tokens: int) -> Lengths:
    """The capped lognormal whose mean and P(length = max_tokens) match the run's."""
    grid = [(0.05 * i, max_tokens * 0.01 * j) for i in range(1, 61) for j in range(1, 301)]

    def err(sigma: float, median_tokens: float) -> float:
        tail = 1 - phi((math.log(max_tokens) - math.log(median_tokens)) / sigma)
        return ((capped_mean(median_tokens, sigma, max_tokens) - mean_tokens) / mean_tokens) ** 2 + (
            tail - truncated
        ) ** 2

    sigma, median_tokens = min(grid, key=lambda p: err(*p))
    return Lengths(median_tokens, sigma, max_tokens)


def measured_samples_per_s(rundir: RunDir) -> float:
    """Samples over time between batch writes, past the warm-up (as `Result.samples_per_s`)."""
    rows = rundir.metrics.rows(ORCHESTRATOR)
    if len(rows) < 5:
        raise TriadError(f"{rundir.name}: {len(rows)} orchestrator rows; a calibration needs at least 5")
    k = max(1, int(len(rows) * WARMUP_FRACTION))
    counted = rows[k:]
    return sum(r["samples"] for r in counted) / (counted[-1]["time"] - rows[k - 1]["time"])


def request_spread(orch: list[dict]) -> tuple[float, ...]:
    """Each request's time over its batch's median (`request_spans`), at least 1. The model's
    requests started together take the same time where lengths are equal, while a batch waits for
    its slowest: the upper half of the measured spread is what it lacks."""
    out = []
    for r in orch:
        spans = [d for _, d in r.get("request_spans", []) if d > 0]
        out += [max(d / median(spans), 1.0) for d in spans] if spans else []
    return tuple(out)


def trainer_spread(
    trainer: list[dict], overhead: float, per_token: float, publish: float
) -> tuple[float, ...]:
    """Each step's read, train and publish time over what the fitted line and mean publish give."""
    fitted = [(r, overhead + per_token * r["tokens"] + publish) for r in trainer]
    return tuple((r.get("read_s", 0) + r["train_s"] + r["publish_s"]) / f for r, f in fitted if f > 0)


def recorded(oc: dict[str, Any], key: str) -> Any:
    """`key` (`sampling.max_tokens`) of a run record's `orchestrator` section; a run recorded before
    `[orchestrator]` had tables holds it under its flat name of then (`max_tokens`)."""
    table, _, name = key.partition(".")
    if table in oc:
        return oc[table][name]
    flat = {now: before for before, now in ORCHESTRATOR_TABLES.items()}
    return oc[flat[key]]


def sample_tokens(orch: list[dict]) -> tuple[float, float]:
    """A sample's mean prompt and completion tokens: the completion is what `sampling.max_tokens`
    caps. A run recorded before the rows had `completion_tokens` gives its whole samples as the
    completion (and no prompt), which fits only where prompts are short against the cap."""
    samples = sum(r["samples"] for r in orch)
    tokens = sum(r["tokens"] for r in orch) / samples
    if not all("completion_tokens" in r for r in orch):
        return 0.0, tokens
    completion = sum(r["completion_tokens"] for r in orch) / samples
    return tokens - completion, completion


def setup_from_run(rundir: RunDir) -> tuple[Setup, float]:
    """The run's Setup with every phase fitted, and the latency it must reproduce."""
    cfg = rundir.read_run().config
    oc = cfg["orchestrator"]
    orch = steady(rundir.metrics.rows(ORCHESTRATOR))
    trainer = steady([r for r in rundir.metrics.rows(TRAINER) if "train_s" in r])
    loads = [r["load_s"] for r in rundir.metrics.rows(INFERENCE) if "load_s" in r]
    if not orch or not trainer:
        raise TriadError(f"{rundir.name} has too few orchestrator or trainer rows to calibrate on")
    overhead, per_token = line_fit(
        [r["tokens"] for r in trainer], [r.get("read_s", 0) + r["train_s"] for r in trainer]
    )
    prompt, completion = sample_tokens(orch)
    lengths = fit_lengths(
        completion, mean(r["truncated_frac"] for r in orch), recorded(oc, "sampling.max_tokens")
    )
    load_s = median(loads) if loads else 0.0
    publish = mean(r["publish_s"] for r in trainer)
    mfu = 6 * TINY_PARAMS / (CPU_PEAK_FLOPS * per_token) if per_token > 0 else math.inf  # no per-token term
    setup = Setup(
        servers=max(len(recorded(oc, "servers.urls")), 1),
        train_gpus=1,
        inference=Inference(
            iter_base_s=0.01,
            iter_per_seq_s=0.0,
            iter_per_kv_token_s=0.0,
            max_seqs=1 << 20,
            prefill_tokens_per_s=1e12,
            load_s=load_s,
        ),
        trainer=Trainer(
            params=TINY_PARAMS,
            peak_flops=CPU_PEAK_FLOPS,
            mfu=mfu,
            overhead_s=overhead,
            handoff_bytes_per_s=1e18,
            publish_overhead_s=publish,
        ),
        lengths=lengths,
        prompt_tokens=round(prompt),
        batch_size=oc["batch_size"],
        group_size=oc["group_size"],
        max_inflight=oc["max_inflight"],
        max_async_level=cfg["max_async_level"],
        max_steps=len(orch) + 10,
        batch_overhead_s=mean(r["assemble_s"] + r["write_batch_s"] for r in orch),
        trainer_factors=trainer_spread(trainer, overhead, per_token, publish),
        request_factors=request_spread(orch),
    )
    spans = [d for r in orch for _, d in r.get("request_spans", [])]
    return setup, mean(spans) if spans else mean(r["request_latency_s_p50"] for r in orch)


def measured_outside_per_group(rundir: RunDir) -> tuple[float, float]:
    """Seconds a group spent pending (counted in `max_inflight`) but not on a server, on average,
    and the share of the slot-seconds the η guard left empty. Over the steady rows: every slot is
    either a request on a server (`request_spans`), a group outside one (sampling the prompt,
    scoring, the queue), or empty while the guard held the producer (`guard_idle_slot_s`). The last
    rows are left out: there the producer has no batch left to start. A run without the guard's
    metric (before it was recorded) counts its holds as time outside a server."""
    oc = rundir.read_run().config["orchestrator"]
    rows = rundir.metrics.rows(ORCHESTRATOR)
    k = max(1, int(len(rows) * WARMUP_FRACTION))
    counted = rows[k : len(rows) - (oc["max_inflight"] // oc["batch_size"] + 1)]
    if len(counted) < 2:
        raise TriadError(f"{rundir.name}: {len(rows)} orchestrator rows are too few to calibrate on")
    slot_s = oc["max_inflight"] * (counted[-1]["time"] - rows[k - 1]["time"])
    on_servers = sum(d for r in counted for _, d in r.get("request_spans", []))
    idle = sum(r.get("guard_idle_slot_s", 0.0) for r in counted)
    groups = sum(
        (r["samples"] + r["samples_dropped"]) / oc["group_size"]
        + r.get("groups_filtered", 0)
        + r.get("groups_failed", 0)
        for r in counted
    )
    return max(slot_s - idle - on_servers, 0.0) / groups, idle / slot_s


def scaled(setup: Setup, factor: float) -> Setup:
    inf = setup.inference
    return setup.with_(inference=type(inf)(**{**inf.__dict__, "iter_base_s": inf.iter_base_s * factor}))


def calibrate(rundir: RunDir, rounds: int = 6) -> Setup:
    """`setup_from_run`, then two fits by simulating the run's own settings: the decode iteration
    (scaled until the mean of the rows' median request latency is the measured one) and the
    per-group overhead (until a group's simulated time pending off the servers, `group_overhead_s`
    plus its wait in the queue, is the measured one, the η guard's empty slots subtracted)."""
    from simulate.pipeline import simulate

    setup, latency = setup_from_run(rundir)
    outside, guard_share = measured_outside_per_group(rundir)
    for _ in range(rounds):
        r = simulate(setup)
        if r.latencies:
            setup = scaled(setup, latency / mean(r.latencies))
        overhead = setup.group_overhead_s + outside - r.outside_per_group()
        setup = setup.with_(group_overhead_s=max(overhead, 0.0))
    note = f"{outside:.3f} s a group off the servers; the η guard held {guard_share:.0%} of the slot-seconds"
    return setup.with_(notes={**setup.notes, "calibration": note})
