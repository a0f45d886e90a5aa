"""Resolve `model` from config: the embedded tiny model, a local directory, or a hub id."""

from __future__ import annotations

from pathlib import Path

from shared.config import BUILTIN_MODEL_PREFIX
from shared.errors import TriadError


def looks_like_path(spec: str) -> bool:
    return spec.startswith(("/", "./", "../", "~")) or Path(spec).exists()


def resolve_model(spec: str) -> str:
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
    return spec  # a Hugging Face hub id, loaded by vLLM and transformers themselves
