"""A vLLM weight-transfer engine that reads a published version's safetensors from disk.

A stock `vllm serve` (with `VLLM_SERVER_DEV_MODE=1` for its RL routes) finds it through
vLLM's plugin entry points: pyproject's `[project.entry-points."vllm.general_plugins"]`
names `register`, which adds the engine to `WeightTransferEngineFactory` as `triad_disk`;
the server selects it with `--weight-transfer-config '{"backend": "triad_disk"}'`.

vLLM's own engines (nccl, ipc) need a GPU; this one works on any build, and its
update is one call: `POST /update_weights {"update_info": {"path": <weights dir>}}`
between `/start_weight_update` and `/finish_weight_update`, which run vLLM's layerwise
reload (each layer's post-load processing re-runs). `"path": null` reloads the base model.
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm.distributed.weight_transfer import WeightTransferEngineFactory
from vllm.distributed.weight_transfer.base import WeightTransferEngine
from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

from inference.worker_extension import iter_safetensors, refresh_cpu_lm_head

ENGINE_NAME = "triad_disk"


def register() -> None:
    """vLLM calls this in every process it starts (it may call it more than once)."""
    if ENGINE_NAME not in WeightTransferEngineFactory._registry:  # registering twice raises
        WeightTransferEngineFactory.register_engine(ENGINE_NAME, __name__, "DiskWeightTransferEngine")


@dataclass
class DiskInitInfo:
    pass


@dataclass
class DiskUpdateInfo:
    path: str | None = None  # a directory of .safetensors files; None: the served base model


class DiskWeightTransferEngine(WeightTransferEngine[DiskInitInfo, DiskUpdateInfo]):
    init_info_cls = DiskInitInfo
    update_info_cls = DiskUpdateInfo
    supports_draft_weight_update = False

    def init_transfer_engine(self, init_info: DiskInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: DiskUpdateInfo) -> None:
        self.model.load_weights(iter_safetensors(update_info.path or self.model_config.model))

    def update_weights(self, update_info: dict) -> None:
        """Synchronous: nothing to wait for. If it fails, vLLM's worker ends the session and no
        finish follows: the reload is finalized here, so that no layer stays on the meta device and
        the next session starts afresh (a layer not loaded gets its tensors back; one half-loaded
        holds a mix until the orchestrator's backend reloads a whole version, as it does next)."""
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            finalize_layerwise_reload(self.model, self.model_config)
            raise

    def finish_weight_update(self) -> None:
        finalize_layerwise_reload(self.model, self.model_config)
        refresh_cpu_lm_head(self.model)

    def shutdown(self) -> None:
        pass
