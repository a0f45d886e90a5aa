"""The weight backends against fakes that follow SGLang's documented routes and stock vLLM's RL routes."""

import asyncio
import hashlib
from pathlib import Path

import pytest

from orchestrator.servers.backends.base import DigestMismatch
from orchestrator.servers.backends.detection import backend_for, detect
from orchestrator.servers.backends.sglang import SGLangUpdate
from orchestrator.servers.backends.stock_vllm import VLLMRoutes, skipped_parameters
from orchestrator.servers.client import InferenceClient
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


@pytest.mark.parametrize(
    ("status", "says"),
    [
        (401, "answered 401: the server's admin routes want a token this orchestrator does not hold; "),
        (500, "answered 500 while finding how the server loads weights; check the server's log, or set "),
    ],
)
def test_an_admin_route_that_refuses_or_fails_is_no_server_without_weight_routes(tmp_path, status, says):
    """A 401 from triad's admin routes (the orchestrator lacks the server's token) or a 500 taken
    for "no such route" would freeze the policy for the whole run: detection stops, naming it."""
    with FakeServer() as fake:
        fake.state.admin_status = status
        fake.state.vllm_routes = True  # a later route that answers must not be taken instead

        async def run() -> None:
            client = InferenceClient(fake.url, None, 30)
            try:
                await detect(client, "auto", tmp_path, timeout=30)
            finally:
                await client.close()

        with pytest.raises(TriadError) as caught:
            asyncio.run(run())
    assert str(caught.value).startswith(f"{fake.url}/admin/weights {says}"), str(caught.value)


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
                    "/weight_checker {'action': 'checksum'}",  # what it holds: the first load is checked too
                    "/weight_info",
                    "/pause {'mode': 'keep'}",
                    "/start_weight_update",
                    f"/update_weights {{'update_info': {{'path': '{target}'}}}}",
                    "/finish_weight_update {'weight_version': '1'}",
                    "/weight_info",
                    "/weight_checker {'action': 'checksum'}",  # checked before it serves again
                    "/resume",
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


def test_skipped_parameters_are_those_a_reload_to_another_version_left_unchanged():
    before = {"a": "1", "b": "2", "c": "3"}
    assert skipped_parameters(before, {"a": "9", "b": "2", "c": "8"}) == ["b"]
    # another version that changed nothing: every parameter skipped (the same version again is
    # not checked: VLLMRoutes.check_moved)
    assert skipped_parameters(before, dict(before)) == ["a", "b", "c"]
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


def vllm_backend_test(tmp_path: Path, body) -> FakeServer:
    """`body(backend, fake)` against a fake stock vLLM, with its RL routes."""
    with FakeServer() as fake:
        fake.state.vllm_routes = True

        async def run() -> None:
            client = InferenceClient(fake.url, None, 30)
            try:
                await body(await detect(client, "vllm", tmp_path, timeout=30), fake)
            finally:
                await client.close()

        asyncio.run(run())
        return fake


def test_a_failed_update_rolls_back_to_the_version_held_and_never_serves_a_broken_model(tmp_path: Path):
    v1, v2 = (str(tmp_path.resolve() / f"published/v{v}") for v in (1, 2))

    async def body(backend: VLLMRoutes, fake: FakeServer) -> None:
        await backend.load(1, "published/v1")
        held = dict(fake.state.vllm_checksums)
        fake.state.vllm_refuse = {v2}  # a delta directory: no .safetensors in it
        fake.state.vllm_calls.clear()
        with pytest.raises(
            TriadError, match=r"could not load version 2: .*answered 500: .*no \.safetensors"
        ) as e:
            await backend.load(2, "published/v2")
        assert "back to version 1" in str(e.value) and "\n" not in str(e.value)
        assert not isinstance(e.value, DigestMismatch)  # a failed load, not a skipped parameter
        assert fake.state.vllm_resumed_broken == 0 and not fake.state.vllm_broken
        assert fake.state.vllm_calls == [
            "/pause {'mode': 'keep'}",
            "/start_weight_update",
            f"/update_weights {{'update_info': {{'path': '{v2}'}}}}",
            "/start_weight_update",
            f"/update_weights {{'update_info': {{'path': '{v1}'}}}}",
            "/finish_weight_update {'weight_version': '1'}",
            "/weight_info",
            "/weight_checker {'action': 'checksum'}",
            "/resume",
        ]
        assert fake.state.vllm_checksums == held and (await backend.current()).version == 1
        fake.state.vllm_refuse.clear()
        assert (await backend.load(2, "published/v2")).version == 2  # the same version loads when it can

    vllm_backend_test(tmp_path, body)


def test_a_server_that_cannot_roll_back_stays_paused_rather_than_serve_a_broken_model(tmp_path: Path):
    async def body(backend: VLLMRoutes, fake: FakeServer) -> None:
        await backend.load(1, "published/v1")
        fake.state.vllm_refuse = {str(tmp_path.resolve() / f"published/v{v}") for v in (1, 2)}  # v1 pruned
        with pytest.raises(
            TriadError, match=r"could not load version 2: .*rolling back to version 1 failed"
        ) as e:
            await backend.load(2, "published/v2")
        assert "stays paused" in str(e.value) and "\n" not in str(e.value)
        assert fake.state.vllm_paused and fake.state.vllm_broken and fake.state.vllm_resumed_broken == 0
        fake.state.vllm_refuse.clear()
        assert (await backend.load(2, "published/v2")).version == 2  # a later load brings it back
        assert not fake.state.vllm_paused and not fake.state.vllm_broken

    vllm_backend_test(tmp_path, body)


def test_the_weight_checker_checks_the_first_load(tmp_path: Path):
    async def body(backend: VLLMRoutes, fake: FakeServer) -> None:
        fake.state.vllm_skip = {"b"}
        with pytest.raises(DigestMismatch, match=r"version 1 but 1 of 3 parameters .*\['b'\]"):
            await backend.load(1, "published/v1")
        assert fake.state.vllm_resumed_broken == 0 and (await backend.current()).version == 0  # rolled back

    vllm_backend_test(tmp_path, body)


def test_a_new_version_that_changed_no_parameter_is_caught_and_the_same_version_again_passes(tmp_path: Path):
    async def body(backend: VLLMRoutes, fake: FakeServer) -> None:
        await backend.load(1, "published/v1")
        assert (
            await backend.load(1, "published/v1")
        ).version == 1  # the same version again: nothing to change
        fake.state.vllm_skip = {"a", "b", "c"}
        with pytest.raises(DigestMismatch, match=r"version 2 but 3 of 3 parameters hold what they held"):
            await backend.load(2, "published/v2")

    vllm_backend_test(tmp_path, body)


def test_a_good_reload_after_a_bad_one_is_not_flagged(tmp_path: Path):
    async def body(backend: VLLMRoutes, fake: FakeServer) -> None:
        await backend.load(1, "published/v1")
        await backend.load(2, "published/v2")
        fake.state.vllm_skip = {"b"}
        with pytest.raises(DigestMismatch, match=r"\['b'\]"):
            await backend.load(3, "published/v3")
        fake.state.vllm_skip = set()
        assert (await backend.load(3, "published/v3")).version == 3

    vllm_backend_test(tmp_path, body)


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
