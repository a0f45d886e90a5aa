"""The trainer borrowing inference's cores while it bounds the step (`trainer/cores.py`)."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from trainer.cores import GAIN, WARMUP, WINDOW, Borrower, Borrowing, CoreSet, Move, StepTimes, core_borrowing

WAITING = StepTimes(cycle_s=1.0, wait_s=0.4)  # the trainer waits for its batches: generation bounds
BOUND = StepTimes(cycle_s=1.0, wait_s=0.01)  # batches are there when it asks: the trainer bounds


def feed(decision: Borrowing, steps: list[StepTimes]) -> list[tuple[int, Move]]:
    """The moves asked for, by the (1-based) step after which each came."""
    return [(i, m) for i, times in enumerate(steps, 1) if (m := decision.observe(times)) is not None]


def test_a_trainer_that_waits_for_its_batches_keeps_its_own_cores(caplog):
    caplog.set_level(logging.INFO, "triad.trainer")
    decision = Borrowing()
    assert feed(decision, [BOUND] * WARMUP + [WAITING] * WINDOW + [BOUND] * 20) == []
    assert decision.state == "decided"
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (
        f"the trainer waits for its batches 40% of its step (0.40 of 1.00 s, median of {WINDOW} steps): "
        "it keeps its own cores"
    )


def test_a_bound_trainer_borrows_and_keeps_the_cores_if_its_steps_get_shorter(caplog):
    caplog.set_level(logging.INFO, "triad.trainer")
    decision = Borrowing()
    faster = StepTimes(cycle_s=0.7, wait_s=0.0)
    settling = StepTimes(cycle_s=9.0, wait_s=0.0)  # the first step on the new cores is not timed
    moves = feed(decision, [WAITING] * WARMUP + [BOUND] * WINDOW)
    assert moves == [
        (WARMUP + WINDOW, Move("borrowed", "its steps took 1.00 s, 0.01 s of them waiting for batches"))
    ]
    assert feed(decision, [settling] + [faster] * (WINDOW - 1)) == [] and decision.state == "borrowed"
    assert feed(decision, [faster] + [BOUND] * 9) == []  # the window's last step decides: it stays
    assert decision.state == "decided"
    assert caplog.records[-1].getMessage() == (
        f"the trainer keeps the borrowed cores: 0.70 s a step against 1.00 s on its own (median of {WINDOW})"
    )


@pytest.mark.parametrize("borrowed_cycle", [1.2, 1.0, 1 - GAIN / 2])
def test_a_bound_trainer_no_faster_on_borrowed_cores_moves_back(borrowed_cycle):
    decision = Borrowing()
    slower = StepTimes(cycle_s=borrowed_cycle, wait_s=0.0)
    moves = feed(decision, [BOUND] * (WARMUP + WINDOW + 1) + [slower] * WINDOW + [slower] * 5)
    assert [(i, m.to) for i, m in moves] == [(WARMUP + WINDOW, "borrowed"), (WARMUP + 2 * WINDOW + 1, "own")]
    assert moves[1][1].reason == (
        f"no faster with them: {borrowed_cycle:.2f} s a step against 1.00 s on its own (median of {WINDOW})"
    )


def test_every_rank_decides_on_the_slowest_rank_s_figures():
    """This rank's batches were there, another rank's were not: all keep their own cores."""
    other_rank = [1.0, 0.5]
    decision = Borrowing(agree=lambda figures: [max(a, b) for a, b in zip(figures, other_rank, strict=True)])
    assert feed(decision, [BOUND] * (WARMUP + WINDOW)) == []
    assert decision.state == "decided"


def test_medians_not_means_decide():
    """One slow step (a checkpoint, the store) in the window does not decide."""
    decision = Borrowing()
    window = [BOUND] * (WINDOW - 1) + [StepTimes(cycle_s=30.0, wait_s=25.0)]
    assert [m.to for _, m in feed(decision, [BOUND] * WARMUP + window)] == ["borrowed"]


@pytest.fixture
def on_one_core():
    """This process on one core of the two or more it may use, one torch thread; restored after."""
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    if len(cores) < 2:
        pytest.skip("needs two cores")
    own = max(cores)
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), {own})
    torch.set_num_threads(1)
    yield own, cores
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cores)
    torch.set_num_threads(threads)


def test_a_move_takes_every_thread_to_the_cores_with_a_thread_each_and_back(on_one_core):
    own, cores = on_one_core
    borrowed = min(cores)
    core_set = CoreSet("trainer.borrow_cpus", {own}, {borrowed}, ranks=1, threads=1)
    assert core_set.apply(Move("borrowed", "bound"))
    assert os.sched_getaffinity(0) == {own, borrowed} and torch.get_num_threads() == 2
    assert all(os.sched_getaffinity(int(t)) == {own, borrowed} for t in os.listdir("/proc/self/task"))
    assert core_set.apply(Move("own", "no faster"))
    assert os.sched_getaffinity(0) == {own} and torch.get_num_threads() == 1
    two_ranks = CoreSet("trainer.borrow_cpus", {own}, {borrowed}, ranks=2, threads=1)
    assert two_ranks.apply(Move("borrowed", "bound")) and torch.get_num_threads() == 1  # a core each


def test_cores_the_machine_refuses_leave_the_trainer_where_it_is_in_one_line(on_one_core, caplog):
    own, _ = on_one_core
    absent = os.cpu_count() + 64
    borrower = Borrower(Borrowing(), CoreSet("trainer.borrow_cpus", {own}, {absent}, ranks=1, threads=1))
    for _ in range(WARMUP + WINDOW):
        borrower.after_step(BOUND)
    assert os.sched_getaffinity(0) == {own} and torch.get_num_threads() == 1
    assert borrower.decision.state == "decided"
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(f"the trainer stays on cores {own}: trainer.borrow_cpus = '{own},{absent}': ")
    assert "\n" not in warning


def test_a_move_another_rank_could_not_make_is_undone_here(on_one_core, caplog):
    """Every rank moves or none does: this rank's cores allowed the move, another rank's did not."""
    caplog.set_level(logging.INFO, "triad.trainer")
    own, cores = on_one_core
    calls: list[list[float]] = []

    def agree(figures: list[float]) -> list[float]:  # the all-reduce (MAX), the other rank refused
        calls.append(figures)
        return [1.0] if len(figures) == 1 else figures

    core_set = CoreSet("trainer.borrow_cpus", {own}, {min(cores)}, ranks=1, threads=1)
    borrower = Borrower(Borrowing(agree), core_set)
    for _ in range(WARMUP + 2 * WINDOW + 3):
        borrower.after_step(BOUND)
    assert calls == [[1.0, 0.01], [0.0]]  # the figures after the own window, then the move's outcome
    assert os.sched_getaffinity(0) == {own} and torch.get_num_threads() == 1
    assert borrower.decision.state == "decided"
    assert caplog.records[-1].getMessage() == (
        f"the trainer moves to cores {own} with 1 thread(s) a rank: another rank's machine refused the "
        "borrowed cores"
    )


def test_nothing_to_borrow_without_cores_given_apart_from_its_own():
    assert core_borrowing("auto", 1, 60) is None  # outside `triad up`: the trainer does not know inference's
    own = os.sched_getaffinity(0)
    assert core_borrowing(",".join(map(str, sorted(own))), 1, 60) is None
