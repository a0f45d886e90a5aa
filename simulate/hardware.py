"""From a GPU and a model size to the per-server decode, prefill and trainer rates.

A decode iteration reads the weights once and each running sequence's KV cache (memory bound,
at `hbm_efficiency` of the HBM bandwidth), and spends `2 * active` FLOPs per sequence (at
`compute_efficiency` of peak), plus `launch_s` of fixed cost (kernel launches, scheduling, sampling).
A mixture of experts passes each token through its `active` parameters (FLOPs: decode, prefill,
training) but holds, reads and ships all of them: a batch of dozens of sequences routes to nearly
every expert, so an iteration reads the whole weights, and memory, tensor parallelism and the
weight hand-off are by the total `params`.
These are the assumptions docs/simulate.md tables; each is a field, none is hidden in code. The
HBM efficiency and the trainer's MFU are fitted to a stated run (`bench.simulate_rates`)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import TriadError
from simulate.setup import Inference, Trainer

# (parameters, layers, KV heads, head dim): the Qwen2.5 / Llama-3 shapes nearest each size
SHAPES = (
    (0.5e9, 24, 2, 64),
    (1.5e9, 28, 2, 128),
    (3e9, 36, 2, 128),
    (7e9, 28, 4, 128),
    (8e9, 32, 8, 128),
    (14e9, 48, 8, 128),
    (32e9, 64, 8, 128),
    (70e9, 80, 8, 128),
)


@dataclass(frozen=True)
class Gpu:
    name: str = "H100/H800"
    peak_flops: float = 989e12  # dense bf16
    hbm_bytes_per_s: float = 3.35e12
    memory_bytes: float = 80e9
    # fitted to NeMo-RL v0.3's stated generation time (bench.simulate_rates.fit_v03; a unit test
    # holds these to the fit), with compute_efficiency and launch_s kept as guessed
    hbm_efficiency: float = 0.861
    compute_efficiency: float = 0.5
    launch_s: float = 0.004
    max_seqs: int = 256  # vLLM's max_num_seqs
    # the trainer's (6 N FLOPs per prompt or completion token, 2 N more per log-prob pass), fitted to
    # NeMo-RL v0.3's stated policy training + get logprobs time (fit_v03)
    mfu: float = 0.3405
    handoff_bytes_per_s: float = 10e9  # trainer -> servers (filesystem or broadcast), per copy
    load_s: float = 0.5  # a server held while it loads a version (beyond the transfer)


H20 = Gpu(name="H20", peak_flops=148e12, hbm_bytes_per_s=4.0e12, memory_bytes=96e9)  # NVIDIA's data sheet


def kv_bytes_per_token(params: float, shape: tuple[int, int, int] | None = None) -> float:
    """`shape` (layers, KV heads, head dim) where the model's is known; else the nearest dense one's."""
    layers, heads, dim = shape or min(SHAPES, key=lambda s: abs(s[0] - params) / s[0])[1:]
    return layers * 2 * heads * dim * 2  # K and V, bf16


def tp_for(params: float, gpu: Gpu) -> int:
    """The smallest tensor-parallel degree (1, 2, 4, 8) that leaves half of each GPU for the KV cache."""
    for tp in (1, 2, 4, 8):
        if 2 * params / tp <= gpu.memory_bytes / 2:
            return tp
    return 8


def kv_capacity_tokens(params: float, gpu: Gpu, tp: int, shape: tuple[int, int, int] | None = None) -> float:
    """Tokens the KV cache holds on a server: 90% of its memory less the weights (vLLM's default)."""
    return max(0.9 * gpu.memory_bytes * tp - 2 * params, 0.0) / kv_bytes_per_token(params, shape)


def inference_for(
    params: float,
    gpu: Gpu,
    tp: int | None = None,
    mean_context: float = 0.0,
    active: float = 0.0,
    shape: tuple[int, int, int] | None = None,
) -> Inference:
    """`mean_context` (prompt and mean completion): running sequences are held to what the KV cache
    holds at that context (vLLM admits no more than fit; the model has no preemption). `active`:
    a mixture of experts' active parameters (0: dense), which set the FLOPs; `params` (all of
    them) set the weights held and read."""
    tp = tp or tp_for(params, gpu)
    flops_params = active or params
    fit = int(kv_capacity_tokens(params, gpu, tp, shape) / mean_context) if mean_context else gpu.max_seqs
    bw = gpu.hbm_bytes_per_s * gpu.hbm_efficiency * tp
    return Inference(
        iter_base_s=gpu.launch_s + 2 * params / bw,
        iter_per_seq_s=2 * flops_params / (gpu.peak_flops * gpu.compute_efficiency * tp),
        iter_per_kv_token_s=kv_bytes_per_token(params, shape) / bw,
        max_seqs=max(1, min(gpu.max_seqs, fit)),
        prefill_tokens_per_s=gpu.peak_flops * gpu.compute_efficiency * tp / (2 * flops_params),
        load_s=gpu.load_s,
        tp=tp,
    )


def trainer_for(
    params: float, gpu: Gpu, colocated: bool = False, logprob_passes: int = 0, active: float = 0.0
) -> Trainer:
    """Colocated (one pool of GPUs takes turns) reshards in memory: no transfer to pay."""
    return Trainer(
        params=params,
        peak_flops=gpu.peak_flops,
        mfu=gpu.mfu,
        overhead_s=1.0,
        handoff_bytes_per_s=1e15 if colocated else gpu.handoff_bytes_per_s,
        publish_overhead_s=0.5,
        logprob_passes=logprob_passes,
        active_params=active,
    )


def decode_tokens_per_s_per_gpu(
    params: float, gpu: Gpu, running: int, context_tokens: float, tp: int = 0
) -> float:
    """The model's steady decode rate of one server: `running` sequences, each holding
    `context_tokens` of KV cache, a token each per iteration, over the server's GPUs."""
    tp = tp or tp_for(params, gpu)
    inf = inference_for(params, gpu, tp)
    iteration = (
        inf.iter_base_s + inf.iter_per_seq_s * running + inf.iter_per_kv_token_s * running * context_tokens
    )
    return running / (iteration * tp)


def hbm_efficiency_for(
    tokens_per_s_per_gpu: float, params: float, gpu: Gpu, running: int, context_tokens: float, tp: int = 0
) -> float:
    """The `hbm_efficiency` at which `decode_tokens_per_s_per_gpu` is a stated decode rate, the
    other efficiencies kept: the inverse of the iteration time for that batch and context."""
    tp = tp or tp_for(params, gpu)
    memory_s = running / (tokens_per_s_per_gpu * tp) - gpu.launch_s
    memory_s -= running * 2 * params / (gpu.peak_flops * gpu.compute_efficiency * tp)
    if memory_s <= 0:
        raise TriadError(
            f"simulate: {tokens_per_s_per_gpu:.0f} tokens/s/GPU at {running} sequences is beyond the "
            f"model's launch and compute costs on {gpu.name}; fit compute_efficiency or launch_s instead"
        )
    read = 2 * params + running * context_tokens * kv_bytes_per_token(params)
    return read / (memory_s * gpu.hbm_bytes_per_s * tp)


def mfu_for(training_tokens_per_s_per_gpu: float, params: float, gpu: Gpu, logprob_passes: int = 0) -> float:
    """The trainer MFU that a stated training rate (tokens/s/GPU, the log-prob passes included) gives
    in the model's FLOP count: (6 + 2 * passes) * params per token."""
    return (6 + 2 * logprob_passes) * params * training_tokens_per_s_per_gpu / gpu.peak_flops
