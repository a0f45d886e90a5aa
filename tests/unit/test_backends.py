"""The SGLang weight backend against a fake that follows SGLang's documented routes."""

import asyncio
import hashlib
from pathlib import Path

import pytest

from orchestrator.backends.detection import backend_for, detect
from orchestrator.backends.sglang import SGLangUpdate
from orchestrator.backends.stock_vllm import VLLMRoutes, skipped_parameters
from orchestrator.client import InferenceClient
from orchestrator.integrity import DigestMismatch
from shared.config import load_config
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


def test_stock_vllm_backend_drives_its_rl_routes_and_reports_vllms_version(tmp_path: Path):
    with FakeServer() as fake:
        fake.state.vllm_routes = True

        async def run() -> None:
            client = InferenceClient(fake.url, None, 30)
            try:
                backend = await detect(client, "auto", tmp_path, timeout=30)
                assert isinstance(backend, VLLMRoutes) and backend.updates
                assert (await backend.current()).version == 0  # vLLM's "default": the model it started with
                fake.state.vllm_calls.clear()
                info = await backend.load(1, "published/v1")
                assert (info.version, info.path) == (1, "published/v1")
                target = str(tmp_path.resolve() / "published/v1")
                assert fake.state.vllm_calls == [
                    "/init_weight_transfer_engine {'init_info': {}}",
                    "/pause {'mode': 'keep'}",
                    "/start_weight_update",
                    f"/update_weights {{'update_info': {{'path': '{target}'}}}}",
                    "/finish_weight_update {'weight_version': '1'}",
                    "/resume",
                    "/weight_info",
                    "/weight_checker {'action': 'checksum'}",
                ]
            finally:
                await client.close()

        asyncio.run(run())


def test_a_parameter_the_reload_skipped_is_caught_by_the_weight_checker(tmp_path: Path):
    with FakeServer() as fake:
        fake.state.vllm_routes = True

        async def run() -> None:
            client = InferenceClient(fake.url, None, 30)
            try:
                backend = await detect(client, "vllm", tmp_path, timeout=30)
                await backend.load(1, "published/v1")
                await backend.load(2, "published/v2")  # every parameter changed: fine
                fake.state.vllm_skip = {"b"}
                with pytest.raises(DigestMismatch, match=r"version 3 but 1 of 3 parameters .*\['b'\]"):
                    await backend.load(3, "published/v3")
            finally:
                await client.close()

        asyncio.run(run())


def test_skipped_parameters_are_those_unchanged_while_others_changed():
    before = {"a": "1", "b": "2", "c": "3"}
    assert skipped_parameters(before, {"a": "9", "b": "2", "c": "8"}) == ["b"]
    assert skipped_parameters(before, dict(before)) == []  # the same version again: nothing skipped
    assert skipped_parameters(before, {"a": "9", "b": "8", "c": "7"}) == []
    empty = hashlib.sha256(b"").hexdigest()  # a CPU build's prepacked linear weight: not checked
    assert skipped_parameters({**before, "w": empty}, {"a": "9", "b": "8", "c": "7", "w": empty}) == []


@pytest.mark.parametrize("url", ["http://10.0.0.5:8000", "http://0.0.0.0:8000", "http://example.com:8000"])
def test_a_stock_vllm_server_beyond_loopback_is_refused_in_one_line(tmp_path: Path, url: str):
    async def run() -> None:
        client = InferenceClient(url, None, 30)
        try:
            await detect(client, "vllm", tmp_path, timeout=30)
        finally:
            await client.close()

    with pytest.raises(TriadError, match=r"not loopback, and vLLM's RL routes have no authentication") as e:
        asyncio.run(run())
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("routes", ["vllm", "sglang"])
def test_auto_finding_a_server_that_cannot_apply_deltas_is_refused_in_one_line(tmp_path: Path, routes: str):
    cfg = load_config(None, [f"run_dir={tmp_path}", "weights.snapshot_every=5"])  # inference.backend = auto
    with FakeServer() as fake:
        fake.state.vllm_routes = routes == "vllm"
        fake.state.sglang_model = "/models/base" if routes == "sglang" else None

        async def run() -> None:
            client = InferenceClient(fake.url, None, 30)
            try:
                await backend_for(client, cfg, "r1")
            finally:
                await client.close()

        with pytest.raises(
            TriadError, match=rf"^{fake.url}: weights.snapshot_every = 5 publishes delta"
        ) as e:
            asyncio.run(run())
    assert f"inference.backend is '{routes}'" in str(e.value) and "\n" not in str(e.value)
    assert fake.state.vllm_calls in ([], ["/weight_info"]) and fake.state.sglang_loaded == []  # only asked
