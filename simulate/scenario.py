"""A Setup from a few numbers (GPUs, model size, lengths, batch), as `triad simulate --gpus` and
the published checks give them. Length distributions are a shared assumption where a source
states none: a capped lognormal with mean `mean_fraction` of `max_tokens` (or `mean_tokens` where
the source states the mean) and `truncated` of the samples at the cap. `logprob_passes` is the
modelled system's: forward passes its trainer makes to recompute log-probabilities. A mixture of
experts gives `active_params` (0: dense); `shape` (layers, KV heads, head dim, query heads) is the
model's attention where known (None: the nearest dense one's), for its KV cache and its attention
FLOPs; `recompute`, a trainer that recomputes activations in its backward pass, where a source
states it; `tp`, a server's GPUs where a source states them (0: the smallest that leaves half a GPU
for the KV cache)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import TriadError
from simulate.calibrate import fit_lengths
from simulate.hardware import Gpu, Shape, inference_for, tp_for, trainer_for
from simulate.setup import Lengths, Setup


@dataclass(frozen=True)
class Scenario:
    gpus: int
    params: float
    max_tokens: int
    batch_prompts: int = 512
    group_size: int = 16
    prompt_tokens: int = 512
    mean_fraction: float = 0.35
    truncated: float = 0.05
    steps: int = 40
    gpu: Gpu = Gpu()
    mean_tokens: float | None = None
    logprob_passes: int = 0
    active_params: float = 0.0
    shape: Shape | None = None
    tp: int = 0
    recompute: bool = False

    def server_gpus(self) -> int:
        return self.tp or tp_for(self.params, self.gpu)

    def lengths(self) -> Lengths:
        mean = self.mean_tokens or self.mean_fraction * self.max_tokens
        return fit_lengths(mean, self.truncated, self.max_tokens)

    def colocated_sync(self, lengths: Lengths | None = None) -> Setup:
        """A synchronous system on one pool (verl's default): all GPUs generate, then all train."""
        tp = self.server_gpus()
        return self.setup(self.gpus // tp, self.gpus, 0, "keep", self.batch_prompts, lengths, colocated=True)

    def split(
        self,
        inference_gpus: int,
        eta: int,
        mode: str = "keep",
        lengths: Lengths | None = None,
        inflight: int | None = None,
    ) -> Setup:
        """triad's layout: `inference_gpus` serve, the rest train; `inflight` groups (default: a batch
        for each version the guard lets run ahead)."""
        tp = self.server_gpus()
        if not tp <= inference_gpus < self.gpus:
            raise TriadError(
                f"simulate: {inference_gpus} inference GPUs of {self.gpus} leaves no trainer or server"
            )
        inflight = inflight or self.batch_prompts * (eta + 1)
        return self.setup(inference_gpus // tp, self.gpus - inference_gpus, eta, mode, inflight, lengths)

    def setup(
        self,
        servers: int,
        train_gpus: int,
        eta: int,
        mode: str,
        inflight: int,
        lengths: Lengths | None,
        colocated: bool = False,
    ) -> Setup:
        lengths = lengths or self.lengths()
        context = self.prompt_tokens + lengths.mean(4000)
        return Setup(
            servers=servers,
            train_gpus=train_gpus,
            inference=inference_for(
                self.params, self.gpu, self.server_gpus(), context, self.active_params, self.shape
            ),
            trainer=trainer_for(
                self.params,
                self.gpu,
                colocated,
                self.logprob_passes,
                self.active_params,
                self.shape,
                self.recompute,
            ),
            lengths=lengths,
            prompt_tokens=self.prompt_tokens,
            batch_size=self.batch_prompts,
            group_size=self.group_size,
            max_inflight=inflight,
            max_async_level=eta,
            max_steps=self.steps,
            mode=mode,
            batch_overhead_s=0.5,
            colocated=colocated,
        )
