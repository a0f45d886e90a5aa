"""What a run's weights versions and checkpoints can take on its run directory's disk (the bounds
of docs/reliability.md, "Disk use is bounded"), from the model's safetensors headers and the
config, and `triad up`'s warning, before anything starts, when that disk has less room: a disk
that fills hours into a run stops it (`shared/diskspace.py`); told at the start, the user can make
room or keep fewer.

Rollout batches, logs and metrics are left out: a few MB beside a model's versions."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from shared.config import TriadConfig
from shared.diskspace import disk_usage, size_text
from shared.rundir import RunDir
from shared.storage import LocalStore

DTYPE_BYTES = {  # safetensors' dtype names
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "BF16": 2, "F16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "BOOL": 1,
}  # fmt: skip
SERVED_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}  # vLLM's names
MASTER_BYTES = 4  # the trainer keeps float32 parameters (trainer/main.py) ...
ADAMW_STATES = 2  # ... and AdamW two moments of each, in a checkpoint beside them


@dataclass(frozen=True)
class ModelSize:
    params: int
    stored_bytes: int  # in the dtypes of the model's own files


def weight_files(model_dir: Path) -> list[Path]:
    """The safetensors files transformers loads: those its index names, or the single file
    (a repository may also hold another format's copy, as Mistral's `consolidated.safetensors`)."""
    from huggingface_hub.constants import SAFETENSORS_INDEX_FILE, SAFETENSORS_SINGLE_FILE

    index = model_dir / SAFETENSORS_INDEX_FILE
    if index.is_file():
        try:
            names = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return []
        return sorted(model_dir / name for name in names)
    single = model_dir / SAFETENSORS_SINGLE_FILE
    return [single] if single.is_file() else sorted(model_dir.glob("*.safetensors"))


def model_size(model_dir: Path) -> ModelSize | None:
    """From the headers of the model's safetensors files; None where it has none, or one cannot
    be read (the services that load it say why, in their own line)."""
    from safetensors import SafetensorError, safe_open

    params = stored = 0
    files = weight_files(model_dir)
    try:
        for file in files:
            with safe_open(file, framework="numpy") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is no mapping)
                    tensor = f.get_slice(name)
                    numel = math.prod(tensor.get_shape())
                    params += numel
                    stored += numel * DTYPE_BYTES.get(tensor.get_dtype(), 4)
    except (OSError, SafetensorError):
        return None
    return ModelSize(params, stored) if files else None


@dataclass(frozen=True)
class DiskPlan:
    versions: int
    version_bytes: int
    checkpoints: int
    checkpoint_bytes: int

    @property
    def total(self) -> int:
        return self.versions * self.version_bytes + self.checkpoints * self.checkpoint_bytes


def version_bytes(cfg: TriadConfig, size: ModelSize) -> int:
    """A published version: in `weights.dtype`, whose `auto` is the dtype inference serves
    (`inference.dtype`, whose `auto` is the model's own) (trainer/publish.py)."""
    choice = cfg.weights.dtype
    if choice == "auto":
        choice = cfg.inference.dtype
    if choice in ("auto", "model"):
        return size.stored_bytes
    return size.params * SERVED_BYTES.get(choice, 4)


def disk_plan(cfg: TriadConfig, size: ModelSize) -> DiskPlan | None:
    """The most a run keeps at once; None for a LoRA run (its versions and checkpoints hold the
    adapter only: small)."""
    if cfg.trainer.lora.rank:
        return None
    checkpointing = cfg.trainer.checkpoint.every > 0
    kept = cfg.trainer.checkpoint.keep if checkpointing else 0
    # the newest `weights.keep`, those of kept checkpoints, the one being written, and with delta
    # versions their snapshot (the deltas after it are a small part of one)
    versions = cfg.weights.keep + kept + 1 + (cfg.weights.snapshot_every > 1)
    checkpoints = kept + 1 if checkpointing else 0  # a new one is complete before the oldest goes
    checkpoint_bytes = size.params * MASTER_BYTES * (1 + ADAMW_STATES)
    return DiskPlan(versions, version_bytes(cfg, size), checkpoints, checkpoint_bytes)


def room_warning(cfg: TriadConfig, model_dir: Path, rundir: RunDir) -> str | None:
    """A line for the user where the run directory's disk cannot hold what the run keeps (what
    the run directory already holds counts as room: a resumed run replaces it); None otherwise,
    and for an object store (a bucket's room is its provider's)."""
    if not isinstance(rundir.store, LocalStore):
        return None
    size = model_size(model_dir)
    plan = disk_plan(cfg, size) if size else None
    if plan is None:
        return None
    usage = disk_usage(rundir.root)
    if usage is None or plan.total <= usage[0]:
        return None
    free = usage[0]
    held = rundir.store.size("") if rundir.root.exists() else 0  # walked only when it matters
    if plan.total <= free + held:
        return None
    return (
        f"the disk of {rundir.root} has {size_text(free)} free, and this run can keep "
        f"{size_text(plan.total)} there: {plan.versions} weights versions of {size_text(plan.version_bytes)} "
        f"(weights.keep, those of kept checkpoints, one being written) and {plan.checkpoints} "
        f"checkpoints of {size_text(plan.checkpoint_bytes)} (trainer.checkpoint.keep + 1: float32 "
        "weights and AdamW's two moments); free space, keep fewer, or give run_dir a larger disk: "
        "a full disk stops the run, which then resumes from its last checkpoint"
    )
