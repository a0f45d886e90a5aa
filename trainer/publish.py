"""Publishing a version: by broadcast, or as a Hugging Face directory that vLLM and
transformers load (one safetensors file gathered on rank 0, or one shard per rank).

Every path goes through `RunDir`; `DONE` comes last, and old versions no consumer
needs (except checkpointed ones) are pruned after it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from shared.config import TriadConfig
from shared.delta import DeltaMismatch, pack, to_words
from shared.digest import tensor_digest, version_digest
from shared.errors import TriadError
from shared.faults import TRAINER_BEFORE_DELTA_MARKER, failpoint
from shared.resume import checkpointed_steps
from shared.rundir import DeltaFiles, RunDir
from trainer.exported import export_state_dict, published_parameters
from trainer.parallel import full_tensor
from trainer.phases import BROADCAST, GATHER_FOR_PUBLISH, PUBLISH_BARRIER, collective_phase

log = logging.getLogger("triad.trainer")


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


@dataclass(frozen=True)
class DeltaBase:
    """A version this process published as files, kept as the base of the next delta."""

    version: int
    words: dict[str, Any]  # a copy of each tensor's words (`shared/delta.py`): never the live parameters
    digests: dict[str, str]

    @classmethod
    def of(cls, version: int, state: dict[str, torch.Tensor], digests: dict[str, str]) -> DeltaBase:
        return cls(version, {n: to_words(t).copy() for n, t in state.items()}, digests)


def timed_digests(state: dict[str, torch.Tensor]) -> tuple[dict[str, str], float]:
    """Each tensor's digest, and the seconds they took (the `digest_s` metric)."""
    started = time.monotonic()
    digests = {name: tensor_digest(tensor) for name, tensor in state.items()}
    return digests, time.monotonic() - started


def digest_fields(digests: dict[str, str]) -> dict:
    """The weights marker's integrity fields (`shared/digest.py`)."""
    return {"digest": version_digest(digests), "tensor_digests": digests}


class Metadata:
    """A version's metadata files (config, tokenizer, generation config): rendered with
    `save_pretrained` for the first version this process publishes, then linked (copied in an
    object store) from the previous version it published; rendered again if that is gone."""

    def __init__(self, rundir: RunDir, save: Callable[[Path], None]) -> None:
        self.rundir, self.save = rundir, save
        self.names: list[str] = []  # the files `save` writes
        self.last: int | None = None  # the newest version holding them, written by this process

    def put(self, version: int) -> None:
        """The metadata files into `weights/step_V/` (cleared by the caller)."""
        if self.last is not None and self.rundir.weights.copy_files(self.last, version, self.names):
            self.last = version
            return
        with self.rundir.writing_weights_dir(version) as directory:
            self.save(directory)
            self.names = sorted(p.name for p in directory.iterdir() if p.is_file())
        self.last = version


def write_weights(
    rundir: RunDir,
    run_id: str,
    version: int,
    state: dict[str, torch.Tensor],
    metadata: Metadata,
    keep_last: int,
    protect: frozenset[int] = frozenset(),
) -> tuple[float, float, dict[str, str]]:
    """Write `weights/step_V/` (config, tokenizer, safetensors), then its `DONE` with the
    tensors' digests; returns the seconds the writing (digests included) and the digests took,
    and the digests."""
    started = time.monotonic()
    rundir.weights.clear(version)
    metadata.put(version)
    with rundir.writing_tensors(version) as tmp:
        save_file(state, tmp, metadata={"format": "pt"})
    size = rundir.weights.size(version)
    digests, seconds = timed_digests(state)
    written = time.monotonic() - started
    rundir.weights.write_marker(
        version, run_id, version=version, bytes=size, files=True, **digest_fields(digests)
    )
    rundir.weights.prune(keep_last, done_upto=version, protect=protect)
    return written, seconds, digests


def write_delta(
    rundir: RunDir,
    run_id: str,
    version: int,
    state: dict[str, torch.Tensor],
    base: DeltaBase,
    metadata: Metadata,
    keep_last: int,
    protect: frozenset[int] = frozenset(),
) -> tuple[float, float, dict[str, str]]:
    """Write `weights/step_V/` as a delta from `base` (config, tokenizer, the packed difference,
    `shared/delta.py`), then its `DONE` naming the base and its digest beside the new version's
    digests; returns the seconds the writing and the digests took, and the digests.
    `DeltaMismatch` (nothing written) if one delta cannot join the two."""
    started = time.monotonic()
    blob = pack(base.words, {n: to_words(t) for n, t in state.items()})
    rundir.weights.clear(version)
    metadata.put(version)
    with DeltaFiles(rundir.weights).writing(version) as tmp:
        tmp.write_bytes(blob)
    size = rundir.weights.size(version)
    digests, seconds = timed_digests(state)
    written = time.monotonic() - started
    failpoint(TRAINER_BEFORE_DELTA_MARKER, version)
    rundir.weights.write_marker(
        version,
        run_id,
        version=version,
        bytes=size,
        files=True,
        delta_base=base.version,
        base_digest=version_digest(base.digests),
        **digest_fields(digests),
    )
    rundir.weights.prune(keep_last, done_upto=version, protect=protect)
    return written, seconds, digests


def mark_broadcast(
    rundir: RunDir,
    run_id: str,
    version: int,
    keep_last: int,
    protect: frozenset[int],
    digests: dict[str, str],
) -> None:
    """`DONE` for a version that reached inference by broadcast only: no files to load."""
    rundir.weights.write_marker(
        version, run_id, version=version, bytes=0, files=False, **digest_fields(digests)
    )
    rundir.weights.prune(keep_last, done_upto=version, protect=protect)


def finish_shards(
    rundir: RunDir,
    run_id: str,
    version: int,
    names: list[str],
    world: int,
    keep_last: int,
    protect: frozenset[int],
    digests: dict[str, str],
) -> None:
    """The Hugging Face index (which shard holds each tensor), then `DONE`."""
    size = rundir.tensor_bytes(version)
    weight_map = {name: rundir.shard_name(i % world, world) for i, name in enumerate(names)}
    rundir.write_weights_index(version, {"metadata": {"total_size": size}, "weight_map": weight_map})
    rundir.weights.write_marker(
        version, run_id, version=version, bytes=size, files=True, **digest_fields(digests)
    )
    rundir.weights.prune(keep_last, done_upto=version, protect=protect)


class VersionWriter:
    """Rank 0's choice between a full snapshot and a delta for each version published as files
    (`weights.snapshot_every` = K), and the version the next delta starts from."""

    def __init__(self, rundir: RunDir, metadata: Metadata, every: int, keep: int) -> None:
        self.rundir, self.metadata, self.every, self.keep = rundir, metadata, every, keep
        self.base: DeltaBase | None = None  # the last version written
        self.snapshot = 0  # the newest full snapshot

    def delta_base(self, version: int, snapshot: bool) -> DeltaBase | None:
        if snapshot or self.every == 1 or version % self.every == 0:
            return None
        return self.base if self.base is not None and self.base.version == version - 1 else None

    def write(
        self, version: int, run_id: str, exported: dict[str, torch.Tensor], snapshot: bool
    ) -> tuple[float, float]:
        """Version V as a delta from V-1, unless `snapshot` (a checkpoint), V is a multiple of
        K or there is no V-1 to start from; the seconds the writing and the digests took. Kept
        from pruning: checkpointed versions, and the newest snapshot with every delta after it."""
        base = self.delta_base(version, snapshot)
        protect = checkpointed_steps(self.rundir, run_id) | frozenset(range(self.snapshot, version + 1))
        if base is not None:
            try:
                written, digest_s, digests = write_delta(
                    self.rundir, run_id, version, exported, base, self.metadata, self.keep, protect
                )
                self.base = self.next_base(version, exported, digests)
                return written, digest_s
            except DeltaMismatch as e:
                log.warning("version %d: publishing a full snapshot, not a delta: %s", version, e)
        protect = checkpointed_steps(self.rundir, run_id) | frozenset([version])
        written, digest_s, digests = write_weights(
            self.rundir, run_id, version, exported, self.metadata, self.keep, protect
        )
        self.snapshot, self.base = version, self.next_base(version, exported, digests)
        return written, digest_s

    def next_base(
        self, version: int, exported: dict[str, torch.Tensor], digests: dict[str, str]
    ) -> DeltaBase | None:
        """A copy of version V, the base of V+1's delta; none (no second model in memory) when
        V+1 is a full snapshot anyway: deltas off (K = 1), or V+1 a multiple of K."""
        if self.every == 1 or (version + 1) % self.every == 0:
            return None
        return DeltaBase.of(version, exported, digests)


class Publisher:
    """Hands each version of the (FSDP2-sharded) model to inference. Collective: every rank
    calls `publish` and `publish_files` together."""

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
        self.digest_s = 0.0  # of the last publish, on this rank
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.sender = None
        self.lora = cfg.trainer.lora.enabled
        self.metadata = Metadata(rundir, self.save_metadata)
        self.phase_s = {"gather_s": 0.0, "write_s": 0.0}  # of the last publish, on this rank
        self.versions = VersionWriter(rundir, self.metadata, cfg.weights.snapshot_every, cfg.weights.keep)

    def start_broadcasting(self, run_id: str, device: torch.device) -> None:
        if self.wc.transport == "broadcast" and self.lora:
            log.warning("weights.transport = 'broadcast': a LoRA adapter is published as files instead")
        elif self.wc.transport == "broadcast":
            from trainer.broadcast import WeightSender

            self.sender = WeightSender(self.wc.broadcast, self.rundir, run_id, device, self.token)

    def publish(self, version: int, run_id: str, files: bool = False) -> None:
        """By broadcast if configured (and it works), else, or when `files`, as safetensors;
        then `DONE`."""
        sent, self.digest_s = None, 0.0
        self.phase_s = {"gather_s": 0.0, "write_s": 0.0}
        if self.sender is not None:
            started = time.monotonic()
            with collective_phase(BROADCAST, self.timeout_s):
                sent = self.sender.send(version, self.model, self.tied, self.dtype)
            self.digest_s = self.sender.digest_s
            self.phase_s["gather_s"] = time.monotonic() - started  # gathered and sent, part by part
        if sent is not None and not files:
            self.versions.base = None  # the next files version is a snapshot
            if self.rank == 0:
                protect = checkpointed_steps(self.rundir, run_id)
                mark_broadcast(self.rundir, run_id, version, self.wc.keep, protect, sent)
            with collective_phase(PUBLISH_BARRIER, self.timeout_s):
                dist.barrier()
            return
        self.publish_files(version, run_id, snapshot=files)

    def save_metadata(self, directory: Path) -> None:
        self.model.config.save_pretrained(directory)
        self.tokenizer.save_pretrained(directory)
        if self.model.generation_config is not None:
            self.model.generation_config.save_pretrained(directory)

    def publish_files(self, version: int, run_id: str, snapshot: bool = True) -> None:
        """Safetensors in the Hugging Face layout: one file gathered on rank 0, or with
        `weights.sharded` one shard per rank (each the parameters it owns) plus an index;
        with LoRA only the adapter. With `weights.snapshot_every` K > 1, a delta from the
        version before unless `snapshot` (a checkpoint), V is a multiple of K, or this process
        has no base."""
        if self.lora:
            self.publish_adapter(version, run_id)
            return
        if self.wc.sharded:
            self.publish_shards(version, run_id)
            return
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        started = time.monotonic()
        with collective_phase(GATHER_FOR_PUBLISH, self.timeout_s):
            state = get_model_state_dict(self.model, options=options)  # collective: every rank
        if self.rank == 0:
            exported = export_state_dict(state, self.tied, self.dtype)
            self.phase_s["gather_s"] += time.monotonic() - started
            written, digest_s = self.versions.write(version, run_id, exported, snapshot)
            self.phase_s["write_s"] += written
            self.digest_s += digest_s
        with collective_phase(PUBLISH_BARRIER, self.timeout_s):
            dist.barrier()

    def publish_shards(self, version: int, run_id: str) -> None:
        """Parameter i is gathered (one at a time) and kept by rank i mod world only."""
        names = [n for n, _ in published_parameters(self.model, self.tied)]
        mine, started = {}, time.monotonic()
        with collective_phase(GATHER_FOR_PUBLISH, self.timeout_s):
            for i, (name, param) in enumerate(published_parameters(self.model, self.tied)):
                full = full_tensor(param)  # collective
                if i % self.world == self.rank:
                    mine[name] = full.detach().to("cpu", self.dtype).contiguous()
                del full
        self.phase_s["gather_s"] += time.monotonic() - started
        if self.rank == 0:
            self.rundir.weights.clear(version)
            self.metadata.put(version)
        mine_digests, seconds = timed_digests(mine)
        self.digest_s += seconds
        digests: list[dict[str, str]] | None = [{} for _ in range(self.world)] if self.rank == 0 else None
        with collective_phase(PUBLISH_BARRIER, self.timeout_s):
            dist.barrier()
            dist.gather_object(mine_digests, digests, dst=0)
            with self.rundir.writing_tensors(version, self.rank, self.world) as tmp:
                save_file(mine, tmp, metadata={"format": "pt"})
            dist.barrier()
            if self.rank == 0:
                protect = checkpointed_steps(self.rundir, run_id)
                merged = {name: d for part in digests for name, d in part.items()}
                finish_shards(self.rundir, run_id, version, names, self.world, self.wc.keep, protect, merged)
            dist.barrier()

    def publish_adapter(self, version: int, run_id: str) -> None:
        """The LoRA adapter alone in PEFT's layout (gathered on rank 0), then `DONE` with its digests."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from trainer.lora import adapter_config, adapter_state

        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        with collective_phase(GATHER_FOR_PUBLISH, self.timeout_s):
            state = get_model_state_dict(self.model, options=options)
        if self.rank == 0:
            exported = export_state_dict(adapter_state(self.model, state), False, self.dtype)
            protect = checkpointed_steps(self.rundir, run_id)
            self.digest_s += write_adapter(
                self.rundir, run_id, version, exported, adapter_config(self.model), self.wc.keep, protect
            )
        with collective_phase(PUBLISH_BARRIER, self.timeout_s):
            dist.barrier()


def write_adapter(
    rundir: RunDir,
    run_id: str,
    version: int,
    state: dict[str, torch.Tensor],
    config: dict,
    keep_last: int,
    protect: frozenset[int] = frozenset(),
) -> float:
    """Write `weights/step_V/` as a PEFT adapter, then its `DONE` (`adapter: true`) with the
    tensors' digests; returns the seconds the digests took."""
    rundir.weights.clear(version)
    rundir.adapters.write_config(version, config)
    with rundir.adapters.writing(version) as tmp:
        save_file(state, tmp, metadata={"format": "pt"})
    size = rundir.weights.size(version)
    digests, seconds = timed_digests(state)
    rundir.weights.write_marker(
        version, run_id, version=version, bytes=size, files=True, adapter=True, **digest_fields(digests)
    )
    rundir.weights.prune(keep_last, done_upto=version, protect=protect)
    return seconds
