"""Where a run's time went, per step and service, from its metrics alone.

Every metrics row carries the wall time it was written at; the trainer's row
also carries how long the step's phases took (`wait_s`, `train_s`, `publish_s`,
written after publishing), the orchestrator's how long the batch took from its
previous one (`step_time_s`, written after the batch), and inference writes one
row per weight load (with `load_s`, the time the load held the server, where the
server reports it). Phases end where the row was written and are laid back to
back before it, so a timeline is exact at each row's end and as exact as the
phase durations before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import mean

from shared.rundir import INFERENCE, ORCHESTRATOR, TRAINER, RunDir

TRAINER_PHASES = ("wait_s", "train_s", "publish_s")


@dataclass(frozen=True)
class Span:
    service: str
    phase: str
    step: int
    start: float
    end: float


def trainer_spans(rows: list[dict]) -> list[Span]:
    spans = []
    for row in rows:
        end = row["time"]
        for phase in reversed(TRAINER_PHASES):
            start = end - row.get(phase, 0.0)
            spans.append(Span(TRAINER, phase.removesuffix("_s"), row["step"], start, end))
            end = start
    return spans


def orchestrator_spans(rows: list[dict]) -> list[Span]:
    return [
        Span(ORCHESTRATOR, "generate", r["step"], r["time"] - r["step_time_s"], r["time"])
        for r in rows
        if "step_time_s" in r
    ]


def inference_spans(rows: list[dict]) -> list[Span]:
    return [
        Span(INFERENCE, "load", r["version"], r["time"] - r.get("load_s", 0.0), r["time"])
        for r in rows
        if "version" in r
    ]


def spans(rundir: RunDir, first: int, last: int) -> list[Span]:
    """The spans of steps `first..last` (weights versions for inference)."""
    out = trainer_spans(rundir.metrics.rows(TRAINER))
    out += orchestrator_spans(rundir.metrics.rows(ORCHESTRATOR))
    out += inference_spans(rundir.metrics.rows(INFERENCE))
    return [s for s in out if first <= s.step <= last]


def breakdown(rundir: RunDir, last_n: int) -> list[str]:
    """Mean seconds per step of each service's phases over its last `last_n` rows."""

    def last(service: str, key: str) -> list[dict]:
        return [r for r in rundir.metrics.rows(service) if key in r][-last_n:]

    trainer, orchestrator = last(TRAINER, "train_s"), last(ORCHESTRATOR, "step_time_s")
    lines = []
    if trainer:
        parts = {p.removesuffix("_s"): mean(r.get(p, 0.0) for r in trainer) for p in TRAINER_PHASES}
        step = sum(parts.values())
        shares = ", ".join(f"{name} {s:.3f} s ({s / max(step, 1e-9):.0%})" for name, s in parts.items())
        lines.append(f"  trainer      last {len(trainer)} steps: {step:.3f} s/step = {shares}")
    if orchestrator:
        cycle = mean(r["step_time_s"] for r in orchestrator)
        rate = mean(r["samples_per_s"] for r in orchestrator)
        count = len(orchestrator)
        lines.append(f"  orchestrator last {count} steps: {cycle:.3f} s/step, {rate:.0f} samples/s")
    loads = last(INFERENCE, "load_s")
    if loads:
        lines.append(f"  inference    last {len(loads)} loads: {mean(r['load_s'] for r in loads):.3f} s each")
    return lines
