"""Borrowing inference's CPU cores while the trainer bounds the step (`trainer.borrow_cpus`).

Under `triad up` with `inference.cpus = "auto"` a machine without a GPU is split: vLLM's engine on
the first half of the cores, the trainer on the rest. Which side bounds the step depends on the
model and the task: the embedded 0.5M model's trainer waits for its batches, where a 50M model's
rollouts wait for the trainer, whose steps were then 1.3x shorter on every core than on its own
half (bench/results/placement.md). So the trainer measures instead of guessing. After `WARMUP` steps
it times `WINDOW` steps on its own cores; if it waited for its batches less than `WAIT_SHARE` of
that time, it moves onto inference's cores as well, with a thread for each core, times `WINDOW`
steps there (after one step to settle), and keeps them only if its steps got shorter by at least
`GAIN`; else it moves back. One decision a start, logged with its figures. With several ranks,
each decides on the same figures: the slowest rank's (`agree`).

`Borrowing` is the decision, fed each step's times; `CoreSet` applies a move (this process's
threads and torch's thread count); `Borrower` joins the two for the training loop.
"""

from __future__ import annotations

import logging
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from shared.cpus import format_cpus, move_threads, parse_cpus
from shared.errors import TriadError

log = logging.getLogger("triad.trainer")

WARMUP = 2  # steps not timed: the first loads kernels, grows the allocator, waits for the first batch
WINDOW = 4  # steps timed on each set of cores
WAIT_SHARE = 0.1  # waiting for batches less than this share of the step: the trainer bounds it
GAIN = 0.05  # the least shortening of the step that keeps the borrowed cores
DECIDED = WARMUP + 2 * WINDOW + 1  # the latest step after which the decision is made (a settling step)


@dataclass(frozen=True)
class StepTimes:
    cycle_s: float  # from the start of waiting for the batch to the end of publishing it
    wait_s: float  # of it, waiting for the batch


@dataclass(frozen=True)
class Move:
    to: Literal["borrowed", "own"]
    reason: str


def median_times(steps: list[StepTimes]) -> list[float]:
    return [statistics.median(s.cycle_s for s in steps), statistics.median(s.wait_s for s in steps)]


class Borrowing:
    """When to move onto the borrowed cores and whether to stay (pure: fed each step's times).
    `agree` turns this rank's [median cycle, median wait] into the figures every rank decides on."""

    def __init__(self, agree: Callable[[list[float]], list[float]] = lambda figures: figures) -> None:
        self.agree = agree
        self.seen = 0
        self.own: list[StepTimes] = []
        self.borrowed: list[StepTimes] = []
        self.own_cycle_s = 0.0
        self.state: Literal["own", "borrowed", "decided"] = "own"

    def observe(self, times: StepTimes) -> Move | None:
        """This step's times; the move to make before the next step, if any."""
        self.seen += 1
        if self.state == "decided" or self.seen <= WARMUP:
            return None
        if self.state == "own":
            self.own.append(times)
            return self.after_own() if len(self.own) == WINDOW else None
        if self.seen > WARMUP + WINDOW + 1:  # the first step on the borrowed cores settles them
            self.borrowed.append(times)
        return self.after_borrowed() if len(self.borrowed) == WINDOW else None

    def after_own(self) -> Move | None:
        cycle, wait = self.agree(median_times(self.own))
        if wait >= WAIT_SHARE * cycle:
            self.state = "decided"
            log.info(
                "the trainer waits for its batches %.0f%% of its step (%.2f of %.2f s, median of %d "
                "steps): it keeps its own cores",
                100 * wait / cycle,
                wait,
                cycle,
                WINDOW,
            )
            return None
        self.state, self.own_cycle_s = "borrowed", cycle
        return Move("borrowed", f"its steps took {cycle:.2f} s, {wait:.2f} s of them waiting for batches")

    def stop(self) -> None:
        """No more moves this start (a move was refused)."""
        self.state = "decided"

    def after_borrowed(self) -> Move | None:
        cycle, _ = self.agree(median_times(self.borrowed))
        self.state = "decided"
        figures = f"{cycle:.2f} s a step against {self.own_cycle_s:.2f} s on its own (median of {WINDOW})"
        if cycle <= (1 - GAIN) * self.own_cycle_s:
            log.info("the trainer keeps the borrowed cores: %s", figures)
            return None
        return Move("own", f"no faster with them: {figures}")


class CoreSet:
    """This process's cores and torch's thread count: its own (where it started), or those with
    the borrowed ones added, a thread for each core of a rank's share."""

    def __init__(self, key: str, own: set[int], borrowed: set[int], ranks: int, threads: int) -> None:
        self.key, self.own, self.borrowed, self.ranks = key, own, borrowed - own, ranks
        self.own_threads = threads
        self.current = own

    @property
    def every(self) -> set[int]:
        return self.own | self.borrowed

    def apply(self, move: Move) -> bool:
        """Make the move; False (said in one line, the trainer staying where it is) where this
        machine refuses it."""
        import torch

        cores = self.every if move.to == "borrowed" else self.own
        threads = max(1, len(cores) // self.ranks) if move.to == "borrowed" else self.own_threads
        try:
            move_threads(self.key, format_cpus(sorted(cores)))
        except TriadError as e:
            move_threads(self.key, format_cpus(sorted(self.current)))
            log.warning("the trainer stays on cores %s: %s", format_cpus(sorted(self.current)), e)
            return False
        torch.set_num_threads(threads)
        self.current = cores
        log.info(
            "the trainer moves to cores %s with %d thread(s) a rank: %s",
            format_cpus(sorted(cores)),
            threads,
            move.reason,
        )
        return True


def rank_figures(timeout_s: float) -> Callable[[list[float]], list[float]]:
    """`Borrowing.agree` for this process group: the largest of each figure over the ranks."""
    import torch
    import torch.distributed as dist

    from trainer.phases import BORROW_CORES, collective_phase

    def slowest(figures: list[float]) -> list[float]:
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return figures
        values = torch.tensor(figures, dtype=torch.float64)
        with collective_phase(BORROW_CORES, timeout_s):
            dist.all_reduce(values, op=dist.ReduceOp.MAX)
        return values.tolist()

    return slowest


class Borrower:
    """A `Borrowing` decision made on a `CoreSet`. A move is made on every rank or on none: where
    one rank's machine refuses it, the ranks that made it move back, and none decides again (each
    rank reaches each of the decision's all-reduces, whatever its own cores allowed)."""

    def __init__(self, decision: Borrowing, cores: CoreSet) -> None:
        self.decision, self.cores = decision, cores

    def after_step(self, times: StepTimes) -> None:
        move = self.decision.observe(times)
        if move is None:
            return
        made = self.cores.apply(move)
        [refused] = self.decision.agree([0.0 if made else 1.0])
        if refused:
            if made and move.to == "borrowed":
                self.cores.apply(Move("own", "another rank's machine refused the borrowed cores"))
            self.decision.stop()


def core_borrowing(spec: str, threads: int, timeout_s: float) -> Borrower | None:
    """The borrower for `trainer.borrow_cpus` = `spec` (`auto`: what `triad up` gives, none
    elsewhere), with torch's `threads` a rank on its own cores (`timeout_s`: of the ranks'
    agreement); None with nothing to borrow."""
    if spec == "auto":
        return None
    own = os.sched_getaffinity(0)
    borrowed = parse_cpus(spec) - own
    if not borrowed:
        return None
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cores = CoreSet("trainer.borrow_cpus", own, borrowed, ranks, threads)
    return Borrower(Borrowing(rank_figures(timeout_s)), cores)
