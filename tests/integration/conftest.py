"""Plain vLLM servers (vLLM's own, no triad admin routes: the policy stays frozen) shared by
every module that needs one: each is started when first asked for and stopped when the session
ends, once in each pytest-xdist worker that asks. Idle, one costs memory, not CPU (measured:
under 2% of a core)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import CHAT_VLLM_ARGS, Server


def plain(tmp_path_factory, name: str, model: str, **kwargs) -> Iterator[Server]:
    root = tmp_path_factory.mktemp(name)
    server = Server(root, model, root / "vllm.log", plain=True, **kwargs)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def plain_server(tmp_path_factory, tiny_model) -> Iterator[Server]:
    """The embedded base model `builtin:tiny-addition`."""
    yield from plain(tmp_path_factory, "plain-vllm", tiny_model)


@pytest.fixture(scope="session")
def chat_server(tmp_path_factory, chat_model) -> Iterator[Server]:
    """The embedded chat model with tool calls `builtin:tiny-tools`."""
    yield from plain(tmp_path_factory, "chat-vllm", chat_model, max_model_len=1024, vllm_args=CHAT_VLLM_ARGS)
