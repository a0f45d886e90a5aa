"""The SGLang weight backend against a fake that follows SGLang's documented routes."""

import asyncio
from pathlib import Path

import pytest

from orchestrator.backends import SGLangUpdate, detect
from orchestrator.client import InferenceClient
from shared.errors import TriadError
from tests.fake_openai import FakeServer


def test_sglang_backend_is_detected_loads_absolute_paths_and_names_a_refusal(tmp_path: Path):
    with FakeServer() as fake:
        fake.state.sglang_model = "/models/base"

        async def run() -> None:
            client = InferenceClient(fake.url, None, 30)
            try:
                backend = await detect(client, "auto", tmp_path, timeout=30)
                assert isinstance(backend, SGLangUpdate) and backend.updates
                assert (await backend.current()).model_dump(include={"version", "path", "base_path"}) == {
                    "version": 0,
                    "path": "/models/base",
                    "base_path": "/models/base",
                }
                info = await backend.load(3, "published/v3")
                assert fake.state.sglang_loaded == [
                    str(tmp_path.resolve() / "published/v3")
                ]  # absolute, as SGLang reads it
                assert (info.version, info.path, info.digest) == (
                    3,
                    "published/v3",
                    None,
                )  # SGLang reports no digests
                await backend.load(0, "ignored")  # version 0: back to the model it started from
                assert fake.state.sglang_loaded[-1] == "/models/base"
                fake.state.sglang_refuse = "Failed to get weights iterator: no such file"
                with pytest.raises(TriadError, match="update_weights_from_disk answered 400: .*no such file"):
                    await backend.load(4, "published/v4")
                assert (await backend.current()).version == 0  # unchanged after the refusal
            finally:
                await client.close()

        asyncio.run(run())


def test_a_server_without_weight_routes_is_frozen(tmp_path: Path):
    with FakeServer() as fake:

        async def run() -> str:
            client = InferenceClient(fake.url, None, 30)
            try:
                return (await detect(client, "auto", tmp_path, timeout=30)).kind
            finally:
                await client.close()

        assert asyncio.run(run()) == "none"
