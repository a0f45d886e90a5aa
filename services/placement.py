"""Where `triad up`'s children run: the CPU cores of inference and the trainer, and the GPUs the
trainer's ranks see, as the config gives them and as this machine has them."""

from __future__ import annotations

import os
from pathlib import Path

from shared.config import TriadConfig
from shared.cpus import check_cpus, format_cpus
from shared.errors import TriadError
from shared.rundir import INFERENCE, TRAINER


def has_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU (its control device), without importing torch."""
    return Path("/dev/nvidiactl").exists()


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


def frontend_cores(cfg: TriadConfig, cpus: dict) -> str | None:
    """The cores `triad up` gives vLLM's API server (`inference.frontend_cpus = "auto"`): the
    trainer's, where `inference.cpus = "auto"` split the machine, so that vLLM's engine core has
    inference's cores to itself (on one core the two took turns); None where the config names
    them itself (inference reads them) or nothing was split."""
    launcher = cfg.inference.backend not in ("vllm", "sglang")  # triad's, as `triad inference` starts
    split_by_auto = cfg.inference.cpus == "auto" and bool(cpus[INFERENCE])
    if cfg.inference.frontend_cpus != "auto" or not (launcher and split_by_auto):
        return None
    return cpus[TRAINER]


def borrowed_cores(cfg: TriadConfig, cpus: dict) -> str | None:
    """The cores `triad up` lets the trainer borrow (`trainer.borrow_cpus = "auto"`): inference's,
    where `inference.cpus = "auto"` split the machine and `trainer.cpus` is unset; the trainer
    runs on them as well only while it bounds the step, and keeps them only if its steps get
    shorter (`trainer/cores.py`). None where the config names them itself (the trainer reads
    them) or nothing was split."""
    split_by_auto = cfg.inference.cpus == "auto" and bool(cpus[INFERENCE]) and not cfg.trainer.cpus
    if cfg.trainer.borrow_cpus != "auto" or not split_by_auto:
        return None
    return cpus[INFERENCE]


def pinned(cmd: list[str], cpus: str | None) -> list[str]:
    """The command run on those cores only (and every process it starts)."""
    return ["taskset", "-c", cpus, *cmd] if cpus else cmd


def check_placement(cfg: TriadConfig, cores: set[int] | None = None, gpu: bool | None = None) -> None:
    """The cores and GPUs the config gives the services exist here (`cores`: those this process
    may use; taskset and torchrun would otherwise fail among a launcher's lines)."""
    cores = os.sched_getaffinity(0) if cores is None else cores
    for key, spec in (
        ("inference.cpus", cfg.inference.cpus),
        ("inference.frontend_cpus", cfg.inference.frontend_cpus),
        ("trainer.cpus", cfg.trainer.cpus),
        ("trainer.borrow_cpus", cfg.trainer.borrow_cpus),
    ):
        if spec is not None and spec != "auto":
            check_cpus(key, spec, cores)
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
