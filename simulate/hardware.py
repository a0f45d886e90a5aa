"""From a GPU and a model size to the per-server decode, prefill and trainer rates.

A decode iteration reads the weights once and each running sequence's KV cache (memory bound,
at `hbm_efficiency` of the HBM bandwidth), and spends `2 * active` FLOPs per sequence plus
`4 * layers * q_heads * head_dim` per token of its context (attention's scores and values; at
`compute_efficiency` of peak), plus `launch_s` of fixed cost (kernel launches, scheduling, sampling).
The trainer's attention is `Trainer.attention` (`attention_width`).
A mixture of experts passes each token through its `active` parameters (FLOPs: decode, prefill,
training) but holds, reads and ships all of them: a batch of dozens of sequences routes to nearly
every expert, so an iteration reads the whole weights, and memory, tensor parallelism and the
weight hand-off are by the total `params`.
These are the assumptions docs/simulate.md tables; each is a field, none is hidden in code. The
HBM efficiency and the trainer's MFU are fitted to a stated run (`bench.simulate_rates`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from shared.errors import TriadError
from simulate.setup import Inference, Trainer

# (layers, KV heads, head dim, query heads): a model's attention, from its config.json
Shape = tuple[int, int, int, int]
# (parameters, shape): the Qwen2.5 / Llama-3 shapes nearest each size
SHAPES: tuple[tuple[float, Shape], ...] = (
    (0.5e9, (24, 2, 64, 14)),
    (1.5e9, (28, 2, 128, 12)),
    (3e9, (36, 2, 128, 16)),
    (7e9, (28, 4, 128, 28)),
    (8e9, (32, 8, 128, 32)),
    (14e9, (48, 8, 128, 40)),
    (32e9, (64, 8, 128, 40)),
    (70e9, (80, 8, 128, 64)),
)


@dataclass(frozen=True)
class Gpu:
    name: str = "H100/H800"
    peak_flops: float = 989e12  # dense bf16
    hbm_bytes_per_s: float = 3.35e12
    memory_bytes: float = 80e9
    # fitted to NeMo-RL v0.3's stated generation time (bench.simulate_rates.fit_v03; a unit test
    # holds these to the fit), with compute_efficiency and launch_s kept as guessed
    hbm_efficiency: float = 0.869
    compute_efficiency: float = 0.5
    launch_s: float = 0.004
    max_seqs: int = 256  # vLLM's max_num_seqs
    # the trainer's (6 N FLOPs per prompt or completion token and attention's, 2 N and its attention
    # more per log-prob pass: `Trainer.train_s`), fitted to NeMo-RL v0.3's stated policy training +
    # get logprobs time (fit_v03)
    mfu: float = 0.4401
    # a trainer step's cost beyond its FLOPs, per parameter held (all of a mixture's experts):
    # none in NeMo-RL v0.3's fit; fitted per system where a source's rows need one (prime-rl's)
    step_s_per_param: float = 0.0
    handoff_bytes_per_s: float = 10e9  # trainer -> servers (filesystem or broadcast), per copy
    load_s: float = 0.5  # a server held while it loads a version (beyond the transfer)

    def on(self, kind: Gpu) -> Gpu:
        """These efficiencies on another kind of GPU: its name, peaks and memory, from its data sheet."""
        return replace(
            self,
            name=kind.name,
            peak_flops=kind.peak_flops,
            hbm_bytes_per_s=kind.hbm_bytes_per_s,
            memory_bytes=kind.memory_bytes,
        )


# NVIDIA's data sheets (dense bf16, HBM bandwidth and size per GPU); each kind takes the fitted
# efficiencies of the rates it runs at (`Gpu.on`)
H20 = Gpu(name="H20", peak_flops=148e12, hbm_bytes_per_s=4.0e12, memory_bytes=96e9)
H200 = Gpu(name="H200", peak_flops=989e12, hbm_bytes_per_s=4.8e12, memory_bytes=141e9)
B200 = Gpu(name="B200", peak_flops=2.25e15, hbm_bytes_per_s=8.0e12, memory_bytes=180e9)
GB200 = Gpu(name="GB200", peak_flops=2.5e15, hbm_bytes_per_s=8.0e12, memory_bytes=186e9)  # NVL72, a GPU


def shape_of(params: float, shape: Shape | None = None) -> Shape:
    """`shape` where the model's is known; else the nearest dense one's."""
    return shape or min(SHAPES, key=lambda s: abs(s[0] - params) / s[0])[1]


def kv_bytes_per_token(params: float, shape: Shape | None = None, tp: int = 1) -> float:
    """A token's K and V (bf16) over a server of `tp` GPUs: with more GPUs than KV heads each GPU
    still holds (and reads) a whole head, so the heads are held `tp / heads` times over."""
    layers, heads, dim, _ = shape_of(params, shape)
    return layers * 2 * max(heads, tp) * dim * 2


def attention_width(params: float, shape: Shape | None = None) -> float:
    """layers x query heads x head dim: a causal sequence of S tokens costs `2 * width * S**2`
    FLOPs of attention in a forward pass (scores and values, each `2 * head_dim` per query head
    and pair of positions, half the pairs masked), as `2 * params * S` in its matrix products."""
    layers, _, dim, q_heads = shape_of(params, shape)
    return float(layers * q_heads * dim)


def tp_for(params: float, gpu: Gpu) -> int:
    """The smallest tensor-parallel degree (1, 2, 4, 8) that leaves half of each GPU for the KV cache."""
    for tp in (1, 2, 4, 8):
        if 2 * params / tp <= gpu.memory_bytes / 2:
            return tp
    return 8


def kv_capacity_tokens(params: float, gpu: Gpu, tp: int, shape: Shape | None = None) -> float:
    """Tokens the KV cache holds on a server: 90% of its memory less the weights (vLLM's default)."""
    return max(0.9 * gpu.memory_bytes * tp - 2 * params, 0.0) / kv_bytes_per_token(params, shape, tp)


def inference_for(
    params: float,
    gpu: Gpu,
    tp: int | None = None,
    mean_context: float = 0.0,
    active: float = 0.0,
    shape: Shape | None = None,
) -> Inference:
    """`mean_context` (prompt and mean completion): running sequences are held to what the KV cache
    holds at that context (vLLM admits no more than fit; the model has no preemption). `active`:
    a mixture of experts' active parameters (0: dense), which set the FLOPs; `params` (all of
    them) set the weights held and read."""
    tp = tp or tp_for(params, gpu)
    flops_params = active or params
    fit = int(kv_capacity_tokens(params, gpu, tp, shape) / mean_context) if mean_context else gpu.max_seqs
    bw = gpu.hbm_bytes_per_s * gpu.hbm_efficiency * tp
    flops_s = gpu.peak_flops * gpu.compute_efficiency * tp
    return Inference(
        iter_base_s=gpu.launch_s + 2 * params / bw,
        iter_per_seq_s=2 * flops_params / flops_s,
        iter_per_kv_token_s=kv_bytes_per_token(params, shape, tp) / bw
        + 4 * attention_width(params, shape) / flops_s,
        max_seqs=max(1, min(gpu.max_seqs, fit)),
        prefill_tokens_per_s=gpu.peak_flops * gpu.compute_efficiency * tp / (2 * flops_params),
        load_s=gpu.load_s,
        tp=tp,
    )


def trainer_for(
    params: float,
    gpu: Gpu,
    colocated: bool = False,
    logprob_passes: int = 0,
    active: float = 0.0,
    shape: Shape | None = None,
    recompute: bool = False,
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
        attention=attention_width(params, shape),
        recompute=recompute,
        step_s_per_param=gpu.step_s_per_param,
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
    flops = running * (2 * params + 4 * attention_width(params) * context_tokens)
    memory_s -= flops / (gpu.peak_flops * gpu.compute_efficiency * tp)
    if memory_s <= 0:
        raise TriadError(
            f"simulate: {tokens_per_s_per_gpu:.0f} tokens/s/GPU at {running} sequences is beyond the "
            f"model's launch and compute costs on {gpu.name}; fit compute_efficiency or launch_s instead"
        )
    read = 2 * params + running * context_tokens * kv_bytes_per_token(params, tp=tp)
    return read / (memory_s * gpu.hbm_bytes_per_s * tp)


def mfu_for(
    training_tokens_per_s_per_gpu: float,
    params: float,
    gpu: Gpu,
    logprob_passes: int = 0,
    attention_per_token: float = 0.0,
) -> float:
    """The trainer MFU that a stated training rate (tokens/s/GPU, the log-prob passes included) gives
    in the model's FLOP count, `Trainer.train_s`'s: (6 + 2 * passes) * (params + attention_per_token)
    per token, `attention_per_token` the attention width times the tokens' mean sequence length
    (sum of S**2 over sum of S)."""
    flops = (6 + 2 * logprob_passes) * (params + attention_per_token)
    return flops * training_tokens_per_s_per_gpu / gpu.peak_flops
