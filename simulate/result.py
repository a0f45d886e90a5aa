"""What a simulation measured: per-step times, throughput as triad's metrics measure it, where
the trainer's time went (the critical path), and the inference servers' utilisation."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simulate.server import Server
    from simulate.setup import Setup

WARMUP_FRACTION = 0.2  # steps left out of the steady-state rates (the pipeline filling)


@dataclass
class Result:
    setup: Setup
    trained: int = 0
    generated_at: dict[int, float] = field(default_factory=dict)  # the batch's last group came
    written_at: dict[int, float] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    samples: dict[int, int] = field(default_factory=dict)
    # (step, start, trained, published)
    train_spans: list[tuple[int, float, float, float]] = field(default_factory=list)
    load_spans: list[tuple[int, float, float]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    dropped: int = 0
    server_busy_s: float = 0.0
    server_frozen_s: float = 0.0
    end: float = 0.0
    busy_at: dict[int, float] = field(
        default_factory=dict
    )  # servers' decoding seconds when batch n was written

    def generated(self, step: int, now: float) -> None:
        self.generated_at[step] = now

    def written(self, step: int, now: float, tokens: int, samples: int, busy_s: float) -> None:
        self.written_at[step], self.tokens[step], self.samples[step] = now, tokens, samples
        self.busy_at[step] = busy_s

    def step_utilisation(self) -> list[tuple[int, float, float]]:
        """(step, inference decoding share, trainer busy share) over each batch's interval."""
        out, steps = [], sorted(self.written_at)
        for a, b in zip(steps, steps[1:], strict=False):
            wall = max(self.written_at[b] - self.written_at[a], 1e-12)
            busy = (self.busy_at[b] - self.busy_at[a]) / (wall * self.setup.servers)
            lo, hi = self.written_at[a], self.written_at[b]
            train = sum(max(0.0, min(p, hi) - max(s, lo)) for _, s, _, p in self.train_spans)
            out.append((b, min(busy, 1.0), min(train / wall, 1.0)))
        return out

    def trainer_step(self, step: int, start: float, trained: float, published: float) -> None:
        self.train_spans.append((step, start, trained, published))
        self.trained = step

    def load(self, version: int, start: float, end: float) -> None:
        self.load_spans.append((version, start, end))

    def group_latency(self, seconds: float) -> None:
        self.latencies.append(seconds)

    def finish(self, servers: list[Server], dropped: int) -> None:
        self.dropped = dropped
        self.end = max(p for _, _, _, p in self.train_spans) if self.train_spans else 0.0
        self.server_busy_s = sum(s.busy_s for s in servers)
        self.server_frozen_s = sum(s.frozen_s for s in servers)

    # -- what it shows ---------------------------------------------------------------
    def first_counted(self) -> int:
        """The batch the counted window starts after: past the first fifth, and past the η + 1
        batches that all start at once when the run begins (the pipeline filling)."""
        return max(1, int(len(self.written_at) * WARMUP_FRACTION), self.setup.max_async_level + 1)

    def samples_per_s(self) -> float:
        """Samples of batches k+1..N over the time between batch k's and batch N's writes
        (what triad's orchestrator rows give: samples over the time since the previous batch)."""
        k, n = self.first_counted(), max(self.written_at)
        span = self.written_at[n] - self.written_at[k]
        return sum(self.samples[s] for s in range(k + 1, n + 1)) / span if span > 0 else 0.0

    def tokens_per_s(self) -> float:
        k, n = self.first_counted(), max(self.written_at)
        span = self.written_at[n] - self.written_at[k]
        return sum(self.tokens[s] for s in range(k + 1, n + 1)) / span if span > 0 else 0.0

    def step_s(self) -> float:
        k, n = self.first_counted(), max(self.written_at)
        return (self.written_at[n] - self.written_at[k]) / max(n - k, 1)

    def critical_path(self) -> dict[str, float]:
        """Shares of the trainer's wall time over the counted steps: training, publishing, and
        waiting for a batch (generation, its tail, the η guard and the weight loads behind it)."""
        k = self.first_counted()
        before = [p for step, _, _, p in self.train_spans if step == k]
        spans = [s for s in self.train_spans if s[0] > k]
        if not spans or not before:
            return {}
        begin, end = before[0], spans[-1][3]  # from update k's end: whole periods
        train = sum(t - s for _, s, t, _ in spans)
        publish = sum(p - t for _, _, t, p in spans)
        total = max(end - begin, 1e-12)
        waited = 1 - (train + publish) / total
        return {"train": train / total, "publish": publish / total, "wait for batch": waited}

    def utilisation(self) -> dict[str, float]:
        servers = self.setup.servers
        wall = max(self.end, 1e-12) * servers
        return {
            "inference decoding": self.server_busy_s / wall,
            "inference held (prefill, loads)": min(self.server_frozen_s / wall, 1.0),
            "trainer busy": sum(p - s for _, s, _, p in self.train_spans) / max(self.end, 1e-12),
        }

    def concurrency(self) -> float:
        """Requests on the servers, on average over the run."""
        return sum(self.latencies) / max(self.end, 1e-12)

    def lag_median_s(self) -> float:
        return median(self.latencies) if self.latencies else 0.0
