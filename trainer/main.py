"""The trainer: one update per batch, new weights after each.

    torchrun --nproc-per-node 2 -m services.cli trainer -c config.toml

For update n = 1..max_steps every rank waits for `rollouts/step_n/DONE` and
reads the batch. The batch is cut into `optimizer_steps` slices (PPO
mini-batches, usually one); each rank takes a token-balanced share of each
slice, in micro-batches of at most `micro_batch_tokens`. With importance
correction and several slices, a no-grad forward pass first records the
proximal policy's logprobs (AReaL's decoupled PPO: the weights before this
update). Per slice, the policy-gradient loss of `trainer/loss.py` is taken
against the sampler's logprobs (logits divided by the batch's sampling
temperature), optionally with a KL penalty to a frozen reference model, and
AdamW steps the FSDP2-sharded model after gradient clipping. Rank 0 then
publishes the full weights as version n in `weights/step_n/` (safetensors plus
config and tokenizer) with a `DONE` marker, which the orchestrator hands to
inference; checkpoints are written every `trainer.checkpoint.every` updates.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from shared.batch import batch_temperature, load_batch_reader, read_batch_rows, wait_for_batch_marker
from shared.config import TriadConfig
from shared.digest import load_cpu_kernel
from shared.faults import TRAINER_MID_STEP, failpoint
from shared.heap import started
from shared.liveness import Lease, PeerWatch, Progress
from shared.metrics import MetricsWriter
from shared.resume import discard_after_checkpoint, newest_checkpoint
from shared.rundir import ORCHESTRATOR, TRAINER, Marker, RunDir
from shared.watch import DirWatch
from trainer.checkpoint import load_checkpoint, save_checkpoint
from trainer.cores import StepTimes, core_borrowing
from trainer.data import balance, collate, even_slices, loss_token_count, micro_batches
from trainer.drift import DriftAlarm, batch_servers
from trainer.forward import PLAIN_HEAD_TYPES, Forward, base_of, has_plain_head, packed_forward, padded_forward
from trainer.host import keep_freed_memory
from trainer.loss import BatchTotals, policy_loss
from trainer.parallel import apply_fsdp, decoder_blocks, full_tensor, init_distributed
from trainer.phases import CHECKPOINT, RESUME, STEP_STATS, TRAIN, collective_phase
from trainer.publish import Publisher, PublishTimes, published_dtype
from trainer.schedule import lr_at

log = logging.getLogger("triad.trainer")

# per micro-batch, summed: loss share, clipped below, clipped above, mismatch KL, entropy, reference KL
STAT_NAMES = ("loss", "clipped_low", "clipped_high", "mismatch_kl", "entropy", "ref_kl")


@dataclass(frozen=True)
class Slice:
    """One optimizer step's part of the batch: this rank's micro-batches, the slice's totals and,
    for the decoupled objective, each micro-batch's proximal logprobs."""

    micro_batches: list[list[dict]]
    totals: BatchTotals
    proximal: list[torch.Tensor] | None = None

    def with_proximal(self, logprobs_of) -> Slice:
        return replace(self, proximal=[logprobs_of(rows) for rows in self.micro_batches])


def clipped_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float, step: int
) -> float:
    """Clip the gradients, take the optimizer step and clear them; the global gradient norm. A step
    whose norm is NaN or infinite is skipped (every rank sees the same norm, so all skip): it would
    make every weight NaN from here on."""
    grad_norm = float(full_tensor(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
    if math.isfinite(grad_norm):
        optimizer.step()
    else:
        log.warning("step %d: gradient norm %s: this optimizer step is skipped", step, grad_norm)
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def step_metrics(
    sums: dict[str, float], rows: list[dict], grad_norms: list[float], mismatch_tokens: int
) -> dict[str, float]:
    """An update's metrics row from the statistics summed over all ranks and slices: the loss is
    the mean of the slices' losses, the rest are per loss token; `mismatch_kl` per token of the
    slices it was measured on (`mismatch_tokens`)."""
    tokens = max(loss_token_count(rows), 1)
    return dict(
        loss=sums["loss"] / len(grad_norms),
        grad_norm=sum(grad_norms) / len(grad_norms),
        optimizer_steps=len(grad_norms),
        optimizer_steps_skipped=sum(not math.isfinite(g) for g in grad_norms),
        tokens=sum(len(r["input_ids"]) for r in rows),
        loss_tokens=loss_token_count(rows),
        clip_frac=(sums["clipped_low"] + sums["clipped_high"]) / tokens,
        clip_frac_low=sums["clipped_low"] / tokens,
        clip_frac_high=sums["clipped_high"] / tokens,
        mismatch_kl=sums["mismatch_kl"] / max(mismatch_tokens, 1),
        entropy=sums["entropy"] / tokens,
        ref_kl=sums["ref_kl"] / tokens,
    )


def step_phases(
    t0: float, t_read: float, t1: float, t2: float, t3: float, optimizer_s: float, publish: PublishTimes
) -> dict[str, float]:
    """An update's phase times (seconds) from its clock readings: waiting for the batch's
    marker (t0..t_read), reading it (..t1), training (..t2: forward/backward, then clipping and
    optimizer steps), publishing (..t3: gathering, writing, then `DONE`, pruning and the
    barrier as `mark_s`). `train_s` and `publish_s` are the sums of their parts."""
    train_s, publish_s = t2 - t1, t3 - t2
    mark_s = max(publish_s - publish.gather_s - publish.write_s, 0.0)
    return dict(
        wait_s=t_read - t0,
        read_s=t1 - t_read,
        train_s=train_s,
        publish_s=publish_s,
        forward_backward_s=max(train_s - optimizer_s, 0.0),
        optimizer_s=optimizer_s,
        gather_s=publish.gather_s,
        write_s=publish.write_s,
        mark_s=mark_s,
    )


def compute_dtype(precision: str, device: torch.device) -> torch.dtype:
    if precision == "auto":
        precision = "bf16" if device.type == "cuda" else "fp32"
    return torch.bfloat16 if precision == "bf16" else torch.float32


def await_batch(
    rundir: RunDir,
    step: int,
    run_id: str,
    batches: DirWatch | None,
    orchestrator: PeerWatch,
    progress: Progress,
) -> Marker:
    """Batch `step`'s marker, waited for as long as the orchestrator makes progress."""
    progress.set(step=step, updates=step - 1, phase="waiting for its batch")
    marker = wait_for_batch_marker(rundir, step, run_id, None, batches, orchestrator)
    progress.set(phase="training")
    return marker


def config_dtype(config) -> torch.dtype:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def load_policy(tc, model_path: str, device: torch.device, mesh, dtype: torch.dtype) -> torch.nn.Module:
    """The model to train, on `device`: LoRA-wrapped if configured, with activation checkpointing
    and compiled blocks as configured, sharded by FSDP2 (`tc`: the `[trainer]` section)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation=tc.parallel.attention
    )
    model = model.to(device)
    if tc.lora.enabled:  # before sharding: FSDP2 then shards the adapters with their blocks
        from trainer.lora import wrap_lora

        model = wrap_lora(model, tc.lora)
    if tc.parallel.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if tc.parallel.compile:
        for block in decoder_blocks(model):
            block.compile()
    apply_fsdp(model, mesh, param_dtype=dtype, reduce_dtype=torch.float32)
    if not has_plain_head(model):
        log.info(
            "model type %r is not one of %s: its output layer runs in its own forward, and the logits of "
            "every position that predicts a loss token are held at once (more memory on long micro-batches)",
            base_of(model).config.model_type,
            ", ".join(sorted(PLAIN_HEAD_TYPES)),
        )
    return model


def load_reference(
    model_path: str, device: torch.device, mesh, dtype: torch.dtype, attention: str
) -> torch.nn.Module:
    """A frozen copy of the base model (the KL reference), sharded as the policy is."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation=attention
    )
    reference = reference.to(device)
    reference.requires_grad_(False).eval()
    apply_fsdp(reference, mesh, param_dtype=dtype, reduce_dtype=torch.float32)
    return reference


def build_optimizer(model: torch.nn.Module, optim) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (`optim`: the `[trainer.optim]` section). Fused: one
    kernel a parameter on CPU and CUDA, where the default is a loop of tensor ops (CPU) or foreach
    ops whose temporaries are the size of the moments (CUDA)."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        fused=True,
    )


def report_step(
    metrics: MetricsWriter, step: int, stats: dict[str, float], phases: dict[str, float], digest_s: float
) -> None:
    """The update's row in the trainer's metrics and its line in the log."""
    metrics.log(step, **stats, **phases, digest_s=digest_s, cores=len(os.sched_getaffinity(0)))
    log.info(
        "step %d: loss %.4f, grad norm %.3f, mismatch KL %.2e, %.2fs train, %.2fs publish",
        step,
        stats["loss"],
        stats["grad_norm"],
        stats["mismatch_kl"],
        phases["train_s"],
        phases["publish_s"],
    )


class Trainer:
    def __init__(
        self, cfg: TriadConfig, model_path: str, device: torch.device, mesh, progress: Progress
    ) -> None:
        from transformers import AutoConfig, AutoTokenizer

        self.cfg, self.tc = cfg, cfg.trainer
        self.optim, self.loss, self.parallel = cfg.trainer.optim, cfg.trainer.loss, cfg.trainer.parallel
        self.device = device
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.rundir = RunDir.of(cfg)
        self.progress = progress  # published by rank 0's lease (`shared/liveness.py`)
        hf_config = AutoConfig.from_pretrained(model_path)
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        torch.manual_seed(cfg.seed)
        compute = compute_dtype(self.parallel.mixed_precision, device)
        self.model = load_policy(self.tc, model_path, device, mesh, compute)
        self.reference = None
        if self.loss.kl_target == "reference":
            # loaded once the policy is sharded: two full copies at once need not fit on a device
            self.reference = load_reference(model_path, device, mesh, compute, self.parallel.attention)
        self.optimizer = build_optimizer(self.model, self.optim)
        self.metrics = self.rundir.metrics.writer(TRAINER) if self.rank == 0 else None
        self.optimizer_s = 0.0  # of the current update: clipping and optimizer steps
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        dtype = published_dtype(cfg.weights.dtype, cfg.inference.dtype, config_dtype(hf_config))
        self.publisher = Publisher(cfg, self.rundir, self.model, tokenizer, tied, dtype)
        self.borrower = core_borrowing(
            self.tc.borrow_cpus, torch.get_num_threads(), self.tc.collective_timeout_s
        )

    @property
    def forward(self) -> Forward:
        return packed_forward if self.parallel.packing else padded_forward

    def uses_proximal_policy(self) -> bool:
        """AReaL's proximal logprobs differ from the current weights' only after a first
        optimizer step on the batch, and only the decoupled (importance) objective uses them."""
        return (
            self.optim.optimizer_steps > 1 and self.loss.kind == "ppo_clip" and self.loss.importance != "none"
        )

    def plan(self, rows: list[dict]) -> Slice:
        """This rank's token-balanced share of `rows`, in micro-batches (the same count on every rank)."""
        lengths = [len(r["input_ids"]) for r in rows]
        shares = balance(lengths, self.world)
        plan = micro_batches(lengths, shares, self.parallel.micro_batch_tokens, self.parallel.packing)[
            self.rank
        ]
        totals = BatchTotals(sequences=len(rows), tokens=loss_token_count(rows))
        return Slice([[rows[i] for i in mb] for mb in plan], totals)

    @torch.no_grad()
    def logprobs_of(self, model: torch.nn.Module, rows: list[dict], temperature: float) -> torch.Tensor:
        batch = collate(rows, self.pad_id).to(self.device)
        return self.forward(model, batch, temperature, with_entropy=False)[0]

    def forward_backward(
        self, rows: list[dict], temperature: float, totals: BatchTotals, proximal: torch.Tensor | None
    ) -> torch.Tensor:
        """One micro-batch: its share of the slice's loss, backpropagated; returns its statistics."""
        batch = collate(rows, self.pad_id).to(self.device)
        reference = None if self.reference is None else self.logprobs_of(self.reference, rows, temperature)
        logprobs, entropy = self.forward(self.model, batch, temperature)
        parts = policy_loss(
            logprobs,
            batch.sampler_logprobs,
            batch.advantages,
            batch.loss_mask,
            self.loss,
            totals,
            logp_prox=proximal,
            logp_ref=reference,
        )
        # FSDP averages gradients over ranks; each rank's loss is its share of the sum.
        (parts.loss * self.world).backward()
        self.progress.add("micro_steps")
        with torch.no_grad():
            ent = (entropy * batch.loss_mask).sum()
            return torch.stack(
                [
                    parts.loss.detach(),
                    parts.clipped_low,
                    parts.clipped_high,
                    parts.mismatch_kl_sum,
                    ent,
                    parts.ref_kl_sum,
                ]
            )

    def optimizer_step(
        self, step: int, part: Slice, temperature: float, measures_mismatch: bool
    ) -> tuple[torch.Tensor, float]:
        """Accumulate the slice's gradients over its micro-batches, clip, step; (sums, grad norm).
        `measures_mismatch` False: the slice's mismatch KL is left out (0)."""
        proximal = part.proximal or [None] * len(part.micro_batches)
        sums = sum(
            self.forward_backward(rows, temperature, part.totals, prox)
            for rows, prox in zip(part.micro_batches, proximal, strict=True)
        )
        if not measures_mismatch:
            sums[STAT_NAMES.index("mismatch_kl")] = 0
        started = time.monotonic()
        failpoint(TRAINER_MID_STEP, step)
        grad_norm = clipped_step(self.model, self.optimizer, self.optim.max_grad_norm, step)
        self.optimizer_s += time.monotonic() - started
        return sums, grad_norm

    def train_step(self, step: int, rows: list[dict], temperature: float) -> dict[str, float]:
        o = self.optim
        self.optimizer_s = 0.0  # clipping and optimizer steps of this update
        lr = lr_at(step, o.lr, o.warmup_steps, self.cfg.max_steps, o.lr_schedule, o.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        parts = [self.plan([rows[i] for i in s]) for s in even_slices(len(rows), o.optimizer_steps)]
        if self.uses_proximal_policy():  # before any step: the weights this update starts from
            self.model.eval()  # the policy itself, not a dropout sample of it
            parts = [p.with_proximal(lambda mb: self.logprobs_of(self.model, mb, temperature)) for p in parts]
        self.model.train()
        sums, grad_norms = 0, []
        # sampler against the weights the update started from: a later slice's own logprobs
        # are of weights the earlier slices moved, so without proximal logprobs only the first counts
        measured = parts if parts[0].proximal is not None else parts[:1]
        with collective_phase(TRAIN, self.tc.collective_timeout_s):
            for i, part in enumerate(parts):
                part_sums, grad_norm = self.optimizer_step(step, part, temperature, i < len(measured))
                sums, grad_norms = sums + part_sums, grad_norms + [grad_norm]
        sums = sums.to(torch.float64)
        with collective_phase(STEP_STATS, self.tc.collective_timeout_s):
            dist.all_reduce(sums)
        mismatch_tokens = sum(p.totals.tokens for p in measured)
        stats = dict(zip(STAT_NAMES, sums.tolist(), strict=True))
        metrics = step_metrics(stats, rows, grad_norms, mismatch_tokens)
        metrics.update(lr=lr, micro_batches=sum(len(p.micro_batches) for p in parts))
        if self.reference is None:
            del metrics["ref_kl"]
        return metrics

    def resume(self, run_id: str) -> int:
        """Load the newest checkpoint of this run (if any); return its update number."""
        found = [newest_checkpoint(self.rundir, run_id) if self.rank == 0 else 0]
        dist.broadcast_object_list(found, src=0)
        start = found[0]
        if start:
            with collective_phase(RESUME, self.tc.collective_timeout_s):
                load_checkpoint(self.rundir, start, self.model, self.optimizer, self.tc.lora.enabled)
            log.info("resumed from the checkpoint after update %d", start)
        if self.rank == 0:
            discard_after_checkpoint(self.rundir, run_id, start)
            # rows of discarded updates describe weights that no longer exist
            self.rundir.metrics.drop_after(TRAINER, start)
        dist.barrier()
        missing = [bool(start) and self.rundir.weights.marker(start, run_id) is None]
        dist.broadcast_object_list(missing, src=0)  # one decision: publish() is collective
        if missing[0]:
            self.publisher.publish_files(start, run_id)  # inference must be able to serve version `start`
        return start

    def should_checkpoint(self, step: int) -> bool:
        every = self.tc.checkpoint.every
        return every > 0 and (step % every == 0 or step == self.cfg.max_steps)

    def run(self, run_id: str, batches: DirWatch | None, orchestrator: PeerWatch) -> None:
        """Train to `max_steps`; `batches` (`rundir.rollouts.watch()`) wakes each batch wait, which
        goes on as long as the `orchestrator` makes progress."""
        first = self.resume(run_id) + 1
        self.publisher.start_broadcasting(run_id, self.device)
        alarm = DriftAlarm(self.tc.max_mismatch_kl, self.tc.mismatch_kl_steps, speak=self.rank == 0)
        for step in range(first, self.cfg.max_steps + 1):
            t0 = time.monotonic()
            marker = await_batch(self.rundir, step, run_id, batches, orchestrator, self.progress)
            t_read = time.monotonic()
            rows = read_batch_rows(self.rundir, step, TRAINER)
            t1 = time.monotonic()
            temperature = batch_temperature(marker, self.rundir.rollouts.describe_marker(step))
            stats = self.train_step(step, rows, temperature)
            t2 = time.monotonic()
            alarm.observe(step, stats["mismatch_kl"], batch_servers(rows))  # every rank: all stop together
            # checkpointed versions are also written as files: a restarted server loads them
            published = self.publisher.publish(step, run_id, files=self.should_checkpoint(step))
            t3 = time.monotonic()
            # the row before the checkpoint: a resume starts after the checkpoint and keeps its rows
            if self.metrics is not None:
                phases = step_phases(t0, t_read, t1, t2, t3, self.optimizer_s, published)
                report_step(self.metrics, step, stats, phases, published.digest_s)
            if self.should_checkpoint(step):
                with collective_phase(CHECKPOINT, self.tc.collective_timeout_s):
                    save_checkpoint(
                        self.rundir,
                        run_id,
                        step,
                        self.model,
                        self.optimizer,
                        self.tc.checkpoint.keep,
                        trained_only=self.tc.lora.enabled,
                    )
            if self.borrower is not None:
                self.borrower.after_step(StepTimes(time.monotonic() - t0, t_read - t0))


def warm_up() -> None:
    """Load now, while the first batch is generated, what the first step would load on the
    launch's critical path (about 0.7 s): the digest kernel of its publish and the Parquet
    reader's lazy imports of its batch read."""
    load_cpu_kernel()
    load_batch_reader()


def run_trainer(cfg: TriadConfig, model_path: str) -> None:
    if cfg.trainer.keep_freed_memory and not keep_freed_memory():
        log.info("trainer.keep_freed_memory: no glibc mallopt here; the allocator keeps its defaults")
    device, mesh = init_distributed(cfg.trainer.device, cfg.trainer.collective_timeout_s)
    batches, lease, progress = None, None, Progress(phase="starting")
    try:
        rundir = RunDir.of(cfg)
        if dist.get_rank() == 0:
            rundir.ensure_run(cfg.public_dict())
            lease = Lease(rundir.live, TRAINER, progress).start()  # one trainer per run directory
        dist.barrier()
        run_id = rundir.read_run().run_id
        warm_up()
        batches = rundir.rollouts.watch()
        progress.set(phase="loading the model")
        orchestrator = PeerWatch(
            rundir.live, ORCHESTRATOR, cfg.trainer.batch_stall_s, "trainer.batch_stall_s"
        )
        trainer = Trainer(cfg, model_path, device, mesh, progress)
        started()
        trainer.run(run_id, batches, orchestrator)
    finally:
        if batches is not None:
            batches.close()
        if lease is not None:
            lease.close()
        dist.destroy_process_group()
