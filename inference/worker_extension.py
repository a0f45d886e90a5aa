"""Methods vLLM adds to each of its workers (`--worker-extension-cls`).

The engine reaches them with `collective_rpc("triad_load_weights", ...)` (from
safetensors files only, never pickle) or `collective_rpc("triad_broadcast_receive",
...)` (from the trainer over a process group of its own, see `shared/broadcast.py`).
Either way the tensors stream into the model runner's in-place reload, which re-runs
each layer's post-load processing.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from shared.digest import digesting, load_cpu_kernel


class SkippedParameters(logging.Handler):
    """Collects the parameters vLLM's in-place reload reports it gave no value."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.names: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        from inference.vllm_api import SKIPPED_MESSAGE

        if SKIPPED_MESSAGE in str(record.msg) and record.args:
            self.names.update(str(name) for name in record.args[0])


@contextmanager
def every_parameter_loaded(what: str) -> Iterator[None]:
    """Fail the reload inside if vLLM reports a parameter of the model that no loaded tensor
    reached: the model would serve a mix of versions (peers saw NaN logits from it)."""
    from inference.vllm_api import SKIPPED_LOGGER

    logger, skipped = logging.getLogger(SKIPPED_LOGGER), SkippedParameters()
    level = logger.level
    # the report is a warning: hear it at any log level. setLevel clears every logger's cache
    # (about a millisecond of each hand-off in vLLM's process), so only where it is needed.
    raised = not logger.isEnabledFor(logging.WARNING)
    if raised:
        logger.setLevel(logging.WARNING)
    logger.addHandler(skipped)
    try:
        yield
    finally:
        logger.removeHandler(skipped)
        if raised:
            logger.setLevel(level)
    if skipped.names:
        names = sorted(skipped.names)
        raise RuntimeError(
            f"loading {what} left {len(names)} parameter(s) of the model without a value: "
            f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''} (publish every parameter)"
        )


class KeptLayersAtDebug(logging.Filter):
    """vLLM's layerwise reload warns of each layer no loaded tensor reached and keeps that
    layer's tensors. A tied `lm_head` (the embedding's tensor) and the rotary embedding's cache
    are such layers at every load: two warnings a version, thousands in a long run, each saying
    a load failed that did not. A parameter a load really missed is the skipped-parameter
    report's, which fails the load (`every_parameter_loaded`); these records go to DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        from inference.vllm_api import LAYER_KEPT_MESSAGE

        if record.msg == LAYER_KEPT_MESSAGE and record.levelno == logging.WARNING:
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return True


def kept_layers_at_debug() -> None:
    from inference.vllm_api import LAYERWISE_LOGGER

    logger = logging.getLogger(LAYERWISE_LOGGER)
    if not any(isinstance(f, KeptLayersAtDebug) for f in logger.filters):
        logger.addFilter(KeptLayersAtDebug())


def iter_safetensors(weights_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(Path(weights_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {weights_dir}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no dict)
                yield name, f.get_tensor(name)


def on_cpu_build() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def refresh_cpu_lm_head(model: torch.nn.Module) -> None:
    """The CPU build keeps a prepacked copy of a tied `lm_head` that the reload does not
    refresh; repack it from the (reloaded) embedding. On the CPU build a head without that
    copy is an unknown vLLM: fail, never serve stale weights."""
    lm_head = getattr(model, "lm_head", None)
    if lm_head is None or not on_cpu_build():
        return
    if not hasattr(lm_head, "cpu_linear"):
        from inference.vllm_api import CPU_REPACK, missing

        raise missing(f"lm_head.cpu_linear on the CPU build ({CPU_REPACK})")
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)


class TriadWorkerExtension:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's."""

    def triad_check_worker(self) -> None:
        """At start-up: every vLLM attribute the weight swap uses is there (`inference.vllm_api`);
        the reload's warnings of kept layers at DEBUG; the digest's kernel loaded."""
        from inference.vllm_api import check_reload_report, check_worker

        check_worker(self, on_cpu_build())
        check_reload_report()
        kept_layers_at_debug()
        # The digest kernel is loaded now rather than in the first load, and the objects it
        # brings (numba's, about 78,000) are frozen with vLLM's start-up heap: unfrozen, the
        # engine's full collections swept them every few seconds, 44-70 ms each.
        load_cpu_kernel()
        gc.freeze()

    def triad_load_weights(self, weights_dir: str | None) -> dict[str, str] | None:
        """Load a published weights directory, or the server's base model (None); returns the
        digest of each tensor read (`shared/digest.py`), None for the base model."""
        digests = None
        if weights_dir is None:
            self.model_runner.reload_weights()
        else:
            digests = {}
            with every_parameter_loaded(weights_dir):
                self.model_runner.reload_weights(
                    weights_iterator=digesting(iter_safetensors(weights_dir), digests)
                )
        refresh_cpu_lm_head(self.model_runner.get_model())
        return digests

    def triad_broadcast_receive(self, spec: dict) -> dict[str, str]:
        """Receive a version from the trainer's broadcast (joining the group's generation if
        new) and stream it into the in-place reload; returns each received tensor's digest."""
        if not hasattr(self, "_triad_receiver"):
            self._triad_receiver = BroadcastReceiver()
        device = next(self.model_runner.get_model().parameters()).device
        local_rank = int(getattr(self, "rank", 0))
        digests: dict[str, str] = {}
        try:
            group = self._triad_receiver.join(spec, local_rank, device)
            received = receive_buckets(group, spec, device)
            with every_parameter_loaded("a broadcast version"):
                self.model_runner.reload_weights(weights_iterator=digesting(received, digests))
        except Exception:
            self._triad_receiver.close_dialer()
            self._triad_receiver = BroadcastReceiver()  # a broken group is never reused
            raise
        refresh_cpu_lm_head(self.model_runner.get_model())
        return digests


class BroadcastReceiver:
    """This worker's membership in the trainer's broadcast group, one generation at a time."""

    def __init__(self) -> None:
        self.generation: int | None = None
        self.group = None
        self.dialer = None

    def close_dialer(self) -> None:
        if self.dialer is not None:
            self.dialer.close()
            self.dialer = None

    def join(self, spec: dict, local_rank: int, device: torch.device):
        if self.generation == spec["generation"]:
            return self.group
        from datetime import timedelta

        from torch.distributed import TCPStore

        from shared.authstore import Dialer
        from shared.process_group import generation_store, make_group

        self.group, self.generation = None, None
        timeout = timedelta(seconds=spec["timeout_s"])
        host, port = spec["host"], spec["port"]
        if spec.get("secret"):
            self.close_dialer()
            self.dialer = Dialer(host, port, bytes.fromhex(spec["secret"]))
            host, port = "127.0.0.1", self.dialer.port
        store = TCPStore(host, port, is_master=False, timeout=timeout)
        store = generation_store(store, spec["generation"])
        rank, size = spec["rank_offset"] + local_rank, spec["world_size"]
        self.group = make_group(store, rank, size, timeout, cuda=device.type == "cuda")
        self.generation = spec["generation"]
        return self.group


def receive_buckets(group, spec: dict, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors as they arrive from rank 0, bucket by bucket, in the order both sides planned."""
    import math

    from shared.broadcast import TensorSpec, plan_buckets

    tensors = [TensorSpec(**t) for t in spec["tensors"]]
    for bucket in plan_buckets(tensors, spec["bucket_bytes"]):
        sizes = [math.prod(tensors[i].shape) for i in bucket]
        flat = torch.empty(sum(sizes), dtype=getattr(torch, tensors[bucket[0]].dtype), device=device)
        group.broadcast(flat, 0).wait()
        for i, chunk in zip(bucket, flat.split(sizes), strict=True):
            yield tensors[i].name, chunk.view(tensors[i].shape)
