"""Small measurements for the orchestrator's metrics: percentiles, event-loop lag, the η guard's
waits, and the counters a step's row takes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator import env_calls

if TYPE_CHECKING:
    from orchestrator.draws import Draws
    from orchestrator.failures import Failures
    from orchestrator.servers.pool import ServerPool

LAG_PROBE_S = 0.05


def rates(elapsed: float, samples: int, tokens: int) -> dict[str, float]:
    """A step's duration and throughput."""
    per_s = 1 / max(elapsed, 1e-9)
    return dict(step_time_s=elapsed, samples_per_s=samples * per_s, tokens_per_s=tokens * per_s)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(prefix: str, values: Sequence[float]) -> dict[str, float]:
    return {f"{prefix}_p{q}": percentile(values, q) for q in (50, 90, 99)}


class LoopLag:
    """How late the event loop wakes a task that sleeps LAG_PROBE_S: a busy loop delays everything."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(LAG_PROBE_S)
            self.samples.append(max(0.0, time.perf_counter() - start - LAG_PROBE_S))

    def take(self) -> dict[str, float]:
        samples, self.samples = self.samples, []
        return {
            "loop_lag_mean_s": sum(samples) / len(samples) if samples else 0.0,
            "loop_lag_max_s": max(samples, default=0.0),
        }


class GuardWaits:
    """Time the producer is held by the η guard alone (a slot is free and a batch is left to start,
    but the served version is too old for it), and the slot-seconds left empty meanwhile
    (seconds times free slots), since the last `take()`. The producer reports its state at every
    wake-up, which comes with every change of `pending` or of the served version, so the free slots
    are constant between two reports."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.since: float | None = None  # held since (None: not held)
        self.free = 0
        self.wait_s = self.idle_slot_s = 0.0

    def observe(self, held: bool, free_slots: int) -> None:
        now = self.clock()
        self._count(now)
        self.since, self.free = (now, free_slots) if held else (None, 0)

    def _count(self, now: float) -> None:
        if self.since is not None:
            self.wait_s += now - self.since
            self.idle_slot_s += (now - self.since) * self.free
            self.since = now

    def take(self) -> dict[str, float]:
        self._count(self.clock())
        out = {"guard_wait_s": self.wait_s, "guard_idle_slot_s": self.idle_slot_s}
        self.wait_s = self.idle_slot_s = 0.0
        return out


class StepCounters:
    """What a step's metrics row counts since the previous row, from each part of the orchestrator:
    request latencies and counts (the pool), event-loop lag, the η guard's waits, samples dropped
    as too stale, draws, failures and environment calls."""

    def __init__(self, pool: ServerPool, draws: Draws, failures: Failures) -> None:
        self.pool, self.draws, self.failures = pool, draws, failures
        self.loop_lag = LoopLag()
        self.guard = GuardWaits()
        self.dropped_total = 0

    def take(self, dropped: int, filtered: int) -> dict[str, Any]:
        """The counts since the last `take`; `dropped` and `filtered` are this step's."""
        self.dropped_total += dropped
        return dict(
            **summarize("request_latency_s", self.pool.take_latencies()),
            **self.pool.take_requests(),
            **self.loop_lag.take(),
            **self.guard.take(),
            samples_dropped=dropped,
            samples_dropped_total=self.dropped_total,
            **self.draws.metrics(),
            groups_filtered=filtered,
            **self.failures.take(),
            **env_calls.take_counts(),
        )
