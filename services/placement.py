"""Where `triad up`'s children run: the CPU cores of inference and the trainer, and the GPUs the
trainer's ranks see, as the config gives them and as this machine has them."""

from __future__ import annotations

import os
from pathlib import Path

from services.timeline import Bound
from shared.config import TriadConfig
from shared.errors import TriadError
from shared.rundir import INFERENCE, TRAINER


def has_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU (its control device), without importing torch."""
    return Path("/dev/nvidiactl").exists()


def format_cpus(cores: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5', as taskset and VLLM_CPU_OMP_THREADS_BIND read it."""
    runs: list[list[int]] = []
    for core in sorted(cores):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def cpu_ranges(spec: str) -> list[tuple[int, int]]:
    """'0-3,8' -> [(0, 3), (8, 8)], as taskset and VLLM_CPU_OMP_THREADS_BIND write it."""
    ranges = []
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        ranges.append((int(low), int(high or low)))
    return ranges


def parse_cpus(spec: str) -> set[int]:
    """'0-3,8' -> {0, 1, 2, 3, 8}."""
    return {core for low, high in cpu_ranges(spec) for core in range(low, high + 1)}


def placement(cfg: TriadConfig, cores: list[int] | None = None, gpu: bool | None = None) -> dict:
    """The CPU cores of inference and the trainer (None: not pinned). `inference.cpus = "auto"`
    on a machine without a GPU: inference the first half of the cores this process may use, the
    trainer the rest (unless `trainer.cpus` is set): vLLM's CPU worker binds its OpenMP threads
    to cores itself (by default from core 0), and a trainer thread on the same core halves both."""
    inference, trainer = cfg.inference.cpus, cfg.trainer.cpus
    if inference == "auto":
        cores = sorted(os.sched_getaffinity(0)) if cores is None else cores
        if (has_gpu() if gpu is None else gpu) or len(cores) < 2:
            inference = None
        else:
            half = len(cores) // 2
            inference, trainer = format_cpus(cores[:half]), trainer or format_cpus(cores[half:])
    return {INFERENCE: inference, TRAINER: trainer}


def trainer_cores_hint(
    cfg: TriadConfig, cpus: dict, found: Bound | None, cores: list[int] | None = None
) -> str | None:
    """Where the trainer bounded a run that `inference.cpus = "auto"` split into cores of its own
    and inference's: how to let it share inference's cores, and what that did here."""
    split_by_auto = cfg.inference.cpus == "auto" and bool(cpus[INFERENCE]) and not cfg.trainer.cpus
    if found is None or found.side != TRAINER or not split_by_auto:
        return None
    every = format_cpus(sorted(os.sched_getaffinity(0)) if cores is None else cores)
    return (
        f"the trainer had cores {cpus[TRAINER]} to itself (cpus auto); --set trainer.cpus={every} "
        "shares inference's with it: faster where generation leaves them idle, slower where it "
        "does not (bench/results/placement.md)"
    )


def pinned(cmd: list[str], cpus: str | None) -> list[str]:
    """The command run on those cores only (and every process it starts)."""
    return ["taskset", "-c", cpus, *cmd] if cpus else cmd


def check_placement(cfg: TriadConfig, cores: set[int] | None = None, gpu: bool | None = None) -> None:
    """The cores and GPUs the config gives the services exist here (`cores`: those this process
    may use; taskset and torchrun would otherwise fail among a launcher's lines)."""
    cores = os.sched_getaffinity(0) if cores is None else cores
    for key, spec in (("inference.cpus", cfg.inference.cpus), ("trainer.cpus", cfg.trainer.cpus)):
        if spec is None or spec == "auto":
            continue
        for low, high in cpu_ranges(spec):
            if high < low:
                raise TriadError(
                    f"{key} = {spec!r}: the range {low}-{high} runs backwards; write {high}-{low}"
                )
        outside = parse_cpus(spec) - cores
        if outside:
            which = ("core {} is" if len(outside) == 1 else "cores {} are").format(
                format_cpus(sorted(outside))
            )
            raise TriadError(
                f"{key} = {spec!r}: {which} not among the cores this process may use here "
                f"({format_cpus(sorted(cores))})"
            )
    tc = cfg.trainer
    on_gpu = tc.device == "cuda" or (tc.device == "auto" and (has_gpu() if gpu is None else gpu))
    if not on_gpu:
        return  # ranks on CPU share its cores
    where, gpus = visible_gpus(tc.devices)
    if tc.nproc > len(gpus):
        raise TriadError(
            f"trainer.nproc = {tc.nproc} ranks, one a GPU, but {where} has {len(gpus)}: set "
            "trainer.nproc to at most that, or trainer.devices to more GPUs"
        )


def visible_gpus(devices: str | None) -> tuple[str, list[str]]:
    """The GPUs the trainer would see, and what says so: `trainer.devices`, else
    CUDA_VISIBLE_DEVICES, else the GPU device files of this machine."""
    if devices:
        return f"trainer.devices = {devices!r}", devices.split(",")
    if (env := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return f"CUDA_VISIBLE_DEVICES = {env!r}", [d for d in env.split(",") if d.strip()]
    return "this machine", [p.name for p in Path("/dev").glob("nvidia[0-9]*")]
