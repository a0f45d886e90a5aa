"""Trainer tokens/s: the 1-rank torchrun FSDP2 trainer against a plain PyTorch loop.

    python -m bench.trainer_throughput WORKDIR     (prints one JSON line)

Both train the embedded tiny model on the same synthetic batches with AdamW, on
the same number of threads and malloc settings; the trainer's time is its `train_s` (no publishing).
Each side's figure is the median over steps of tokens/s, after warm-up steps;
the two sides alternate for ROUNDS rounds (this machine's noise moves a single
figure by +-20%), and the reported figures are the medians over rounds.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from services.models import resolve_model
from shared.batch import publish_batch
from shared.config import LossConfig
from shared.rundir import TRAINER, RunDir
from tests.reference import token_logprobs
from trainer.data import collate
from trainer.host import keep_freed_memory
from trainer.loss import BatchTotals, policy_loss

STEPS, WARMUP, THREADS, ROUNDS = 24, 4, 2, 3


def batches(seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for step in range(1, STEPS + 1):
        rows = []
        for i in range(64):
            n_prompt, n_completion = rng.randint(8, 24), rng.randint(16, 48)
            ids = [rng.randrange(256) for _ in range(n_prompt + n_completion)]
            mask = [False] * n_prompt + [True] * n_completion
            rows.append(
                dict(
                    sample_id=f"{step}-{i}",
                    group_id=f"{step}-{i // 8}",
                    step=step,
                    policy_version=0,
                    input_ids=ids,
                    loss_mask=mask,
                    logprobs=[-5.5 if m else 0.0 for m in mask],
                    advantage=rng.uniform(-1, 1),
                    reward=0.0,
                    truncated=False,
                    env="bench",
                    metrics="{}",
                )
            )
        out.append(rows)
    return out


def trainer_tokens_per_s(workdir: Path, model: str, data: list[list[dict]], *extra_sets: str) -> float:
    from tests.helpers import trainer_cmd

    rundir = RunDir(workdir)
    run_id = rundir.ensure_run({}).run_id
    for step, rows in enumerate(data, start=1):
        publish_batch(rundir, run_id, step, rows, temperature=1.0)
    sets = [f"run_dir={workdir}", f"model={model}", f"max_steps={STEPS}", "trainer.checkpoint.every=0"]
    sets += extra_sets
    cmd = trainer_cmd(*[f"--set={s}" for s in sets])
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)}
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    rows = rundir.metrics.rows(TRAINER)[WARMUP:]
    return statistics.median(r["tokens"] / r["train_s"] for r in rows)


def plain_tokens_per_s(model_dir: str, data: list[list[dict]]) -> float:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    keep_freed_memory()  # the same allocator settings as the trainer
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)  # as the trainer's
    spec, rates = LossConfig(), []
    for step, rows in enumerate(data):
        start = time.perf_counter()
        batch = collate(rows, pad_id=0)
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        logp = token_logprobs(logits, batch.input_ids, 1.0)
        totals = BatchTotals(len(rows), int(batch.loss_mask.sum()))
        policy_loss(
            logp, batch.sampler_logprobs, batch.advantages, batch.loss_mask, spec, totals
        ).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= WARMUP:
            rates.append(sum(len(r["input_ids"]) for r in rows) / (time.perf_counter() - start))
    return statistics.median(rates)


def plain_in_subprocess(model_dir: str) -> float:
    code = f"from bench.trainer_throughput import *; print(plain_tokens_per_s({model_dir!r}, batches()))"
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(done.stdout.split()[-1])


def compare(workdir: Path, model: str, data: list[list[dict]], rounds: int = ROUNDS) -> dict:
    """The trainer against the plain loop, alternating for `rounds` rounds (medians)."""
    trainer, plain = [], []
    for round_ in range(rounds):
        trainer.append(trainer_tokens_per_s(workdir / f"round_{round_}", model, data))
        plain.append(plain_in_subprocess(model))  # a fresh process, as the trainer's is
    result = {
        "trainer_tokens_per_s": statistics.median(trainer),
        "plain_tokens_per_s": statistics.median(plain),
        "rounds": {"trainer": trainer, "plain": plain},
    }
    result["ratio"] = result["trainer_tokens_per_s"] / result["plain_tokens_per_s"]
    return result


def main() -> None:
    from bench.weight_transport import SIZES, build_model

    workdir = Path(sys.argv[1])
    model = resolve_model("builtin:tiny-addition")
    data = batches()
    result = compare(workdir / "tiny", model, data)
    # what glibc's default thresholds cost the trainer (see trainer/host.py)
    result["trainer_default_malloc_tokens_per_s"] = trainer_tokens_per_s(
        workdir / "default_malloc", model, data, "trainer.keep_freed_memory=false"
    )
    # torch.compile'd decoder blocks; the compiling steps fall in the warm-up
    result["trainer_compiled_tokens_per_s"] = trainer_tokens_per_s(
        workdir / "compiled", model, data, "trainer.parallel.compile=true"
    )
    result.update(model="builtin:tiny-addition (0.5M parameters)", threads=THREADS)
    # a model where compute, not per-op overhead, dominates
    larger = workdir / "model_5m"
    parameters = build_model(larger, *SIZES["5M"])
    result["5M"] = {**compare(workdir / "5M", str(larger), data), "parameters": parameters}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
