"""The embedded models: tiny models built locally, cached, no model hub.

A byte-level tokenizer (256 byte tokens plus end-of-text) is made with the
`tokenizers` library; the model (0.5M parameters) gets random weights and then a
short supervised warm-up on its built-in task, so that RL starts from a policy
that knows the answer format and earns a reward of about 0.3, not from noise.
`builtin:tiny-addition` is warmed up on single-digit addition,
`builtin:tiny-reverse` on reversing short words.

`builtin:tiny-tools` is a chat model: a tiny Qwen3 on the real Qwen3 tokenizer and
chat template, warmed up deterministically on the chat calculator and checked by
sampling before it is cached (services/tiny_chat.py).
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from services.progress import StepProgress
from services.tiny_chat import ChatRecipe, build_chat_model
from shared.errors import TriadError

log = logging.getLogger("triad.model")

EOS = "<|endoftext|>"
BUILD_VERSION = 2
# libgomp's threads spin at the end of every parallel region before they sleep; with the warm-up's
# two threads on a busy 2-core machine each tiny op's barrier then waits for a thread that is not
# running while the other burns its time: there PASSIVE took 3-6x less wall time and about 4x less
# CPU time for the same steps and bytes (bench/results/first_ten_minutes.md)
BUILD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
CHAT_VERSION = 4  # the chat recipes' own build version: 4 is the Qwen3 model (hidden 128) and template
SHAPE = dict(
    hidden_size=128,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def cache_root() -> Path:
    return Path(os.environ.get("TRIAD_CACHE", Path.home() / ".cache" / "triad"))


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab[EOS] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOS])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def make_model(tokenizer, seed: int, untied: bool = False, **shape):
    """Qwen2 with the output layer tied to the embedding, or (`untied`) Llama with its own
    `lm_head`, which vLLM's Llama can adapt by LoRA (its Qwen2 adapts only the inner linears)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config_class, model_class = (LlamaConfig, LlamaForCausalLM) if untied else (Qwen2Config, Qwen2ForCausalLM)
    config = config_class(
        vocab_size=len(tokenizer),
        tie_word_embeddings=not untied,
        bos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
        **{**SHAPE, **shape},
    )
    return model_class(config)


@dataclass(frozen=True)
class Recipe:
    task: str
    warmup_steps: int
    warmup_lr: float
    untied: bool = False  # Llama with its own lm_head (see make_model)


# Warm-ups measured to start RL near a reward of 0.3 (sampled at temperature 1).
RECIPES = {
    "tiny-addition": Recipe(task="addition", warmup_steps=137, warmup_lr=3e-4),
    # for LoRA: sampled at temperature 1 it is right 0.36 of the time and greedily 0.96; the gap is
    # the logits' scale, which LoRA on lm_head can change (150 supervised steps: 0.36 -> 1.0; on
    # the seven inner linears alone: 0.36 -> 0.46; docs/design.md, "What LoRA can learn")
    "tiny-addition-untied": Recipe(task="addition", warmup_steps=137, warmup_lr=3e-4, untied=True),
    "tiny-reverse": Recipe(task="reverse", warmup_steps=160, warmup_lr=3e-4),
    # Measured (seed 0, 2 threads): the copied digits' loss falls to 0.07 a token in the short
    # phase and to 0.02 on whole episodes 200 steps into the second; the sampled check reached 0.28
    # on 64 prompts, the tool called in 33% of episodes (86% of them answered right). Without the
    # short phase (hidden 64 or 128, lr 1e-3 or 3e-3, up to 1000 steps) the copied digits stayed at
    # 2.3 nats (guessed) and the sampled reward at 0.00. With 300 served steps at 35% tool episodes
    # it reached 0.16: too close to the target.
    "tiny-tools": ChatRecipe(
        task="calculator",
        copy_steps=300,
        warmup_steps=400,
        warmup_lr=1e-3,
        tool_share=0.5,
        thinking_share=0.3,
        target=0.15,
    ),
}


def supervised(
    model, make_batch, steps: int, lr: float, pad: int, progress: StepProgress | None = None
) -> float:
    """`steps` AdamW steps on batches of (token rows, loss masks), each reported to `progress`;
    returns the last loss."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for i in range(steps):
        if progress is not None:
            progress.step(i, steps, "warm-up")
        rows, masks = make_batch()
        width = max(map(len, rows))
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        labels = ids.masked_fill(~mask, -100)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()


def warm_up(
    model,
    tokenizer,
    task_name: str,
    steps: int,
    lr: float,
    seed: int,
    batch: int = 64,
    progress: StepProgress | None = None,
) -> float:
    """Teach the answer format by supervised steps on the task; returns the last loss."""
    from orchestrator.envs import BUILTIN

    task, rng = BUILTIN[task_name](), random.Random(seed)

    def make_batch():
        rows, masks = [], []
        for _ in range(batch):
            p = task.sample(rng)
            prompt = tokenizer.encode(p.text)
            answer = tokenizer.encode(p.answer) + [tokenizer.eos_token_id]
            rows.append(prompt + answer)
            masks.append([0] * len(prompt) + [1] * len(answer))
        return rows, masks

    return supervised(model, make_batch, steps, lr, tokenizer.eos_token_id, progress)


def build_tiny_model(dest: Path, name: str, recipe: Recipe | ChatRecipe, seed: int = 0) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # `triad up` output stays free of control characters
    if isinstance(recipe, ChatRecipe):
        build = build_chat_model(dest, name, recipe, seed)
        log.info(
            "warm-up on %s: %d+%d steps in %.0f s, sampled reward %.2f (target %.2f)",
            recipe.task,
            recipe.copy_steps,
            recipe.warmup_steps,
            build["build_s"],
            build["sampled_reward"],
            recipe.target,
        )
        return
    progress = StepProgress(f"building builtin:{name} (once; a few seconds)")
    with progress.during("loading torch and transformers"):
        tokenizer = make_tokenizer()
        model = make_model(tokenizer, seed, recipe.untied)
    if recipe.warmup_steps:
        loss = warm_up(
            model, tokenizer, recipe.task, recipe.warmup_steps, recipe.warmup_lr, seed, progress=progress
        )
        progress.done()  # a terminal's live line ends before the log's
        log.info("warm-up on %s: %d steps, final loss %.3f", recipe.task, recipe.warmup_steps, loss)
    progress.done()
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def cache_name(name: str, recipe: Recipe | ChatRecipe) -> str:
    if isinstance(recipe, ChatRecipe):
        return f"{name}-v{BUILD_VERSION}c{CHAT_VERSION}-w{recipe.copy_steps}+{recipe.warmup_steps}"
    return f"{name}-v{BUILD_VERSION}-w{recipe.warmup_steps}"


def ensure_tiny_model(name: str) -> Path:
    """Build the named tiny model once (under a lock) and return its directory."""
    recipe = RECIPES[name]
    root = cache_root() / "models"
    dest = root / cache_name(name, recipe)
    lock_path = root / f".{dest.name}.lock"
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock_path.touch()
    except OSError as e:
        raise TriadError(
            f"cannot write the model cache {root}: {e.strerror}; set TRIAD_CACHE to a writable directory"
        ) from None
    with open(lock_path, "w") as lock:
        wait_for_builder(lock, dest)
        if (dest / "config.json").exists():
            return dest
        log.info("building the embedded tiny model in %s (once)", dest)
        tmp = root / f".tmp-{dest.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_apart(tmp, name)
        os.replace(tmp, dest)
    return dest


def wait_for_builder(lock, dest: Path) -> None:
    """Take the build lock of `dest`; held by another process building it, say so and wait as long
    as that process lives (the lock is released when it ends, however it ends)."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("waiting for another process that builds %s (it holds %s)", dest, lock.name)
        fcntl.flock(lock, fcntl.LOCK_EX)


def build_apart(dest: Path, name: str) -> None:
    """`build_tiny_model` in a process of its own whose OpenMP threads sleep as soon as they
    wait (BUILD_ENV, read when torch loads); its one-line error raised here as a TriadError."""
    error = dest.parent / f".error-{dest.name}"
    error.unlink(missing_ok=True)
    command = [sys.executable, "-m", "services.tiny_model", name, str(dest), str(error)]
    code = subprocess.run(command, env={**os.environ, **BUILD_ENV}, stdin=subprocess.DEVNULL).returncode
    if error.exists():
        message = error.read_text()
        error.unlink()
        raise TriadError(message)
    if code != 0:
        raise TriadError(f"building builtin:{name} stopped with exit code {code} (its output is above)")


def main(argv: list[str]) -> None:
    """`python -m services.tiny_model NAME DEST ERROR_FILE`: what `build_apart` runs."""
    from shared.logs import setup_logging

    name, dest, error = argv
    setup_logging()
    try:
        build_tiny_model(Path(dest), name, RECIPES[name])
    except TriadError as e:
        Path(error).write_text(str(e))
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
