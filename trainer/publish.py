"""Publishing weights as a Hugging Face directory that vLLM and transformers load."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from shared.rundir import (
    WEIGHTS,
    RunDir,
    atomic_path,
    atomic_write_json,
    clear_step_dir,
    prune_steps,
    write_marker,
)

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def export_state_dict(state: dict[str, torch.Tensor], tied_embeddings: bool, dtype: torch.dtype) -> dict:
    """Contiguous CPU tensors in the published dtype; a tied head is stored once."""
    out = {}
    for name, tensor in state.items():
        if tied_embeddings and name == "lm_head.weight":
            continue
        out[name] = tensor.detach().to("cpu", dtype).contiguous()
    return out


def publish_weights(
    rundir: RunDir,
    run_id: str,
    version: int,
    state: dict[str, torch.Tensor],
    save_metadata,
    keep_last: int,
    protect: frozenset[int] = frozenset(),
) -> Path:
    """Write `weights/step_V/` (config, tokenizer, safetensors), then its `DONE`."""
    step_dir = rundir.weights_dir(version)
    clear_step_dir(step_dir)
    step_dir.mkdir(parents=True)
    save_metadata(step_dir)
    with atomic_path(step_dir / WEIGHTS_FILE) as tmp:
        save_file(state, tmp, metadata={"format": "pt"})
    size = sum(f.stat().st_size for f in step_dir.iterdir())
    write_marker(step_dir, run_id, version, version=version, bytes=size, files=True)
    prune_steps(rundir.root / WEIGHTS, keep_last, done_upto=version, protect=protect)
    return step_dir


def mark_broadcast(
    rundir: RunDir, run_id: str, version: int, keep_last: int, protect: frozenset[int]
) -> None:
    """`DONE` for a version that reached inference by broadcast only: no files to load."""
    write_marker(rundir.weights_dir(version), run_id, version, version=version, bytes=0, files=False)
    prune_steps(rundir.root / WEIGHTS, keep_last, done_upto=version, protect=protect)


def published_parameters(model: torch.nn.Module, tied: bool) -> list[tuple[str, torch.nn.Parameter]]:
    """Parameters under their Hugging Face names; a tied head is published once, as the embedding."""
    return [(n, p) for n, p in model.named_parameters() if not (tied and n == "lm_head.weight")]


def shard_name(rank: int, world: int) -> str:
    return f"model-{rank + 1:05d}-of-{world:05d}.safetensors"


def start_shards(step_dir: Path, save_metadata) -> None:
    clear_step_dir(step_dir)
    step_dir.mkdir(parents=True)
    save_metadata(step_dir)


def write_shard(step_dir: Path, rank: int, world: int, tensors: dict[str, torch.Tensor]) -> None:
    with atomic_path(step_dir / shard_name(rank, world)) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt"})


def finish_shards(
    rundir: RunDir, run_id: str, version: int, names: list[str], world: int, keep_last: int,
    protect: frozenset[int],
) -> None:  # fmt: skip
    """The Hugging Face index (which shard holds each tensor), then `DONE`."""
    step_dir = rundir.weights_dir(version)
    size = sum(f.stat().st_size for f in step_dir.glob("*.safetensors"))
    weight_map = {name: shard_name(i % world, world) for i, name in enumerate(names)}
    index = {"metadata": {"total_size": size}, "weight_map": weight_map}
    atomic_write_json(step_dir / INDEX_FILE, index)
    write_marker(step_dir, run_id, version, version=version, bytes=size, files=True)
    prune_steps(rundir.root / WEIGHTS, keep_last, done_upto=version, protect=protect)
