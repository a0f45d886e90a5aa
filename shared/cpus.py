"""CPU core lists as taskset and VLLM_CPU_OMP_THREADS_BIND write them ('0-3,8'), and moving a
process's threads onto some."""

from __future__ import annotations

import os
from pathlib import Path

from shared.errors import TriadError


def format_cpus(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def cpu_ranges(spec: str) -> list[tuple[int, int]]:
    """'0-3,8' -> [(0, 3), (8, 8)]."""
    ranges = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        ranges.append((int(low), int(high or low)))
    return ranges


def parse_cpus(spec: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}."""
    return {core for low, high in cpu_ranges(spec) for core in range(low, high + 1)}


def check_ranges(key: str, spec: str) -> None:
    """TriadError if a range of `spec` (the value of option `key`) runs backwards."""
    for low, high in cpu_ranges(spec):
        if high < low:
            raise TriadError(f"{key} = {spec!r}: the range {low}-{high} runs backwards; write {high}-{low}")


def check_cpus(key: str, spec: str, cores: set[int]) -> None:
    """TriadError unless `spec` (the value of option `key`) names only cores among `cores`."""
    check_ranges(key, spec)
    outside = parse_cpus(spec) - cores
    if outside:
        raise TriadError(
            f"{key} = {spec!r}: {describe(outside)} not among the cores this process may use here "
            f"({format_cpus(sorted(cores))})"
        )


def describe(cores: set[int]) -> str:
    return ("core {} is" if len(cores) == 1 else "cores {} are").format(format_cpus(sorted(cores)))


def move_threads(key: str, spec: str) -> None:
    """Every thread of this process onto `spec`'s cores (the value of option `key`); threads it
    starts later inherit them, and processes it started before stay where they are. The threads
    are listed again until a pass finds none new (one may start another while they move). A core
    the process cannot use (absent, or outside its cgroup's) is a TriadError: the kernel would
    silently drop it."""
    check_ranges(key, spec)
    cores, moved = parse_cpus(spec), set()
    while new := {int(task.name) for task in Path("/proc/self/task").iterdir()} - moved:
        for tid in new:
            try:
                os.sched_setaffinity(tid, cores)
            except ProcessLookupError:  # the thread ended since the listing
                continue
            except OSError as e:
                raise TriadError(
                    f"{key} = {spec!r}: cannot move this process there ({e.strerror}); "
                    "name cores this machine lets it use (`taskset -p $$` shows them)"
                ) from None
        moved |= new
    missing = cores - os.sched_getaffinity(0)
    if missing:
        raise TriadError(
            f"{key} = {spec!r}: {describe(missing)} not among the cores this process may use "
            f"here (it runs on {format_cpus(sorted(os.sched_getaffinity(0)))}); name only those"
        )
