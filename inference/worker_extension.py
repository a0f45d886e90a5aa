"""Methods vLLM adds to each of its workers (`--worker-extension-cls`).

The engine reaches them with `collective_rpc("triad_load_weights", ...)`.
Weights are read from safetensors only (never pickle) and reloaded in place
through the model runner, which re-runs each layer's post-load processing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch


def iter_safetensors(weights_dir: str) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    files = sorted(Path(weights_dir).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {weights_dir}")
    for file in files:
        with safe_open(file, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open is no dict)
                yield name, f.get_tensor(name)


class TriadWorkerExtension:
    """Mixed into vLLM's worker class; `self.model_runner` is the worker's."""

    def triad_load_weights(self, weights_dir: str | None) -> None:
        """Load a published weights directory, or the server's base model (None)."""
        if weights_dir is None:
            self.model_runner.reload_weights()
        else:
            self.model_runner.reload_weights(weights_iterator=iter_safetensors(weights_dir))
        self._refresh_cpu_lm_head()

    def _refresh_cpu_lm_head(self) -> None:
        """The CPU build keeps a prepacked copy of a tied `lm_head` that the
        reload does not refresh; repack it from the (reloaded) embedding."""
        lm_head = getattr(self.model_runner.get_model(), "lm_head", None)
        if lm_head is None or not hasattr(lm_head, "cpu_linear"):
            return
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)
