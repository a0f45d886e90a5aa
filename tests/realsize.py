"""Qwen3-0.6B at its real size without a download: its own `config.json` (`tests/data/qwen3_0_6b/`),
seeded random bf16 weights, and the vendored Qwen3 tokenizer and chat template
(`shared/data/qwen3_tokenizer/`), written once per machine into a Hugging Face cache as
`Qwen/Qwen3-0.6B` (`refs/main` naming `snapshots/<commit>`), so `model = "Qwen/Qwen3-0.6B"` with
`HF_HUB_OFFLINE=1` and `HF_HUB_CACHE=realsize_hub_cache()` resolves to it as to the real one.

Also the CPU overrides the real-size runs of `configs/qwen3-*.toml` use (README, "Real size on CPU").
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
from pathlib import Path

from transformers.utils import SAFE_WEIGHTS_NAME  # the Hugging Face layout's weights file

from services.tiny_model import cache_root

REPO_ID = "Qwen/Qwen3-0.6B"
CONFIG = Path(__file__).resolve().parent / "data" / "qwen3_0_6b" / "config.json"
TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "shared" / "data" / "qwen3_tokenizer"
TOKENIZER_FILES = ("tokenizer_config.json", "vocab.json", "merges.txt", "LICENSE")
SEED = 0
INIT_STD = 0.02  # the config's initializer_range

# What a 0.6B run of a shipped GPU config needs on a CPU machine, given on the command line as
# `--set` (the README's "Real size on CPU" lists the same): no devices, one trainer rank, a
# batch of 2 groups of 2, short completions and a short context, fp32 master weights in bf16
# publishing, and the run's own 2 steps.
CPU_OVERRIDES = (
    "max_steps=2",
    "inference.devices=",
    "inference.max_model_len=1024",
    "inference.kv_cache_gib=1",
    "trainer.devices=",
    "trainer.nproc=1",
    "orchestrator.batch_size=4",
    "orchestrator.group_size=2",
    "orchestrator.max_inflight=4",
    "orchestrator.sampling.max_tokens=16",
    "orchestrator.eval.every=0",
    "trainer.checkpoint.every=0",
    "trainer.parallel.micro_batch_tokens=1024",
)


def realsize_hub_cache() -> Path:
    """The Hugging Face cache (`HF_HUB_CACHE`) holding the real-size model, under `TRIAD_CACHE`."""
    return cache_root() / "realsize-hub"


def commit_of() -> str:
    """A 40-hex commit naming what the snapshot is built from: a change rebuilds it."""
    digest = hashlib.sha1(f"seed={SEED} std={INIT_STD}\n".encode())
    digest.update(CONFIG.read_bytes())
    for name in TOKENIZER_FILES:
        digest.update((TOKENIZER_DIR / name).read_bytes())
    return digest.hexdigest()


def write_weights(dest: Path) -> int:
    """`model.safetensors` for the config's model: N(0, INIT_STD) matrices and embeddings, unit norms,
    bf16, from one seeded generator; the parameter count."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(dest)
    with torch.device("meta"):
        shapes = {n: p.shape for n, p in AutoModelForCausalLM.from_config(config).named_parameters()}
    generator = torch.Generator().manual_seed(SEED)
    state = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            state[name] = (torch.randn(shape, generator=generator) * INIT_STD).to(torch.bfloat16)
    save_file(state, dest / SAFE_WEIGHTS_NAME, metadata={"format": "pt"})
    return sum(t.numel() for t in state.values())


def ensure_realsize_model() -> Path:
    """The snapshot directory of `Qwen/Qwen3-0.6B` in `realsize_hub_cache()`, built once under a
    lock (two processes wait for one build) and reused while its inputs are unchanged."""
    storage = realsize_hub_cache() / ("models--" + REPO_ID.replace("/", "--"))
    storage.mkdir(parents=True, exist_ok=True)
    commit = commit_of()
    snapshot = storage / "snapshots" / commit
    with open(storage / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (snapshot / SAFE_WEIGHTS_NAME).is_file():
            tmp = storage / f".tmp-{commit}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            shutil.copy(CONFIG, tmp / "config.json")
            for name in TOKENIZER_FILES:
                shutil.copy(TOKENIZER_DIR / name, tmp / name)
            write_weights(tmp)
            snapshot.parent.mkdir(exist_ok=True)
            shutil.rmtree(snapshot, ignore_errors=True)
            os.replace(tmp, snapshot)
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / "main").write_text(commit)
    return snapshot


def realsize_env() -> dict[str, str]:
    """The environment a real-size run resolves `Qwen/Qwen3-0.6B` in: the built cache, offline."""
    return {"HF_HUB_CACHE": str(realsize_hub_cache()), "HF_HUB_OFFLINE": "1"}


def parameter_count(snapshot: Path) -> int:
    from safetensors import safe_open

    with safe_open(snapshot / SAFE_WEIGHTS_NAME, "pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())  # noqa: SIM118


if __name__ == "__main__":
    built = ensure_realsize_model()
    print(json.dumps({"snapshot": str(built), "parameters": parameter_count(built)}))
