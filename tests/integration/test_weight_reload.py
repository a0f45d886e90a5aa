"""In-place weight reload on a real vLLM server, against a fresh server, and admin access."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import pytest
import torch

from shared.rundir import RunDir, step_name
from tests.helpers import Server

pytestmark = pytest.mark.integration
TOKEN = "s3cret"
PROMPTS = ["reverse abcd: ", "reverse hello: ", "reverse xyz: "]


def perturbed_weights(
    model_dir: str, rundir: RunDir, version: int, seed: int, without: tuple[str, ...] = ()
) -> Path:
    """Publish the tiny model with noise added (tied embeddings included) as `version`; the
    tensors named in `without` left out (the marker vouches for the rest)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.publish import export_state_dict
    from trainer.versions import FullWeights, Metadata, write_version

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    state = export_state_dict(model.state_dict(), tied_embeddings=True, dtype=torch.float32)
    state = {name: tensor for name, tensor in state.items() if name not in without}
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def metadata(d: Path) -> None:
        model.config.save_pretrained(d)
        tokenizer.save_pretrained(d)

    write_version(rundir, "test-run", version, FullWeights(state, Metadata(rundir, metadata)), keep_last=10)
    return rundir.weights.path(version)


def greedy_logprobs(url: str, model: str) -> list[list[float]]:
    out = []
    for prompt in PROMPTS:
        body = dict(model=model, prompt=prompt, max_tokens=6, temperature=0.0, logprobs=0)
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        r.raise_for_status()
        out.append(r.json()["choices"][0]["logprobs"]["token_logprobs"])
    return out


def model_id(url: str) -> str:
    return httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]


def admin(server: Server, method: str, token: str | None = TOKEN, headers=None, **kw) -> httpx.Response:
    headers = {**(headers or {}), **({"Authorization": f"Bearer {token}"} if token else {})}
    return httpx.request(method, server.url + "/admin/weights", headers=headers, timeout=120, **kw)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("reload-run")


@pytest.fixture(scope="module")
def server(run_dir: Path, tiny_model: str, tmp_path_factory):
    log = tmp_path_factory.mktemp("server-logs") / "a.log"
    s = Server(run_dir, tiny_model, log, f"inference.admin_token={TOKEN}")
    try:
        s.wait_healthy()
        yield s
    finally:
        s.stop()


@pytest.mark.slow
def test_reloaded_weights_match_a_fresh_server(server: Server, run_dir: Path, tiny_model: str, tmp_path):
    rundir = RunDir(run_dir)
    before = greedy_logprobs(server.url, model_id(server.url))
    step_dir = perturbed_weights(tiny_model, rundir, version=1, seed=1)
    relative = rundir.weights.relative(1)  # a path relative to run_dir, as the orchestrator sends
    r = admin(server, "POST", json={"version": 1, "path": relative})
    assert r.status_code == 200, r.text
    info = admin(server, "GET").json()
    assert {k: info[k] for k in ("version", "path", "base_path")} == {
        "version": 1,
        "path": relative,
        "base_path": tiny_model,
    }
    marker = rundir.weights.marker(1, "test-run")
    assert info["digest"] == marker.digest and info["tensor_digests"] == marker.tensor_digests
    log = Path(server.log.name).read_text(errors="replace")
    assert "Reloading and processing weights took" in log  # written after the layers' warnings
    assert not [x for x in log.splitlines() if "Failed to load weights" in x]  # the tied head: DEBUG
    reloaded = greedy_logprobs(server.url, model_id(server.url))

    fresh = Server(run_dir, str(step_dir), tmp_path / "fresh.log")
    try:
        fresh.wait_healthy()
        reference = greedy_logprobs(fresh.url, model_id(fresh.url))
    finally:
        fresh.stop()
    for got, want in zip(reloaded, reference, strict=True):
        assert len(got) == len(want)
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-3, (got, want)
    assert any(  # the reload really changed the model
        abs(a - b) > 1e-2 for g, w in zip(before, reloaded, strict=True) for a, b in zip(g, w, strict=False)
    )


def test_admin_rejects_bad_requests_and_keeps_weights(server: Server, run_dir: Path, tiny_model: str):
    rundir = RunDir(run_dir)
    served = admin(server, "GET").json()
    good = perturbed_weights(tiny_model, rundir, version=2, seed=2)
    outside = run_dir.parent / "outside"
    shutil.copytree(good, outside, dirs_exist_ok=True)
    link = rundir.weights.path(2).parent / "escape"  # beside the step directories
    link.symlink_to(outside, target_is_directory=True)
    incomplete = rundir.weights.path(3)
    incomplete.mkdir(parents=True)
    truncated = perturbed_weights(tiny_model, rundir, version=4, seed=4)
    data = rundir.weights_file(4).read_bytes()
    rundir.weights_file(4).write_bytes(data[: len(data) // 2])
    garbage = perturbed_weights(tiny_model, rundir, version=5, seed=5)
    rundir.weights_file(5).write_bytes(b"\x00" * 64)

    cases = [
        (dict(token=None, json={"version": 2, "path": str(good)}), 401),
        (dict(token="wrong", json={"version": 2, "path": str(good)}), 401),
        (dict(json={"version": 2, "path": str(outside)}), 400),
        (dict(json={"version": 2, "path": str(run_dir / ".." / "outside")}), 400),
        (dict(json={"version": 2, "path": str(link)}), 400),
        (dict(json={"version": 3, "path": str(incomplete)}), 409),
        (dict(json={"version": 4, "path": str(truncated)}), 400),
        (dict(json={"version": 5, "path": str(garbage)}), 400),
        (dict(json={"version": 4, "path": str(good)}), 400),  # the marker says version 2
        (dict(json={"version": "two", "path": str(good)}), 422),
        (dict(json={"path": str(good)}), 422),
        (dict(json={"version": 2, "path": str(good), "extra": 1}), 422),
        (dict(content=b"not json", headers={"content-type": "application/json"}), 422),
    ]
    for kwargs, status in cases:
        r = admin(server, "POST", **kwargs)
        assert r.status_code == status, (kwargs, r.status_code, r.text)
        if status == 400 and kwargs["json"]["path"] in (str(truncated), str(garbage)):
            assert "not a valid safetensors file" in r.text, r.text
            assert step_name(kwargs["json"]["version"]) in r.text, r.text  # names the step directory
        assert admin(server, "GET").json() == served
    assert admin(server, "GET", token=None).status_code == 401
    rundir.weights.write_marker(3, "test-run")  # a marker alone vouches for no weights
    assert admin(server, "POST", json={"version": 3, "path": str(incomplete)}).status_code == 400


def test_a_parameter_the_reload_skipped_fails_the_load(server: Server, run_dir: Path, tiny_model: str):
    """A version whose files lack a parameter, with a marker vouching for what is there: every
    digest matches, but vLLM reports the parameter unloaded, and the load must fail."""
    rundir = RunDir(run_dir)
    # versions of their own: the module's tests share one run directory, and another counts loads of 7 and 8
    perturbed_weights(tiny_model, rundir, version=11, seed=7, without=("model.norm.weight",))
    r = admin(server, "POST", json={"version": 11, "path": rundir.weights.relative(11)})
    assert r.status_code == 500, r.text
    assert admin(server, "GET").json()["version"] == -1  # half-loaded weights are no version
    line = "left 1 parameter(s) of the model without a value: model.norm.weight"
    assert line in Path(server.log.name).read_text()
    perturbed_weights(tiny_model, rundir, version=12, seed=8)  # a whole version loads again
    r = admin(server, "POST", json={"version": 12, "path": rundir.weights.relative(12)})
    assert r.status_code == 200 and r.json()["version"] == 12, r.text


def flip_tensor_byte(file: Path) -> str:
    """Flip one byte inside the data of the file's last tensor (same size, header intact);
    return that tensor's name."""
    import json
    import struct

    data = bytearray(file.read_bytes())
    header_len = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + header_len])
    name, entry = max(
        ((n, e) for n, e in header.items() if n != "__metadata__"),
        key=lambda item: item[1]["data_offsets"][0],
    )
    start, end = entry["data_offsets"]
    data[8 + header_len + (start + end) // 2] ^= 0x40
    file.write_bytes(bytes(data))
    return name


def follower_for(run_dir: Path, server: Server):
    """The orchestrator's weight follower over this server, as `triad orchestrator` builds it."""
    from orchestrator.servers.backends.admin_routes import TriadAdmin
    from orchestrator.servers.client import InferenceClient
    from orchestrator.servers.pool import Server as PoolServer
    from orchestrator.servers.pool import ServerPool
    from orchestrator.weights.follower import WeightFollower
    from shared.config import load_config

    cfg = load_config(None, [f"run_dir={run_dir}", f"inference.admin_token={TOKEN}"])
    client = InferenceClient(server.url, TOKEN, 120)
    pool = ServerPool([PoolServer(client, TriadAdmin(client, 120))], cfg.orchestrator)

    async def nothing() -> None:
        return None

    return WeightFollower(cfg, RunDir(run_dir), "test-run", pool, nothing), client


def loads_of(run_dir: Path, version: int) -> int:
    from shared.rundir import INFERENCE

    return sum(1 for row in RunDir(run_dir).metrics.rows(INFERENCE) if row["step"] == version)


@pytest.mark.slow
def test_a_file_changed_after_done_is_reloaded_once_then_stops_the_run_naming_the_tensor(
    server: Server, run_dir: Path, tiny_model: str
):
    import asyncio

    from orchestrator.servers.backends.base import DigestMismatch

    rundir = RunDir(run_dir)
    perturbed_weights(tiny_model, rundir, version=7, seed=7)
    perturbed_weights(tiny_model, rundir, version=8, seed=8)
    flipped = flip_tensor_byte(rundir.weights_file(8))

    async def run() -> None:
        follower, client = follower_for(run_dir, server)
        pool_server = follower.pool.servers[0]
        try:
            await follower.load(pool_server, 7)  # the correct file: verified, served
            assert pool_server.version == 7 and pool_server.healthy
            with pytest.raises(DigestMismatch) as caught:
                await follower.load(pool_server, 8)
            message = str(caught.value)
            assert server.url in message and "version 8" in message and f"tensor {flipped!r}" in message
        finally:
            await client.close()

    asyncio.run(run())
    assert loads_of(run_dir, 7) == 1 and loads_of(run_dir, 8) == 2  # reloaded once, then stopped


@pytest.mark.parametrize("token", ["wrong", None])
def test_an_orchestrator_without_the_servers_admin_token_stops_in_one_line(
    server: Server, tiny_model: str, tmp_path, token: str | None
):
    """The server's admin routes answer 401 to it: taken for a server without them, the run would
    train on the base model's samples for its whole length; it stops before any rollout, naming
    the route and the token."""
    from tests.helpers import run_triad

    run_dir = tmp_path / "run"
    sets = [f"run_dir={run_dir}", f"model={tiny_model}", f'orchestrator.servers.urls=["{server.url}"]']
    if token:
        sets.append(f"inference.admin_token={token}")
    result = run_triad("orchestrator", *[f"--set={s}" for s in sets], timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert errors == [
        f"triad orchestrator: error: {server.url}/admin/weights answered 401: the server's admin routes "
        "want a token this orchestrator does not hold; give it the server's inference.admin_token "
        "(or admin_token_file)"
    ], result.stderr
    assert not RunDir(run_dir).rollouts.steps()
