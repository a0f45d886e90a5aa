"""Resolve `model` from config: the embedded tiny model, a local directory, or a hub id.

A hub id is resolved as transformers and vLLM resolve it, by huggingface_hub's `snapshot_download`:
the Hugging Face cache (`HF_HOME`, `HF_HUB_CACHE`), `HF_HUB_OFFLINE`, a revision
(`model_revision`). Every service reads the snapshot directory, so the chat template, the
config, the dtype and the parsers are read from the files vLLM and the trainer load; `triad up`
resolves the id once and hands its services the id at that snapshot's commit, offline.
"""

from __future__ import annotations

from pathlib import Path

from shared.config import BUILTIN_MODEL_PREFIX, TriadConfig
from shared.errors import TriadError

# what vLLM and transformers read from a hub repository: config, tokenizer, template, weights
HUB_FILES = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken"]


def looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or Path(spec).exists()


def download_command(repo_id: str, revision: str | None) -> str:
    return f"hf download {repo_id}" + (f" --revision {revision}" if revision else "")


def hub_snapshot(repo_id: str, revision: str | None = None, cache_dir: str | Path | None = None) -> str:
    """The snapshot directory of `repo_id` at `revision` (None: main) in the Hugging Face cache
    (`cache_dir`, default huggingface_hub's: `HF_HUB_CACHE`, else `HF_HOME`/hub), downloaded
    first when the Hub is reachable and `HF_HUB_OFFLINE` is not set; TriadError in one line if
    it is not cached and cannot be downloaded."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = Path(cache_dir or constants.HF_HUB_CACHE)
    where = f"model {repo_id!r}" + (f" (revision {revision!r})" if revision else "")
    # offline, only the cache: huggingface_hub otherwise lists a commit's files on the Hub
    offline = constants.is_offline_mode()
    try:
        return snapshot_download(
            repo_id, revision=revision, cache_dir=cache, allow_patterns=HUB_FILES, local_files_only=offline
        )
    except LocalEntryNotFoundError as e:
        why = "HF_HUB_OFFLINE is set" if constants.is_offline_mode() else f"the Hub answered: {e}"
        why = " ".join(why.split())
        raise TriadError(
            f"{where} is not in the Hugging Face cache {cache} and {why}: "
            f"download it with `{download_command(repo_id, revision)}` (or set HF_HUB_CACHE / HF_HOME "
            "to the cache that holds it)"
        ) from None
    except HfHubHTTPError as e:
        message = " ".join(str(e).split())
        raise TriadError(f"{where}: the Hugging Face Hub refused it: {message}") from None


def resolve_model(spec: str, revision: str | None = None) -> str:
    """A local directory for `spec`: the built-in model's, the given directory, or the
    Hugging Face cache's snapshot of a hub id at `revision`."""
    if spec.startswith(BUILTIN_MODEL_PREFIX):
        from services.tiny_model import RECIPES, ensure_tiny_model

        name = spec.removeprefix(BUILTIN_MODEL_PREFIX)
        if name not in RECIPES:
            raise TriadError(f"unknown built-in model {spec!r}; built-in: {sorted(RECIPES)}")

        return str(ensure_tiny_model(name))
    if looks_like_path(spec):
        path = Path(spec).expanduser()
        if not (path / "config.json").is_file():
            raise TriadError(f"model path {path} does not exist or has no config.json")
        return str(path.resolve())
    return hub_snapshot(spec, revision)


def is_hub_id(spec: str) -> bool:
    return not spec.startswith(BUILTIN_MODEL_PREFIX) and not looks_like_path(spec)


def served_as_hub_id(cfg: TriadConfig) -> TriadConfig:
    """`cfg` whose vLLM serves a hub id's snapshot under the hub id (`--served-model-name`), the
    name vLLM gives it when handed the id itself (a later flag in `inference.vllm_args` wins)."""
    if not is_hub_id(cfg.model):
        return cfg
    vllm_args = ["--served-model-name", cfg.model, *cfg.inference.vllm_args]
    return cfg.model_copy(update={"inference": cfg.inference.model_copy(update={"vllm_args": vllm_args})})
