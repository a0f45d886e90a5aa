from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files in collection order (integration, then unit: pyproject's `--no-loadscope-reorder`),
    except the integration files that use the chat model after the first of them: they go after
    the other integration files. Its build (3-4 minutes at 1.2 cores) is made by the first; a second
    worker that also needed it sat on its lock with a core idle (2026-11-29, a fresh clone's suite)."""
    chat = [i.path for i in items if "chat_model" in i.fixturenames and "integration" in i.path.parts]

    def later(item: pytest.Item) -> bool:
        return item.path in chat and item.path != chat[0]

    items.sort(key=lambda item: ("unit" in item.path.parts, later(item)))  # stable: files stay whole


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
