"""Where a run's time went, per step and service, from its metrics alone.

Every metrics row carries the wall time it was written at; the trainer's row
also carries how long the step's phases took (`wait_s`, `read_s`,
`forward_backward_s`, `optimizer_s`, `gather_s`, `write_s`, `mark_s`; coarser:
`train_s`, `publish_s`; written after publishing), the orchestrator's how long
the batch took from its previous one (`step_time_s` = `generate_s` +
`assemble_s` + `write_batch_s`, written after the batch), and inference writes one
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
# the same, finer (rows since issue 23): train = forward_backward + optimizer, publish = gather + write + mark
TRAINER_FINE = ("wait_s", "read_s", "forward_backward_s", "optimizer_s", "gather_s", "write_s", "mark_s")
ORCHESTRATOR_FINE = ("generate_s", "assemble_s", "write_batch_s")


@dataclass(frozen=True)
class Span:
    service: str
    phase: str
    step: int
    start: float
    end: float


def phases_of(row: dict, fine: tuple[str, ...], coarse: tuple[str, ...]) -> tuple[str, ...]:
    """The row's phase columns: the finer ones where it has them all."""
    return fine if all(p in row for p in fine) else coarse


def back_to_back(service: str, row: dict, phases: tuple[str, ...]) -> list[Span]:
    """The row's phases, the last ending at the row's time, each starting where the previous ended."""
    spans, end = [], row["time"]
    for phase in reversed(phases):
        start = end - row.get(phase, 0.0)
        spans.append(Span(service, phase.removesuffix("_s"), row["step"], start, end))
        end = start
    return spans


def trainer_spans(rows: list[dict]) -> list[Span]:
    return [s for r in rows for s in back_to_back(TRAINER, r, phases_of(r, TRAINER_FINE, TRAINER_PHASES))]


def orchestrator_spans(rows: list[dict]) -> list[Span]:
    out = []
    for r in rows:
        if all(p in r for p in ORCHESTRATOR_FINE):
            out += back_to_back(ORCHESTRATOR, r, ORCHESTRATOR_FINE)
        elif "step_time_s" in r:
            out.append(Span(ORCHESTRATOR, "generate", r["step"], r["time"] - r["step_time_s"], r["time"]))
    return out


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


def shares(rows: list[dict], phases: tuple[str, ...]) -> tuple[float, str]:
    """The mean seconds per step over `rows`, and each phase's mean and share of it."""
    parts = {p.removesuffix("_s"): mean(r.get(p, 0.0) for r in rows) for p in phases}
    step = sum(parts.values())
    return step, ", ".join(f"{name} {s:.3f} s ({s / max(step, 1e-9):.0%})" for name, s in parts.items())


def breakdown(rundir: RunDir, last_n: int) -> list[str]:
    """Mean seconds per step of each service's phases over its last `last_n` rows (the finer
    phases where every one of those rows has them)."""

    rows = {service: rundir.metrics.rows(service) for service in (TRAINER, ORCHESTRATOR, INFERENCE)}

    def last(service: str, key: str) -> list[dict]:
        return [r for r in rows[service] if key in r][-last_n:]

    trainer, orchestrator = last(TRAINER, "train_s"), last(ORCHESTRATOR, "step_time_s")
    lines = []
    if trainer:
        fine = all(phases_of(r, TRAINER_FINE, ()) for r in trainer)
        step, parts = shares(trainer, TRAINER_FINE if fine else TRAINER_PHASES)
        lines.append(f"  trainer      last {len(trainer)} steps: {step:.3f} s/step = {parts}")
    if orchestrator:
        cycle = mean(r["step_time_s"] for r in orchestrator)
        rate = mean(r["samples_per_s"] for r in orchestrator)
        line = f"  orchestrator last {len(orchestrator)} steps: {cycle:.3f} s/step, {rate:.0f} samples/s"
        if all(phases_of(r, ORCHESTRATOR_FINE, ()) for r in orchestrator):
            line += " = " + shares(orchestrator, ORCHESTRATOR_FINE)[1]
        lines.append(line)
    loads = last(INFERENCE, "load_s")
    if loads:
        lines.append(f"  inference    last {len(loads)} loads: {mean(r['load_s'] for r in loads):.3f} s each")
    if found := bound_of(rows[TRAINER], rows[ORCHESTRATOR], last_n):
        lines.append(f"  {found.line}")
    return lines


@dataclass(frozen=True)
class Bound:
    """Which side held the other up over `steps` steps: `side` is TRAINER or "generation"."""

    side: str
    line: str
    steps: int


def bound(rundir: RunDir, last_n: int) -> Bound | None:
    """`bound_of` the run's trainer and orchestrator metrics."""
    return bound_of(rundir.metrics.rows(TRAINER), rundir.metrics.rows(ORCHESTRATOR), last_n)


def bound_of(trainer_rows: list[dict], orchestrator_rows: list[dict], last_n: int) -> Bound | None:
    """Which side bounds the step over the last `last_n` steps: the one that waited the smaller
    share of its time for the other. The trainer waits for batches (`wait_s`); generation is held
    by the staleness guard while the weights are too old for another batch (`guard_wait_s`). The
    run's first step is left out where there are others: the trainer's wait then is the launch
    (vLLM's start, the first batch), which decided a short run's line alone. None until both have
    rows with those figures."""
    trainer = [r for r in trainer_rows if all(p in r for p in TRAINER_PHASES)]
    orchestrator = [r for r in orchestrator_rows if "guard_wait_s" in r and "step_time_s" in r]
    trainer, orchestrator = after_launch(trainer)[-last_n:], after_launch(orchestrator)[-last_n:]
    if not trainer or not orchestrator:
        return None
    waited = share(trainer, "wait_s", TRAINER_PHASES)
    held = share(orchestrator, "guard_wait_s", ("step_time_s",))
    both = (
        f"the trainer waited for batches {waited:.0%} of its time, "
        f"the staleness guard held generation back {held:.0%} of its time"
    )
    steps = min(len(trainer), len(orchestrator))
    if waited < held:
        return Bound(TRAINER, f"the trainer bounds the step: {both}", steps)
    return Bound("generation", f"generation bounds the step: {both}", steps)


def after_launch(rows: list[dict]) -> list[dict]:
    """`rows` less the run's first step's, unless that is all there is."""
    later = [r for r in rows if r["step"] > 1]
    return later or rows


def share(rows: list[dict], part: str, whole: tuple[str, ...]) -> float:
    """`part`'s share of the sum of `whole` over `rows`."""
    return sum(r[part] for r in rows) / max(sum(r[p] for r in rows for p in whole), 1e-9)
