"""Distributed setup and FSDP2. The model code itself knows nothing of this."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from shared.net import free_port
from trainer.forward import attach_kept_logprobs, base_of


def init_distributed(device: str, timeout_s: float) -> tuple[torch.device, DeviceMesh]:
    """Join the torchrun group (or make a one-rank group when started without torchrun)."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        # Before CUDA's first allocation. Without it, Qwen3-0.6B's 64K-token update on an H100
        # ran out of memory as its first update (twice of two runs, when the 18 GiB of kept
        # logits were whole and needed one free block) and fit after shorter ones.
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
        dev = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(dev)
    else:
        dev = torch.device("cpu")
    dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=timeout_s))
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),), mesh_dim_names=("dp",))
    return dev, mesh


def apply_fsdp(
    model: torch.nn.Module,
    mesh: DeviceMesh,
    param_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
) -> None:
    """Shard each decoder block, then the root (embeddings, final norm, head), and register the
    forward's method that runs the head outside the model's own forward (`trainer/forward.py`).

    With one rank and no mixed precision there is nothing for FSDP to do, and its
    per-op DTensor bookkeeping would cost time: the model stays a plain module."""
    if mesh.size() == 1 and param_dtype == reduce_dtype == torch.float32:
        return
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    for block in decoder_blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    attach_kept_logprobs(model)


def full_tensor(param: torch.Tensor) -> torch.Tensor:
    """The whole parameter: gathered from its shards (a collective) if FSDP sharded it."""
    return param.full_tensor() if hasattr(param, "full_tensor") else param


def decoder_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks of a Hugging Face causal LM (or of the one peft wraps)."""
    model = base_of(model)
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: expected decoder blocks at .model.layers")
    return list(layers)
