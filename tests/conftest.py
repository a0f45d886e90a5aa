from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def triad_cache(tmp_path_factory) -> Path:
    """A private model cache for the whole session (shared with subprocesses via env), one for
    all of pytest-xdist's workers (beside their own folders): a model is built once, under its lock."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    cache = Path(os.environ.get("TRIAD_TEST_CACHE") or root / "triad-cache")
    cache.mkdir(parents=True, exist_ok=True)
    os.environ["TRIAD_CACHE"] = str(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_model(triad_cache) -> str:
    from services.models import resolve_model

    return resolve_model("builtin:tiny-addition")


@pytest.fixture(scope="session")
def chat_model(triad_cache) -> str:
    """The embedded chat model with tool calls (`builtin:tiny-tools`, a tiny Qwen3 on the real tokenizer)."""
    from services.models import resolve_model

    return resolve_model("builtin:tiny-tools")


@pytest.fixture(scope="session")
def untied_model(triad_cache) -> str:
    """The embedded base model as Llama with its own lm_head (`builtin:tiny-addition-untied`)."""
    from services.models import resolve_model

    return resolve_model("builtin:tiny-addition-untied")
