"""Configuration: one TOML file, `TRIAD_` environment variables, `--set` flags.

Top-level keys are shared by all services; `[inference]`, `[orchestrator]` and
`[trainer]` are each read by their own service. Precedence, highest first:
`--set key=value` > `TRIAD_KEY` (tables: `TRIAD_TRAINER__OPTIM__LR`) > TOML > defaults.
Every service validates the whole file, so a typo anywhere is caught early,
and an unknown key is an error that names it.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from shared.errors import TriadError

BUILTIN_MODEL_PREFIX = "builtin:"
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
CPUS_PATTERN = r"^\d+(-\d+)?(,\d+(-\d+)?)*$"
AUTO_OR_CPUS_PATTERN = r"^(auto|\d+(-\d+)?(,\d+(-\d+)?)*)$"


class Table(BaseModel):
    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)  # `--set inference.cpus=0`


class InferenceConfig(Table):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    admin_token: SecretStr | None = None
    admin_token_file: Path | None = Field(None, description="read the admin token from this file (a secret)")
    dtype: str = "auto"
    max_model_len: int | None = Field(None, ge=16, description="None: the model's own limit")
    kv_cache_gib: float = Field(
        1.0, gt=0, description="KV cache size on CPU (vLLM's VLLM_CPU_KVCACHE_SPACE, whole GiB, overrides it)"
    )
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1)
    devices: str | None = Field(None, description="CUDA_VISIBLE_DEVICES for inference under `triad up`")
    cpus: str | None = Field(
        None,
        pattern=AUTO_OR_CPUS_PATTERN,
        description="CPU cores for inference under `triad up`; `auto`: without a GPU, the first half "
        "of this machine's cores (and the rest for the trainer, unless `trainer.cpus` says otherwise)",
    )
    frontend_cpus: str = Field(
        "auto",
        pattern=AUTO_OR_CPUS_PATTERN,
        description="CPU cores vLLM's API server (HTTP, request and output processing, /admin) moves to "
        "once its engine has started; the engine keeps the cores the process started on (triad's "
        'launcher only); auto: under `triad up` with `inference.cpus = "auto"`, the trainer\'s, '
        "else it stays",
    )
    enforce_eager: bool | Literal["auto"] = Field(
        "auto",
        description="vLLM without torch.compile; auto: eager on a CPU build (its compile there "
        "adds ~12 s to every start and made no batch faster; there the sampler's compiled "
        "logprob helper runs as plain torch too, see `inference/server.py` cpu_env), compiled on GPUs",
    )
    vllm_args: list[str] = Field(default_factory=list, description="extra vLLM server flags")
    backend: Literal["auto", "triad", "vllm", "sglang", "none"] = Field(
        "auto",
        description="how servers load new weights: triad (triad's launcher, /admin with its token), "
        "vllm (a stock `vllm serve` with its unauthenticated RL routes, loopback only; `triad "
        "inference` then starts one), sglang, none (the policy stays frozen); auto: ask the server",
    )
    tool_parser: str = Field(
        "auto",
        pattern=r"^[a-z0-9_]+$",
        description="vLLM's tool-call parser (`--tool-call-parser`); auto: by the chat template; none: none",
    )
    reasoning_parser: str = Field(
        "auto",
        pattern=r"^[a-z0-9_]+$",
        description="vLLM's reasoning parser (`--reasoning-parser`); auto: by the chat template; none: none",
    )
    advertise_url: str | None = Field(
        None, description="the URL `--join` registers for the orchestrator; None: http://host:port"
    )
    heartbeat_interval_s: float = Field(
        2, gt=0, description="`--join`: how often the registry record is renewed"
    )
    adapter_idle_s: float = Field(
        1800, gt=0, description="LoRA: a run's adapter with no new version for this long is unloaded"
    )

    def token(self) -> str | None:
        """The admin token, from `admin_token` or `admin_token_file`."""
        if self.admin_token is not None:
            return self.admin_token.get_secret_value()
        if self.admin_token_file is None:
            return None
        try:
            return self.admin_token_file.read_text().strip() or None
        except OSError as e:
            raise TriadError(
                f"cannot read inference.admin_token_file {self.admin_token_file}: {e.strerror}"
            ) from None


class EvalConfig(Table):
    """`[orchestrator.eval]`: held-out evaluation beside training."""

    every: int = Field(0, ge=0, description="evaluate every N steps and at the end; 0: never")
    size: int = Field(32, ge=1, description="held-out prompts per evaluation")
    k: int = Field(4, ge=1, description="samples per prompt: pass@1 and pass@k")


class ShapingConfig(Table):
    """`[orchestrator.shaping]`: from a group's rewards to what it trains on."""

    advantage: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    dynamic_sampling: bool = Field(False, description="drop groups whose rewards are all equal")
    max_filtered_groups: int = Field(64, ge=0, description="per step; then equal-reward groups are kept")
    overlong: Literal["none", "mask", "penalty"] = Field(
        "none", description="truncated samples: train as is, mask out, or DAPO's soft length penalty"
    )
    overlong_buffer: int = Field(8, ge=1, description="penalty ramps over the last N tokens of max_tokens")
    overlong_penalty: float = Field(1.0, ge=0, description="penalty at max_tokens")


class AgentsConfig(Table):
    """`[orchestrator.agents]`: agent environments and the proxy their OpenAI clients call."""

    timeout_s: float = Field(600, gt=0, description="bound on one agent episode")
    proxy_host: str = Field("127.0.0.1", description="where agent environments reach the proxy")
    proxy_port: int = Field(0, ge=0, le=65535, description="the agent proxy's port; 0: any free port")
    proxy_token: SecretStr | None = Field(
        None, description="bearer token the agent proxy requires; needed on an address other than loopback"
    )


class ServersConfig(Table):
    """`[orchestrator.servers]`: the inference servers rollouts go to, and how each is watched."""

    urls: list[str] = Field(
        default_factory=list,
        description="base URLs of the OpenAI-compatible servers; empty: the local [inference] one",
    )
    model_name: str | None = Field(None, description="served model name; None: ask /v1/models")
    adapter_name: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="LoRA runs: the name its adapter is served under (`<name>@v<V>`); None: run-<run_id>",
    )
    ready_timeout_s: float = Field(
        600, gt=0, description="wait for a server to answer: at the start, and while none is healthy"
    )
    request_timeout_s: float = Field(
        120,
        gt=0,
        description="a rollout request fails once no chunk of it came for this long (streamed: a sample's "
        "first token, then every 16; one for at most 16 tokens is answered whole: once no answer came); "
        "also a server whose /health is slow is taken out once no answer or chunk of it came this long",
    )
    max_retries: int = Field(3, ge=0, description="retries of a failed request, on another server")
    retry_backoff_s: float = Field(0.5, ge=0, description="first backoff; doubles per retry")
    max_failures: int = Field(3, ge=1, description="failures in a row that take a server out")
    health_interval_s: float = Field(5, gt=0)
    fleet_poll_s: float = Field(
        2,
        ge=0,
        description="how often to look for servers that joined the run (`triad inference --join`); 0: never",
    )
    heartbeat_timeout_s: float = Field(
        15, gt=0, description="a joined server whose registry record stays unchanged this long is taken out"
    )
    weight_load_timeout_s: float = Field(900, gt=0, description="bound on one server's weight load")


class EnvironmentConfig(Table):
    """`[orchestrator.environment]`: which environment, and the bounds on the code it runs."""

    name: str = Field("addition", description="built-in, entry point in triad.environments, or module:attr")
    args: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the env factory")
    timeout_s: float = Field(60, gt=0, description="bound on one reward, respond or tool call")
    episode_timeout_s: float = Field(
        1800,
        ge=0,
        description="bound on one text or chat episode: past it, it ends truncated (its group is dropped "
        "before its first turn); 0: none",
    )
    threads: int = Field(
        64, ge=1, description="threads for sync rewards, respond, metrics and tools; more calls wait for one"
    )
    max_stuck_calls: int = Field(
        32, ge=1, description="sync rewards, tools, agents left running past their bound; then new calls wait"
    )


class ChatConfig(Table):
    """`[orchestrator.chat]`: chat templates and tool results."""

    text_prompts: bool = Field(
        False, description="send text prompts as a user message with the model's chat template"
    )
    template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="options of the chat template, e.g. {enable_thinking = false}"
    )
    max_tool_result_chars: int = Field(
        8192, ge=1, description="a tool's result is cut to this many characters before the model sees it"
    )


class SamplingConfig(Table):
    """`[orchestrator.sampling]`: how each completion is sampled."""

    max_tokens: int = Field(32, ge=1)
    temperature: float = Field(1.0, gt=0)
    seeded: bool = Field(
        False,
        description="each request's seed derived from the run's `seed` and the request's place in the run "
        "(draw, episode, turn): a rerun on the same weights samples the same tokens; false: the server's "
        "own randomness",
    )


class OrchestratorConfig(Table):
    """`[orchestrator]`: the loop's batch shape and bounds; each concept in a table of its own."""

    batch_size: int = Field(8, ge=1, description="prompts per step")
    group_size: int = Field(4, ge=1, description="completions per prompt")
    max_inflight: int = Field(16, ge=1, description="prompt groups generating at once")
    max_failed_groups: int = Field(
        50, ge=1, description="groups failed in a row (each after every retry) that stop the run"
    )
    partial_groups: bool = Field(
        False, description="a group trains on its finished episodes (at least 2) when the others were dropped"
    )
    weights_stall_s: float = Field(
        900, gt=0, description="waiting for weights: stop once the trainer made no progress this long"
    )
    keep_rollouts: int = Field(4, ge=1, description="rollout step directories kept on disk")
    servers: ServersConfig = Field(default_factory=ServersConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    chat: ChatConfig = Field(default_factory=ChatConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    shaping: ShapingConfig = Field(default_factory=ShapingConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    agents: AgentsConfig = Field(default_factory=AgentsConfig)


LossKind = Literal["ppo_clip", "cispo", "gspo"]
Importance = Literal["none", "tis", "mis_token", "mis_seq"]
Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


class LossConfig(Table):
    """`[trainer.loss]`: the policy-gradient objective (formulas in `trainer/loss.py`)."""

    kind: LossKind = "ppo_clip"
    eps_low: float = Field(0.2, gt=0, description="clip below at 1 - eps_low")
    eps_high: float = Field(0.2, gt=0, description="clip above at 1 + eps_high (DAPO: 0.28)")
    aggregation: Aggregation = "token_mean"
    norm_length: int = Field(1024, ge=1, description="L of seq_mean_token_sum_norm")
    importance: Importance = "none"
    importance_cap: float = Field(2.0, gt=0)
    kl_coef: float = Field(0.0, ge=0, description="weight of the KL penalty (see kl_target)")
    kl_estimator: KLEstimator = "k3"
    kl_target: Literal["sampler", "reference"] = Field(
        "sampler", description="KL to the sampler's policy, or to a frozen copy of the base model"
    )


class OptimConfig(Table):
    """`[trainer.optim]`: AdamW, its schedule and the steps per batch."""

    lr: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine decays to lr * min_lr_ratio")
    max_grad_norm: float = Field(1.0, gt=0)
    optimizer_steps: int = Field(
        1, ge=1, description="optimizer steps per batch, one per equal slice (PPO mini-batches)"
    )


class ParallelConfig(Table):
    """`[trainer.parallel]`: how the model is sharded, batched and run on a device."""

    micro_batch_tokens: int = Field(8192, ge=1, description="tokens per micro-batch (padded, or packed)")
    packing: bool = Field(False, description="pack each micro-batch's samples into one sequence, no padding")
    mixed_precision: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto: bf16 on CUDA")
    activation_checkpointing: bool = False
    compile: bool = Field(False, description="torch.compile each decoder block")
    attention: Literal["sdpa", "flex_attention", "eager"] = Field(
        "sdpa",
        description="transformers' attention implementation; flex_attention masks packed rows sparsely",
    )


class CheckpointConfig(Table):
    """`[trainer.checkpoint]`: DCP checkpoints of model and optimizer."""

    every: int = Field(10, ge=0, description="checkpoint every N updates (and the last); 0: never")
    keep: int = Field(2, ge=1, description="checkpoints kept on disk")


class LoraConfig(Table):
    """`[trainer.lora]`: train a LoRA adapter (peft) instead of every weight; publish only it."""

    rank: int = Field(0, ge=0, description="0: full fine-tuning; else the adapter's rank")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator (scale = alpha / rank)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="names of the linear layers that get an adapter",
    )

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def check_model_config(self, model_config: dict) -> None:
        """What the model's config.json settles before anything starts: an adapter on a tied
        `lm_head` (the trainer checks the loaded model itself, `trainer/lora.py`)."""
        if self.enabled and "lm_head" in self.target_modules and model_config.get("tie_word_embeddings"):
            raise TriadError(TIED_LM_HEAD)


TIED_LM_HEAD = (
    "trainer.lora.target_modules: lm_head shares its weight with the input embeddings in "
    "this model (tie_word_embeddings), so an adapter on it cannot be merged into what was "
    "trained; drop lm_head from the targets or use a model with its own lm_head"
)


class TrainerConfig(Table):
    nproc: int = Field(2, ge=1, description="ranks `triad up` starts under torchrun")
    devices: str | None = Field(None, description="CUDA_VISIBLE_DEVICES for the trainer under `triad up`")
    cpus: str | None = Field(
        None, pattern=CPUS_PATTERN, description="CPU cores for the trainer under `triad up`"
    )
    borrow_cpus: str = Field(
        "auto",
        pattern=AUTO_OR_CPUS_PATTERN,
        description="CPU cores the trainer also runs on while it bounds the step, kept only if its "
        "steps get shorter (`trainer/cores.py`); auto: under `triad up` with `inference.cpus = "
        '"auto"` and `trainer.cpus` unset, inference\'s, else none',
    )
    device: Literal["auto", "cpu", "cuda"] = "auto"
    keep_freed_memory: bool = Field(
        True, description="glibc: freed host memory stays in the process instead of faulting in every step"
    )
    batch_stall_s: float = Field(
        900, gt=0, description="waiting for a batch: stop once the orchestrator made no progress this long"
    )
    collective_timeout_s: float = Field(1800, gt=0, description="longest wait in one collective")
    max_mismatch_kl: float | None = Field(
        1.0, gt=0, description="drift alarm: warn when a step's mismatch_kl exceeds it; inf: off"
    )
    mismatch_kl_steps: int = Field(
        3, ge=1, description="drift alarm: stop after this many such steps in a row"
    )
    optim: OptimConfig = Field(default_factory=OptimConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)


class BroadcastConfig(Table):
    """`[weights.broadcast]`: the process group from trainer rank 0 to the inference workers."""

    host: str = Field("127.0.0.1", description="address inference workers reach trainer rank 0 at")
    port: int = Field(29610, ge=1, le=65535, description="trainer rank 0's TCPStore for broadcasts")
    timeout_s: float = Field(60, gt=0, description="bound on each broadcast step; then files")
    bucket_mb: float = Field(64, gt=0, description="tensors per broadcast call, by dtype")


class WeightsConfig(Table):
    """`[weights]`: how new weights reach inference; read by the trainer and the orchestrator."""

    transport: Literal["filesystem", "broadcast"] = Field(
        "filesystem", description="safetensors files, or a process group"
    )
    keep: int = Field(3, ge=1, description="weight step directories kept on disk")
    sharded: bool = Field(False, description="each trainer rank writes its own shard (large models)")
    dtype: Literal["auto", "model", "bfloat16", "float16", "float32"] = Field(
        "auto", description="published dtype; auto: the dtype inference serves (inference.dtype)"
    )
    snapshot_every: int = Field(
        1, ge=1, description="a full snapshot every K versions and at checkpoints, deltas between (1: none)"
    )
    broadcast: BroadcastConfig = Field(default_factory=BroadcastConfig)


class MetricsConfig(Table):
    tensorboard: bool = Field(
        True, description="event files in run_dir/tensorboard if tensorboard is installed"
    )
    wandb_project: str | None = Field(None, description="log to Weights & Biases under this project")
    wandb_mode: Literal["offline", "online"] = "offline"


class StoreConfig(Table):
    timeout_s: float = Field(
        300.0, gt=0, description="how long each object-store call retries (with backoff) before it fails"
    )
    cache_dir: Path | None = Field(
        None, description="local copies of an object-store run directory (default $TRIAD_CACHE/store)"
    )


class TriadConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="TRIAD_", env_nested_delimiter="__", extra="forbid", toml_file=None
    )

    run_dir: str = Field("runs/default", description="a local path, or s3://bucket/prefix")
    model: str = BUILTIN_MODEL_PREFIX + "tiny-addition"
    model_revision: str | None = Field(
        None, description="a hub id's branch, tag or commit in the Hugging Face cache; None: main"
    )
    max_steps: int = Field(20, ge=1)
    max_async_level: int = Field(1, ge=0)
    seed: int = 0
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    orchestrator: OrchestratorConfig = Field(default_factory=OrchestratorConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls)

    @model_validator(mode="after")
    def _consistent(self) -> TriadConfig:
        for url in self.orchestrator.servers.urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"orchestrator.servers.urls: {url!r} is not an http(s) URL")
        if self.inference.advertise_url and not self.inference.advertise_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                f"inference.advertise_url: {self.inference.advertise_url!r} is not an http(s) URL"
            )
        if self.inference.backend in ("vllm", "sglang") and self.weights.transport == "broadcast":
            raise ValueError(
                f"weights.transport = 'broadcast' needs triad's launcher, not inference.backend = "
                f"{self.inference.backend!r}: use transport 'filesystem'"
            )
        if self.inference.backend in ("vllm", "sglang") and self.inference.frontend_cpus != "auto":
            raise ValueError(
                f"inference.frontend_cpus needs triad's launcher, not inference.backend = "
                f"{self.inference.backend!r}: remove it, or pin the server with taskset"
            )
        environment = self.orchestrator.environment
        if environment.max_stuck_calls > environment.threads:
            raise ValueError(
                f"orchestrator.environment.max_stuck_calls ({environment.max_stuck_calls}) must be at most "
                f"orchestrator.environment.threads ({environment.threads}), the threads they would hold"
            )
        if self.inference.backend in ("vllm", "sglang") and self.weights.snapshot_every > 1:
            raise ValueError(refuse_deltas(self.inference.backend, self.weights.snapshot_every))
        timeout, interval = self.orchestrator.servers.heartbeat_timeout_s, self.inference.heartbeat_interval_s
        if timeout <= 2 * interval:
            raise ValueError(
                f"orchestrator.servers.heartbeat_timeout_s ({timeout:g}) must be more than twice "
                f"inference.heartbeat_interval_s ({interval:g})"
            )
        if self.weights.snapshot_every > 1 and (self.weights.sharded or self.trainer.lora.enabled):
            raise ValueError(
                f"weights.snapshot_every = {self.weights.snapshot_every}: delta versions are published "
                "from full weights gathered on rank 0; set it to 1 with weights.sharded or trainer.lora"
            )
        if self.weights.keep < self.max_async_level + 2:
            raise ValueError(
                f"weights.keep ({self.weights.keep}) must be at least max_async_level + 2 "
                f"({self.max_async_level + 2}): inference may still be loading an older version"
            )
        loss = self.trainer.loss
        if loss.kind != "ppo_clip" and loss.importance != "none":
            raise ValueError(
                f"trainer.loss.importance = {loss.importance!r} needs trainer.loss.kind = 'ppo_clip'"
            )
        samples = self.orchestrator.batch_size * self.orchestrator.group_size
        if self.trainer.optim.optimizer_steps > samples:
            raise ValueError(
                f"trainer.optim.optimizer_steps ({self.trainer.optim.optimizer_steps}) is more than the "
                f"samples in a batch ({samples} = orchestrator.batch_size x group_size)"
            )
        return self

    def inference_urls(self) -> list[str]:
        """Where the orchestrator finds inference; the local server by default."""
        if self.orchestrator.servers.urls:
            return [u.rstrip("/") for u in self.orchestrator.servers.urls]
        host = self.inference.host
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        return [f"http://{host}:{self.inference.port}"]

    def public_dict(self) -> dict[str, Any]:
        """The resolved config without secrets, for run.json."""
        return self.model_dump(mode="json")


def refuse_deltas(backend: str, snapshot_every: int) -> str:
    """Why a server loading weights with `backend` cannot follow a run that publishes deltas."""
    return (
        f"weights.snapshot_every = {snapshot_every} publishes delta versions, which only triad's launcher "
        f"applies, and inference.backend is {backend!r}: set weights.snapshot_every = 1, or use "
        "inference.backend = 'triad'"
    )


def parse_override(item: str) -> tuple[list[str], Any]:
    """`trainer.optim.lr=1e-5` -> (['trainer', 'optim', 'lr'], 1e-05); values are TOML, else strings."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise TriadError(f"--set expects key=value, got {item!r}")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip().split("."), value


def overrides_to_dict(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise TriadError(f"--set {item!r}: {part!r} is not a table")
        node[path[-1]] = value
    return out


def _read_toml(path: Path) -> None:
    try:
        tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise TriadError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise TriadError(f"config file {path} is not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TriadError(f"cannot read config file {path}: {e}; give -c a readable UTF-8 TOML file") from None


def _moved_keys() -> dict[str, str]:
    """Flat keys of earlier versions, and where each lives now (for the error message only)."""
    sections = {"trainer.optim": OptimConfig, "trainer.parallel": ParallelConfig}
    moved = {f"trainer.{k}": f"{where}.{k}" for where, table in sections.items() for k in table.model_fields}
    moved |= {f"trainer.{k}": f"trainer.loss.{k}" for k in LossConfig.model_fields if k != "kind"}
    moved |= {
        "trainer.checkpoint_every": "trainer.checkpoint.every",
        "trainer.keep_checkpoints": "trainer.checkpoint.keep",
        "trainer.keep_weights": "weights.keep",
        "trainer.sharded_publish": "weights.sharded",
        "weight_transport": "weights.transport",
        "trainer.batch_timeout_s": "trainer.batch_stall_s",
        "orchestrator.weights_timeout_s": "orchestrator.weights_stall_s",
    }
    moved |= {f"orchestrator.{k}": f"inference.{k}" for k in ("backend", "tool_parser", "reasoning_parser")}
    moved |= {f"orchestrator.eval_{k}": f"orchestrator.eval.{k}" for k in EvalConfig.model_fields}
    moved |= {f"orchestrator.{k}": f"orchestrator.shaping.{k}" for k in ShapingConfig.model_fields}
    moved |= {f"orchestrator.proxy_{k}": f"orchestrator.agents.proxy_{k}" for k in ("host", "port", "token")}
    moved["orchestrator.agent_timeout_s"] = "orchestrator.agents.timeout_s"
    moved |= {f"orchestrator.{k}": f"orchestrator.{where}" for k, where in ORCHESTRATOR_TABLES.items()}
    moved |= {f"trainer.broadcast_{k}": f"weights.broadcast.{k}" for k in BroadcastConfig.model_fields}
    return moved


# The flat `[orchestrator]` keys of earlier versions, and their tables now.
ORCHESTRATOR_TABLES = {
    "inference_urls": "servers.urls",
    "model_name": "servers.model_name",
    "adapter_name": "servers.adapter_name",
    "inference_timeout_s": "servers.ready_timeout_s",
    "request_timeout_s": "servers.request_timeout_s",
    "max_retries": "servers.max_retries",
    "retry_backoff_s": "servers.retry_backoff_s",
    "max_server_failures": "servers.max_failures",
    "health_interval_s": "servers.health_interval_s",
    "fleet_poll_s": "servers.fleet_poll_s",
    "heartbeat_timeout_s": "servers.heartbeat_timeout_s",
    "weight_load_timeout_s": "servers.weight_load_timeout_s",
    "env": "environment.name",
    "env_args": "environment.args",
    "env_timeout_s": "environment.timeout_s",
    "episode_timeout_s": "environment.episode_timeout_s",
    "env_threads": "environment.threads",
    "max_stuck_calls": "environment.max_stuck_calls",
    "chat": "chat.text_prompts",
    "chat_template_kwargs": "chat.template_kwargs",
    "max_tool_result_chars": "chat.max_tool_result_chars",
    "max_tokens": "sampling.max_tokens",
    "temperature": "sampling.temperature",
}


def _describe(error: dict[str, Any], source: str) -> str:
    key = ".".join(str(p) for p in error["loc"])
    if not key:  # a rule across keys
        return f"bad config: {error['msg'].removeprefix('Value error, ')} ({source})"
    if error["type"] == "extra_forbidden":
        moved = _moved_keys().get(key)
        if moved:
            return f"config key {key!r} is now {moved!r} ({source})"
        return f"unknown config key {key!r} ({source})"
    if error["type"] == "model_type":
        moved = _moved_keys().get(key)
        hint = f"; its value of earlier versions is now {moved!r}" if moved else ""
        if key == "trainer.loss":
            hint = "; the objective is trainer.loss.kind"
        return f"config key {key!r} is a table [{key}], not a value{hint} ({source})"
    return f"bad config value for {key!r}: {error['msg']} (got {error.get('input')!r}; {source})"


def _check_environment() -> None:
    """A `TRIAD_*` variable of a key that moved would be ignored silently: name it."""
    moved = _moved_keys()
    for name in os.environ:
        key = name.removeprefix("TRIAD_").lower().replace("__", ".")
        if name.startswith("TRIAD_") and key in moved:
            now = "TRIAD_" + moved[key].upper().replace(".", "__")
            raise TriadError(f"environment variable {name} sets {key!r}, which is now {moved[key]!r} ({now})")


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> TriadConfig:
    """Resolve the config; raise TriadError naming the first bad key."""
    _check_environment()
    cls = TriadConfig
    if path is not None:
        _read_toml(path)
        cls = type(
            "TriadConfig", (TriadConfig,), {"model_config": {**TriadConfig.model_config, "toml_file": path}}
        )
    source = f"from {path}, TRIAD_* variables or --set" if path else "from TRIAD_* variables or --set"
    try:
        return cls(**overrides_to_dict(overrides or []))
    except ValidationError as e:
        raise TriadError(_describe(e.errors()[0], source)) from None
    except SettingsError as e:  # a TRIAD_* list or table that is not JSON
        raise TriadError(f"{e} (a TRIAD_* variable's lists and tables are written as JSON)") from None
