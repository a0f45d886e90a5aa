"""The orchestrator's LoRA backend (`triad-lora`) against a fake admin client: which server
it can use (named in one line when it cannot), the paths it sends (relative to the server's
run directory) and the model names requests go to."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from orchestrator.servers.backends.detection import backend_for
from orchestrator.servers.backends.lora import AdapterLoads, run_dir_prefix
from shared.admin_api import AdapterInfo, AdaptersInfo
from shared.config import load_config
from shared.errors import TriadError
from shared.rundir import RunDir

URL = "http://10.0.0.7:8000"


class FakeAdminClient:
    """`InferenceClient.admin`'s adapter calls, over a list like the server's `GET /admin/adapters`."""

    def __init__(self, listed: AdaptersInfo | None) -> None:
        self.base_url, self.listed, self.loads = URL, listed, []
        self.admin = self  # the routes of `InferenceClient.admin`

    async def adapters(self) -> AdaptersInfo | None:
        return self.listed

    async def load_adapter(self, body, timeout: float) -> AdapterInfo:
        self.loads.append(body)
        held = AdapterInfo(
            name=body.name,
            run_id=body.run_id,
            version=body.version,
            served_as=f"{body.name}@v{body.version}",
            path=body.path,
            digest="d",
            tensor_digests={"a": "d"},
            loaded_at=0.0,
        )
        self.listed.adapters = [a for a in self.listed.adapters if a.name != body.name] + [held]
        return held


def backend(tmp_path: Path, listed: AdaptersInfo | None, *sets: str) -> AdapterLoads:
    cfg = load_config(None, [f"run_dir={tmp_path / 'server' / 'run-a'}", "trainer.lora.rank=4", *sets])
    return asyncio.run(backend_for(FakeAdminClient(listed), cfg, "r1"))


def listing(tmp_path: Path, lora: bool = True, **held) -> AdaptersInfo:
    adapters = [AdapterInfo(served_as="x@v1", path="p", loaded_at=0.0, **held)] if held else []
    return AdaptersInfo(lora=lora, run_dir=str((tmp_path / "server").resolve()), adapters=adapters)


def test_a_lora_run_loads_its_adapter_by_path_inside_the_servers_run_dir_and_addresses_it_by_name(tmp_path):
    b = backend(tmp_path, listing(tmp_path))
    assert b.kind == "triad-lora" and b.prefix == "run-a/" and b.name == "run-r1"
    assert asyncio.run(b.current()).version == 0 and b.model(0) is None  # the base model
    step_3 = RunDir(tmp_path).weights.relative(3)
    info = asyncio.run(b.load(3, step_3))
    assert b.client.loads[-1].path == f"run-a/{step_3}" and b.client.loads[-1].run_id == "r1"
    assert (info.version, info.path, info.tensor_digests) == (3, step_3, {"a": "d"})
    assert asyncio.run(b.current()).path == step_3 and b.model(3) == "run-r1@v3"
    named = backend(tmp_path, listing(tmp_path), "orchestrator.servers.adapter_name=policy-a")
    assert named.name == "policy-a" and named.model(2) == "policy-a@v2"


@pytest.mark.parametrize(
    "listed, expected",
    [
        (None, f"^{URL} has no /admin/adapters route: a LoRA run"),
        ("no-lora", f"^{URL} has no LoRA support: start it with inference.vllm_args = \\['--enable-lora'"),
        ("owned", f"^{URL}: adapter name 'run-r1' is owned by run 'r0', not this run 'r1'"),
    ],
)
def test_a_server_that_cannot_serve_the_runs_adapter_is_named_in_one_line(tmp_path, listed, expected):
    if listed == "no-lora":
        listed = listing(tmp_path, lora=False)
    elif listed == "owned":
        listed = listing(tmp_path, name="run-r1", run_id="r0", version=1)
    with pytest.raises(TriadError, match=expected) as e:
        backend(tmp_path, listed)
    assert "\n" not in str(e.value)


def test_a_run_dir_outside_the_servers_is_refused_naming_both(tmp_path):
    assert run_dir_prefix(tmp_path / "s", str(tmp_path / "s"), URL) == ""
    assert run_dir_prefix("s3://b/runs/a", "s3://b/runs/", URL) == "a/"
    with pytest.raises(TriadError, match=f"run_dir s3://b/other is not inside the run directory of {URL}"):
        run_dir_prefix("s3://b/other", "s3://b/runs", URL)
    with pytest.raises(TriadError, match="must keep its run_dir inside that one"):
        run_dir_prefix(tmp_path / "elsewhere", str(tmp_path / "s"), URL)
    with pytest.raises(TriadError, match=r"cannot load LoRA adapters: use 'triad'"):
        backend(tmp_path, listing(tmp_path), "inference.backend=sglang")


def test_rollouts_go_to_the_adapter_of_the_version_the_server_serves_and_the_base_model_at_0(tmp_path):
    from orchestrator.servers.client import InferenceClient
    from orchestrator.servers.pool import Server, ServerPool
    from tests.fake_openai import FakeServer

    cfg = load_config(None, [f"run_dir={tmp_path}"])
    with FakeServer() as fake:
        fake.state.adapters = ["other-run@v7"]  # listed before the base model, as vLLM may

        async def run() -> None:
            client = InferenceClient(fake.url, None, 30)
            try:
                await client.wait_ready(10, None)
                assert client.model == "fake"  # the base model, not another run's adapter
                server = Server(client, AdapterLoads(client, "mine", "r1", "", 30))
                pool = ServerPool([server], cfg.orchestrator)
                await pool.complete("1+1=", 2)
                server.version = 3
                await pool.complete("1+1=", 2)
                assert pool.take_requests()["requests_failed"] == 0
            finally:
                await client.close()

        asyncio.run(run())
        assert fake.state.models_asked == ["fake", "mine@v3"]
