"""The compute floor of the embedded default: the same step in one process, no services.

    python -m bench.floor [STEPS]     (prints one JSON line)

One Python process does what a triad step does, with nothing between the parts:
sample `batch_size x group_size` completions of `max_tokens` tokens from the
current policy with Hugging Face's KV-cached `generate` (temperature 1), score them
with triad's own `addition` environment, compute GRPO advantages, then one
forward, backward and AdamW step with triad's loss on the same model object
(no weight hand-off: the sampler is the trained model). Same model, prompts per
step, group size, tokens, learning rate and thread count (all cores) as
`services/embedded_default.toml`. The figure is the median step time after
warm-up, with the split between sampling and training.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
import tomllib
from pathlib import Path

import torch

from orchestrator.batches.advantages import group_advantages
from orchestrator.envs.basic import Addition
from services.models import resolve_model
from shared.config import LossConfig
from tests.reference import token_logprobs
from trainer.data import collate
from trainer.host import keep_freed_memory
from trainer.loss import BatchTotals, policy_loss

WARMUP = 5
DEFAULT = Path(__file__).resolve().parent.parent / "services" / "embedded_default.toml"


def settings() -> dict:
    cfg = tomllib.loads(DEFAULT.read_text())
    oc = cfg["orchestrator"]
    return dict(
        model=cfg["model"],
        batch_size=oc["batch_size"],
        group_size=oc["group_size"],
        max_tokens=oc["sampling"]["max_tokens"],
        lr=cfg["trainer"]["optim"]["lr"],
    )


def sample(model, tokenizer, prompts: list[str], group: int, max_tokens: int) -> list[list[int]]:
    """Completion token ids, `group` per prompt, prompt order kept."""
    encoded = tokenizer([p for p in prompts for _ in range(group)], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(
            **encoded,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_tokens,
            pad_token_id=tokenizer.pad_token_id,
            use_cache=True,
        )
    width = encoded["input_ids"].shape[1]
    completions = []
    for row in out[:, width:].tolist():
        ids = []
        for token in row:
            if token == tokenizer.pad_token_id:
                break
            ids.append(token)
            if token == tokenizer.eos_token_id:
                break
        completions.append(ids)
    return completions


def train_rows(tokenizer, prompts, completions, rewards, group: int) -> list[dict]:
    rows = []
    for i, ids in enumerate(completions):
        prompt_ids = tokenizer(prompts[i // group].text)["input_ids"]
        advantage = group_advantages(rewards[i - i % group : i - i % group + group], "grpo")[i % group]
        rows.append(
            dict(
                input_ids=prompt_ids + ids,
                loss_mask=[False] * len(prompt_ids) + [True] * len(ids),
                logprobs=[0.0] * (len(prompt_ids) + len(ids)),
                advantage=advantage,
            )
        )
    return rows


def step(
    model, tokenizer, optimizer, env: Addition, rng: random.Random, s: dict
) -> tuple[float, float, float]:
    """One step; returns (sampling s, training s, mean reward)."""
    start = time.perf_counter()
    prompts = [env.sample(rng) for _ in range(s["batch_size"])]
    model.eval()
    completions = sample(model, tokenizer, [p.text for p in prompts], s["group_size"], s["max_tokens"])
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    rewards = [env.reward(prompts[i // s["group_size"]], t) for i, t in enumerate(texts)]
    sampled = time.perf_counter()
    model.train()
    batch = collate(train_rows(tokenizer, prompts, completions, rewards, s["group_size"]), pad_id=0)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp = token_logprobs(logits, batch.input_ids, 1.0)
    totals = BatchTotals(len(completions), int(batch.loss_mask.sum()))
    # on-policy in one process: the sampler's logprobs are the policy's own
    policy_loss(logp, logp.detach(), batch.advantages, batch.loss_mask, LossConfig(), totals).loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return sampled - start, time.perf_counter() - sampled, sum(rewards) / len(rewards)


def measure(steps: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    s = settings()
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    keep_freed_memory()
    path = resolve_model(s["model"])
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=s["lr"], fused=True)  # as the trainer's
    env, rng = Addition(), random.Random(0)
    timings = [step(model, tokenizer, optimizer, env, rng, s) for _ in range(steps)]
    steady = timings[WARMUP:]
    return {
        "step_s": statistics.median(a + b for a, b, _ in steady),
        "sample_s": statistics.median(a for a, _, _ in steady),
        "train_s": statistics.median(b for _, b, _ in steady),
        "samples_per_step": s["batch_size"] * s["group_size"],
        "reward_first_10": statistics.mean(r for _, _, r in timings[:10]),
        "reward_last_10": statistics.mean(r for _, _, r in timings[-10:]),
        "steps": steps,
        "threads": threads,
        "model": s["model"],
    }


if __name__ == "__main__":
    print(json.dumps(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 60)))
