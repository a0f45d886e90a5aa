"""The embedded default model: a tiny Qwen2 built locally, cached, no model hub.

A byte-level tokenizer (256 byte tokens plus end-of-text) is made with the
`tokenizers` library; the model gets random weights and then a short supervised
warm-up on the built-in reverse task, so that RL starts from a policy that
knows the answer format and gets partial credit (about 0.3), not from noise.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import shutil
from pathlib import Path

log = logging.getLogger("triad.model")

EOS = "<|endoftext|>"
BUILD_VERSION = 1
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


def make_model(tokenizer, seed: int):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        tie_word_embeddings=True,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
        **SHAPE,
    )
    return Qwen2ForCausalLM(config)


def warm_up(model, tokenizer, steps: int, seed: int, batch: int = 64, lr: float = 3e-3) -> float:
    """Teach the answer format by supervised steps on the reverse task; returns the last loss."""
    import torch

    from orchestrator.tasks import ReverseText

    task, rng = ReverseText(), random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    for _ in range(steps):
        rows, masks = [], []
        for _ in range(batch):
            p = task.sample(rng)
            prompt = tokenizer.encode(p.text)
            answer = tokenizer.encode(p.answer) + [tokenizer.eos_token_id]
            rows.append(prompt + answer)
            masks.append([0] * len(prompt) + [1] * len(answer))
        width = max(map(len, rows))
        ids = torch.tensor([r + [tokenizer.eos_token_id] * (width - len(r)) for r in rows])
        mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.bool)
        labels = ids.masked_fill(~mask, -100)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()


def build_tiny_model(dest: Path, warmup_steps: int, seed: int = 0) -> None:
    tokenizer = make_tokenizer()
    model = make_model(tokenizer, seed)
    if warmup_steps:
        loss = warm_up(model, tokenizer, warmup_steps, seed)
        log.info("warm-up: %d steps, final loss %.3f", warmup_steps, loss)
    model.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def ensure_tiny_model(name: str = "tiny-reverse", warmup_steps: int = 150) -> Path:
    """Build the named tiny model once (under a lock) and return its directory."""
    root = cache_root() / "models"
    root.mkdir(parents=True, exist_ok=True)
    dest = root / f"{name}-v{BUILD_VERSION}-w{warmup_steps}"
    with open(root / f".{dest.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / "config.json").exists():
            return dest
        log.info("building the embedded tiny model in %s (once)", dest)
        tmp = root / f".tmp-{dest.name}"
        shutil.rmtree(tmp, ignore_errors=True)
        build_tiny_model(tmp, warmup_steps)
        os.replace(tmp, dest)
    return dest
