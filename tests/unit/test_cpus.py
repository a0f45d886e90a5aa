"""Core lists, and moving a process's threads onto some (`shared/cpus.py`)."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from shared.cpus import check_cpus, move_threads
from shared.errors import TriadError


def thread_cores() -> dict[int, set[int]]:
    """Each live thread's cores (threads of earlier tests may end while they are listed)."""
    cores = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            cores[int(task.name)] = os.sched_getaffinity(int(task.name))
    return cores


@pytest.fixture
def restore_affinity():
    before = thread_cores()
    yield
    for tid, cores in before.items():
        with contextlib.suppress(ProcessLookupError):  # a thread of the test, ended
            os.sched_setaffinity(tid, cores)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="a move needs two cores to show")
def test_every_thread_moves_and_one_started_later_inherits_the_cores(restore_affinity):
    cores = sorted(os.sched_getaffinity(0))
    target = cores[-1]
    release, started = threading.Event(), []
    waiting = threading.Thread(target=release.wait)
    waiting.start()
    try:
        assert len(thread_cores()) >= 2
        move_threads("inference.frontend_cpus", str(target))
        assert set(map(frozenset, thread_cores().values())) == {frozenset({target})}
        later = threading.Thread(target=lambda: started.append(os.sched_getaffinity(0)))
        later.start()
        later.join()
        assert started == [{target}]
    finally:
        release.set()
        waiting.join()


def test_a_core_the_machine_lacks_is_one_line_naming_the_option(restore_affinity):
    before = thread_cores()
    with pytest.raises(TriadError) as e:
        move_threads("inference.frontend_cpus", "4000")
    message = str(e.value)
    assert message.startswith("inference.frontend_cpus = '4000': cannot move this process there (")
    assert "\n" not in message
    after = thread_cores()
    assert all(after[tid] == before[tid] for tid in before.keys() & after.keys())  # nothing moved


def test_a_list_the_kernel_would_cut_short_is_refused_not_half_applied(restore_affinity):
    """The kernel drops cores a process may not use and keeps the rest without an error."""
    core = min(os.sched_getaffinity(0))
    with pytest.raises(TriadError) as e:
        move_threads("inference.frontend_cpus", f"{core},4000")
    assert str(e.value).startswith(
        f"inference.frontend_cpus = '{core},4000': core 4000 is not among the cores"
    )
    with pytest.raises(TriadError, match=r"^inference.frontend_cpus = '1-0': the range 1-0 runs backwards"):
        move_threads("inference.frontend_cpus", "1-0")


def test_check_cpus_names_what_is_outside_or_backwards():
    check_cpus("trainer.cpus", "0-1", {0, 1})
    with pytest.raises(TriadError, match=r"^trainer.cpus = '1-0': the range 1-0 runs backwards; write 0-1$"):
        check_cpus("trainer.cpus", "1-0", {0, 1})
    with pytest.raises(TriadError, match=r"^inference.frontend_cpus = '2-3': cores 2-3 are not among"):
        check_cpus("inference.frontend_cpus", "2-3", {0, 1})
