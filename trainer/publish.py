"""Publishing a version: by broadcast, or as a Hugging Face directory that vLLM and
transformers load (one safetensors file gathered on rank 0, or one shard per rank).

The collective part, gathering the sharded model on the ranks, is here; what is written and
how is `trainer/versions.py`. `DONE` comes last, and old versions no consumer needs (except
checkpointed ones) are pruned after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from shared.config import TriadConfig
from shared.errors import TriadError
from shared.resume import checkpointed_steps
from shared.rundir import RunDir
from trainer.exported import export_state_dict, published_parameters
from trainer.parallel import full_tensor
from trainer.phases import BROADCAST, GATHER_FOR_PUBLISH, PUBLISH_BARRIER, collective_phase
from trainer.versions import (
    Adapter,
    Metadata,
    VersionWriter,
    finish_version,
    index_shards,
    timed_digests,
    write_version,
)

log = logging.getLogger("triad.trainer")


def gather_published(
    model: torch.nn.Module, tied: bool, dtype: torch.dtype, keep: Callable[[int], bool]
) -> dict[str, torch.Tensor]:
    """The published parameters (`published_parameters`), each gathered whole in turn (a collective
    on every rank) and kept on the CPU in `dtype` where `keep(its index)`, as a copy, never the
    live parameter. One parameter at a time: no full-precision copy of the whole model is held
    (Qwen3-0.6B's shape on 2 CPU ranks: rank 0 rose 1.2 GB while publishing, its bf16 copy,
    against 3.1-4.2 GB for torch's full state dict and then a bf16 copy)."""
    kept = {}
    on_gpu = False
    for i, (name, param) in enumerate(published_parameters(model, tied)):
        full = full_tensor(param)
        if keep(i):
            kept[name] = to_host(full.detach(), dtype)
            on_gpu = on_gpu or full.is_cuda
        del full
    if on_gpu:
        torch.cuda.synchronize()  # the copies into pinned memory were asynchronous
    return kept


def to_host(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous CPU copy of `tensor` in `dtype`. From a GPU, cast there and copied into
    pinned memory without waiting (the caller synchronizes): on an H200 at Qwen3-0.6B's shape,
    0.03 s for the model once torch's pinned-memory cache holds it, against 1.0-1.5 s for a copy
    into pageable memory with the cast on the way (`bench/results/gpu_trainer.md`)."""
    if not tensor.is_cuda:
        return tensor.to("cpu", dtype, copy=True).contiguous()
    host = torch.empty(tensor.shape, dtype=dtype, pin_memory=True)
    host.copy_(tensor.to(dtype), non_blocking=True)
    return host


VLLM_DTYPE_ALIASES = {"half": "float16", "float": "float32"}  # vLLM's `--dtype` names


def served_dtype(inference_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype inference serves: `inference.dtype`, whose `auto` is the model config's dtype
    (`inference/server.py` model_dtype); TriadError for a name vLLM would not take."""
    if inference_dtype == "auto":
        return model_dtype
    name = VLLM_DTYPE_ALIASES.get(inference_dtype, inference_dtype)
    dtype = getattr(torch, name, None)
    if name not in ("bfloat16", "float16", "float32") or not isinstance(dtype, torch.dtype):
        raise TriadError(
            f"inference.dtype = {inference_dtype!r} is not a dtype vLLM serves: "
            "use auto, bfloat16, float16 (half) or float32 (float)"
        )
    return dtype


def published_dtype(choice: str, inference_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """`[weights] dtype`: "auto" is the dtype inference serves (`served_dtype`), so no version
    is rounded on loading; "model" the model config's."""
    if choice == "auto":
        return served_dtype(inference_dtype, model_dtype)
    return model_dtype if choice == "model" else getattr(torch, choice)


@dataclass
class PublishTimes:
    """A publish's phases on this rank, in seconds: gathering the tensors (for a broadcast:
    gathering and sending them), writing the files (digests included), and the digests alone."""

    gather_s: float = 0.0
    write_s: float = 0.0
    digest_s: float = 0.0


class Publisher:
    """Hands each version of the (FSDP2-sharded) model to inference. Collective: every rank
    calls `publish` and `publish_files` together; each returns this rank's `PublishTimes`."""

    def __init__(
        self,
        cfg: TriadConfig,
        rundir: RunDir,
        model: torch.nn.Module,
        tokenizer,
        tied: bool,
        dtype: torch.dtype,
    ) -> None:
        self.wc, self.rundir, self.model, self.tokenizer = cfg.weights, rundir, model, tokenizer
        self.tied, self.dtype = tied, dtype
        self.timeout_s = cfg.trainer.collective_timeout_s
        self.token = cfg.inference.token()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.sender = None
        self.lora = cfg.trainer.lora.enabled
        self.metadata = Metadata(rundir, self.save_metadata)
        self.versions = VersionWriter(rundir, self.metadata, cfg.weights.snapshot_every, cfg.weights.keep)

    def start_broadcasting(self, run_id: str, device: torch.device) -> None:
        if self.wc.transport == "broadcast" and self.lora:
            log.warning("weights.transport = 'broadcast': a LoRA adapter is published as files instead")
        elif self.wc.transport == "broadcast":
            from trainer.broadcast import WeightSender

            self.sender = WeightSender(self.wc.broadcast, self.rundir, run_id, device, self.token)

    def publish(self, version: int, run_id: str, files: bool = False) -> PublishTimes:
        """By broadcast if configured (and it works), else, or when `files`, as safetensors;
        then `DONE`."""
        if self.sender is None:
            return self.publish_files(version, run_id, snapshot=files)
        started = time.monotonic()
        with collective_phase(BROADCAST, self.timeout_s):
            sent = self.sender.send(version, self.model, self.tied, self.dtype)
        # gathered and sent, part by part
        times = PublishTimes(gather_s=time.monotonic() - started, digest_s=self.sender.digest_s)
        if sent is None or files:
            files_times = self.publish_files(version, run_id, snapshot=files)
            files_times.gather_s += times.gather_s
            files_times.digest_s += times.digest_s
            return files_times
        self.versions.base = None  # the next files version is a snapshot
        if self.rank == 0:
            protect = checkpointed_steps(self.rundir, run_id)
            finish_version(self.rundir, run_id, version, 0, sent, self.wc.keep, protect, files=False)
        with collective_phase(PUBLISH_BARRIER, self.timeout_s):
            dist.barrier()
        return times

    def save_metadata(self, directory: Path) -> None:
        self.model.config.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        if self.model.generation_config is not None:
            self.model.generation_config.save_pretrained(directory)

    def publish_files(self, version: int, run_id: str, snapshot: bool = True) -> PublishTimes:
        """Safetensors in the Hugging Face layout: one file gathered on rank 0, or with
        `weights.sharded` one shard per rank (each the parameters it owns) plus an index;
        with LoRA only the adapter. With `weights.snapshot_every` K > 1, a delta from the
        version before unless `snapshot` (a checkpoint), V is a multiple of K, or this process
        has no base."""
        if self.lora:
            return self.publish_adapter(version, run_id)
        if self.wc.sharded:
            return self.publish_shards(version, run_id)
        started = time.monotonic()
        with collective_phase(GATHER_FOR_PUBLISH, self.timeout_s):
            exported = gather_published(self.model, self.tied, self.dtype, lambda i: self.rank == 0)
        times = PublishTimes()
        if self.rank == 0:
            times.gather_s = time.monotonic() - started
            written = self.versions.write(version, run_id, exported, snapshot)
            times.write_s, times.digest_s = written.write_s, written.digest_s
        with collective_phase(PUBLISH_BARRIER, self.timeout_s):
            dist.barrier()
        return times

    def publish_shards(self, version: int, run_id: str) -> PublishTimes:
        """Parameter i is gathered (one at a time) and kept by rank i mod world only; rank 0
        writes the Hugging Face index (which shard holds each tensor) and `DONE` once all are in."""
        names = [n for n, _ in published_parameters(self.model, self.tied)]
        started = time.monotonic()
        with collective_phase(GATHER_FOR_PUBLISH, self.timeout_s):
            mine = gather_published(self.model, self.tied, self.dtype, lambda i: i % self.world == self.rank)
        times = PublishTimes(gather_s=time.monotonic() - started)
        if self.rank == 0:
            self.rundir.weights.clear(version)
            self.metadata.put(version)
        mine_digests, times.digest_s = timed_digests(mine)
        digests: list[dict[str, str]] | None = [{} for _ in range(self.world)] if self.rank == 0 else None
        with collective_phase(PUBLISH_BARRIER, self.timeout_s):
            dist.barrier()
            dist.gather_object(mine_digests, digests, dst=0)
            started = time.monotonic()
            with self.rundir.writing_tensors(version, self.rank, self.world) as tmp:
                save_file(mine, tmp, metadata={"format": "pt"})
            times.write_s = time.monotonic() - started
            dist.barrier()
            if self.rank == 0:
                size = index_shards(self.rundir, version, names, self.world)
                protect = checkpointed_steps(self.rundir, run_id)
                merged = {name: d for part in digests for name, d in part.items()}
                finish_version(self.rundir, run_id, version, size, merged, self.wc.keep, protect)
            dist.barrier()
        return times

    def publish_adapter(self, version: int, run_id: str) -> PublishTimes:
        """The LoRA adapter alone in PEFT's layout (gathered on rank 0), then `DONE` with its digests."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from trainer.lora import adapter_config, adapter_state

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        started = time.monotonic()
        with collective_phase(GATHER_FOR_PUBLISH, self.timeout_s):
            state = get_model_state_dict(self.model, options=options)
        times = PublishTimes()
        if self.rank == 0:
            exported = export_state_dict(adapter_state(self.model, state), False, self.dtype)
            times.gather_s = time.monotonic() - started
            protect = checkpointed_steps(self.rundir, run_id)
            adapter = Adapter(exported, adapter_config(self.model))
            written = write_version(self.rundir, run_id, version, adapter, self.wc.keep, protect)
            times.write_s, times.digest_s = written.write_s, written.digest_s
        with collective_phase(PUBLISH_BARRIER, self.timeout_s):
            dist.barrier()
        return times
