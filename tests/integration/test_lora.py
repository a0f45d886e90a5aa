"""LoRA RL on a real torchrun FSDP2 trainer and a real vLLM server with `--enable-lora`: each
published adapter version, loaded by name, gives the trainer's logprobs; two runs, each with
its own orchestrator and trainer, share the server without failing each other's requests.

The server's model is the embedded one with its own lm_head (`untied_model`, Llama), and the
adapters take lm_head too (what lets LoRA change the logits' scale); the resume test trains the
tied Qwen2 one (`tiny_model`) on its inner linears."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import torch

from shared.admin_api import served_adapter_name
from shared.errors import TriadError
from shared.rundir import RunDir
from shared.waiting import wait_for
from tests.helpers import REPO, Server, trainer_cmd, triad_cmd
from tests.integration.test_trainer import make_batches, train

pytestmark = pytest.mark.integration
TOKEN = "s3cret"
STEPS = 3
RANK = ["trainer.lora.rank=8", "trainer.lora.alpha=16"]
LORA = [*RANK, "trainer.lora.target_modules=['q_proj','v_proj','o_proj','lm_head']"]
LORA_TIED = [*RANK, "trainer.lora.target_modules=['q_proj','v_proj','o_proj']"]  # the tied model's


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lora-run")


@pytest.fixture(scope="module")
def server(run_dir: Path, untied_model: str, tmp_path_factory):
    log = tmp_path_factory.mktemp("lora-logs") / "inference.log"
    lora_args = "inference.vllm_args=['--enable-lora','--max-lora-rank','8','--max-loras','4']"
    s = Server(run_dir, untied_model, log, f"inference.admin_token={TOKEN}", lora_args)
    try:
        s.wait_healthy()
        yield s
    finally:
        s.stop()


def load_adapter(server: Server, name: str, run_id: str, version: int, path: str) -> httpx.Response:
    body = dict(name=name, run_id=run_id, version=version, path=path)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    return httpx.post(server.url + "/admin/adapters", json=body, headers=headers, timeout=120)


def greedy(url: str, model: str, prompt: list[int]) -> tuple[list[int], list[float]]:
    body = dict(model=model, prompt=prompt, max_tokens=6, temperature=0.0, logprobs=0, return_token_ids=True)
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["token_ids"], choice["logprobs"]["token_logprobs"]


def transformers_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    from tests.reference import token_logprobs

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lps = token_logprobs(model(input_ids=ids).logits, ids, 1.0)[0]
    return lps[len(prompt) :].tolist()


def merged(model: str, adapter_dir: Path) -> torch.nn.Module:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().eval()


@pytest.mark.slow
def test_each_adapter_version_on_vllm_gives_the_trainers_greedy_logprobs(
    server: Server, run_dir: Path, untied_model: str
):
    make_batches(run_dir, untied_model, range(1, STEPS + 1))
    train(run_dir, untied_model, 2, *LORA, "trainer.optim.lr=1e-2", f"max_steps={STEPS}")
    rundir = RunDir(run_dir)
    run_id = rundir.read_run().run_id
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(3, 8))] for _ in range(4)]
    from transformers import AutoModelForCausalLM

    merged_base = AutoModelForCausalLM.from_pretrained(untied_model, dtype=torch.float32).eval()
    for version in range(1, STEPS + 1):
        marker = rundir.weights.marker(version, run_id)
        assert marker is not None and marker.adapter and marker.bytes < 200_000  # the adapter only
        r = load_adapter(server, "run-a", run_id, version, rundir.weights.relative(version))
        assert r.status_code == 200, r.text
        assert r.json()["served_as"] == f"run-a@v{version}" and r.json()["digest"] == marker.digest
        model = merged(untied_model, rundir.weights.path(version))
        gaps, moved = [], []
        for prompt in prompts:
            tokens, served = greedy(server.url, f"run-a@v{version}", prompt)
            gaps += [
                abs(a - b) for a, b in zip(served, transformers_logprobs(model, prompt, tokens), strict=True)
            ]
            plain = transformers_logprobs(merged_base, prompt, tokens)
            moved += [abs(a - b) for a, b in zip(served, plain, strict=True)]
        assert max(gaps) < 1e-3, (version, max(gaps))
        assert max(moved) > 1e-3  # the comparison can tell the adapter from the base model
        listed = httpx.get(
            server.url + "/admin/adapters", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()
        assert [(a["name"], a["run_id"], a["version"]) for a in listed["adapters"]] == [
            ("run-a", run_id, version)
        ]
    models = [m["id"] for m in httpx.get(server.url + "/v1/models", timeout=10).json()["data"]]
    assert f"run-a@v{STEPS}" in models and "run-a@v1" not in models  # old versions unloaded

    # a trainer that resumed from a checkpoint publishes version STEPS again with other weights
    # (here version 1's): the server serves those, not the adapter it holds under that name
    republish(rundir, run_id, source=1, version=STEPS)
    r = load_adapter(server, "run-a", run_id, STEPS, rundir.weights.relative(STEPS))
    assert r.status_code == 200 and r.json()["digest"] == rundir.weights.marker(STEPS, run_id).digest, r.text
    model = merged(untied_model, rundir.weights.path(STEPS))
    for prompt in prompts:
        tokens, served = greedy(server.url, f"run-a@v{STEPS}", prompt)
        expected = transformers_logprobs(model, prompt, tokens)
        assert max(abs(a - b) for a, b in zip(served, expected, strict=True)) < 1e-3


def republish(rundir: RunDir, run_id: str, source: int, version: int) -> None:
    """`version` written again, as the trainer writes it, with the adapter of `source`."""
    from safetensors.torch import load_file

    from shared.rundir import AdapterFiles
    from trainer.versions import Adapter, write_version

    source_dir = rundir.weights.path(source)
    state = load_file(AdapterFiles.file_at(source_dir))
    config = json.loads(AdapterFiles.config_at(source_dir).read_text())
    write_version(rundir, run_id, version, Adapter(state, config), keep_last=100)


@pytest.mark.slow
def test_an_adapter_name_another_run_owns_is_refused(server: Server, run_dir: Path):
    rundir = RunDir(run_dir)
    if not rundir.weights.done_steps(rundir.read_run().run_id):
        pytest.skip("needs the adapters the first test published")
    version = rundir.weights.newest(rundir.read_run().run_id)
    r = load_adapter(server, "run-a", "some-other-run", version, rundir.weights.relative(version))
    assert r.status_code == 409
    owner = rundir.read_run().run_id
    assert f"adapter name 'run-a' is owned by run {owner!r}, not 'some-other-run'" in r.text, r.text
    r = load_adapter(server, "run-b", "some-other-run", version, rundir.rollouts.relative(1))
    assert r.status_code in (400, 409) and "run-b" not in str(httpx.get(server.url + "/v1/models").json())


def write_untrained_adapters(run_dir: Path, model: str, run_id: str, versions: range) -> dict[int, str]:
    """A LoRA adapter (rank 8, as peft starts it) for `model`, published in `run_dir` as each of
    `versions` the way the trainer publishes one; each version's path as a load request names it."""
    from transformers import AutoModelForCausalLM

    from shared.config import LoraConfig
    from trainer.lora import adapter_config, adapter_state, wrap_lora
    from trainer.versions import Adapter, write_version

    wrapped = wrap_lora(AutoModelForCausalLM.from_pretrained(model), LoraConfig(rank=8, alpha=16))
    state = {k: v.contiguous() for k, v in adapter_state(wrapped, wrapped.state_dict()).items()}
    rundir = RunDir(run_dir)
    for version in versions:
        write_version(rundir, run_id, version, Adapter(state, adapter_config(wrapped)), keep_last=10)
    return {version: f"{run_dir.name}/{rundir.weights.relative(version)}" for version in versions}


@pytest.mark.slow
def test_a_request_in_flight_keeps_generating_while_another_runs_adapter_loads(
    server: Server, run_dir: Path, untied_model: str
):
    """An adapter load goes through vLLM's model registry without pausing the scheduler (a full
    weight load pauses it): a streamed request stays in flight through the `/admin/adapters`
    call and gets every token it asked for.

    How long generation stands still is not asserted: vLLM's engine core adds the adapter
    between two steps, and on a warm server that is most of the call (measured: 0.128 s of a
    0.177 s load here, 0.085 s of 0.095 s in CI), so a pause around the whole call would look
    the same. The server's first load is long on the API side (1.35 s here, 46 tokens during
    it); `tests/unit/test_adapter_idle.py` asserts that no load pauses the engine."""
    paths = write_untrained_adapters(run_dir / "streaming", untied_model, "streaming-run", range(1, 9))
    body = dict(
        model=untied_model, prompt="1+2=", max_tokens=220, ignore_eos=True, stream=True, return_token_ids=True
    )
    # the 220 tokens take 0.6-1.0 s and a load 0.04-0.8 s here: when the stream ended first, nothing
    # was in flight at the load's end, and the next version's load is tried on a new stream
    for version, path in paths.items():
        arrivals, tokens, started, ended, r = stream_through_load(server, body, path, version)
        assert r.status_code == 200, r.text
        if arrivals[-1] > ended:
            break
    assert arrivals[-1] > ended, (
        f"the stream ended before each of {len(paths)} loads did: nothing was in flight"
    )
    assert len(tokens) == 220, f"the request in flight got {len(tokens)} of its 220 tokens"
    during = [started, *(t for t in arrivals if started < t < ended), ended]
    longest = max(b - a for a, b in zip(during, during[1:], strict=False))
    took = ended - started
    print(f"{len(during) - 2} tokens during the {took:.3f} s adapter load, the longest gap {longest:.3f} s")


def stream_through_load(
    server: Server, body: dict, path: str, version: int
) -> tuple[list[float], list[int], float, float, httpx.Response]:
    """A streamed request, and once its first 5 tokens came, the load of adapter `version`: the
    tokens' arrival times, the tokens, when the load started and ended, and its answer."""
    import threading

    arrivals: list[float] = []
    tokens: list[int] = []

    def stream() -> None:
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())
                    tokens.extend(json.loads(line.removeprefix("data: "))["choices"][0]["token_ids"] or [])

    reader = threading.Thread(target=stream)
    reader.start()

    def streaming() -> bool | None:
        assert reader.is_alive() or len(arrivals) >= 5, f"the stream ended after {len(arrivals)} tokens"
        return len(arrivals) >= 5 or None

    wait_for(streaming, "the streamed request's first 5 tokens", 120, poll=0.01)
    started = time.monotonic()
    r = load_adapter(server, "streaming", "streaming-run", version, path)
    ended = time.monotonic()
    reader.join(120)
    return arrivals, tokens, started, ended, r


def adapter_tensors(run_dir: Path, version: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    from shared.rundir import AdapterFiles

    return load_file(AdapterFiles.file_at(RunDir(run_dir).weights.path(version)))


@pytest.mark.slow
def test_a_resumed_lora_run_equals_a_straight_one_and_checkpoints_only_the_adapter(
    tiny_model: str, tmp_path: Path
):
    straight, split = tmp_path / "straight", tmp_path / "split"
    for run_dir in (straight, split):
        make_batches(run_dir, tiny_model, range(1, 5))
    sets = [*LORA_TIED, "trainer.optim.lr=1e-2", "trainer.checkpoint.every=2", "trainer.batch_stall_s=20"]
    train(straight, tiny_model, 2, *sets, "max_steps=4")
    train(split, tiny_model, 2, *sets, "max_steps=2")
    for step in (1, 2):  # a trainer that did not resume would wait for these and time out
        RunDir(split).rollouts.clear(step)
    train(split, tiny_model, 2, *sets, "max_steps=4")  # resumes from the checkpoint after update 2
    a, b = adapter_tensors(straight, 4), adapter_tensors(split, 4)
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6
    state = RunDir(split).trainer_state_dir(2)
    checkpoint_bytes = sum(f.stat().st_size for f in state.rglob("*") if f.is_file())
    model_bytes = sum(f.stat().st_size for f in Path(tiny_model).glob("*.safetensors"))
    assert checkpoint_bytes < model_bytes / 4  # adapter and its Adam moments, not the base model


SHARED_STEPS = 6


def lora_run(run_dir: Path, model: str, server: Server, service: str, *extra: str) -> subprocess.Popen:
    """`triad <service>` of a LoRA run in `run_dir` on the shared server, logging beside it."""
    sets = [
        f"run_dir={run_dir}",
        f"model={model}",
        f"max_steps={SHARED_STEPS}",
        "max_async_level=1",
        *LORA,
        "trainer.optim.lr=1e-3",
        "trainer.checkpoint.every=0",
        "weights.keep=100",
        "trainer.batch_stall_s=240",
        f"inference.admin_token={TOKEN}",
        f'orchestrator.servers.urls=["{server.url}"]',
        "orchestrator.batch_size=4",
        "orchestrator.group_size=4",
        "orchestrator.sampling.max_tokens=8",
        "orchestrator.keep_rollouts=100",
        "orchestrator.servers.ready_timeout_s=240",
        *extra,
    ]
    cmd = triad_cmd(service, *[f"--set={s}" for s in sets])
    if service == "trainer":
        cmd = trainer_cmd(*cmd[4:])
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir.parent / f"{run_dir.name}-{service}.log", "ab")  # noqa: SIM115 (the child keeps it)
    return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def finish(procs: dict[str, subprocess.Popen], root: Path) -> None:
    for name, proc in procs.items():
        try:
            code = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = "(killed after 600 s)"
        log = (root / f"{name}.log").read_text(errors="replace")[-4000:]
        assert code == 0, f"{name} exited {code}:\n{log}"


def loaded_versions(server_dir: Path, runs: dict[str, Path]) -> dict[str, list[int]]:
    """The adapter versions the shared server loaded for each run so far."""
    loads = [r for r in RunDir(server_dir).metrics.rows("inference") if r.get("run_id")]
    versions: dict[str, list[int]] = {name: [] for name in runs}
    for name, path in runs.items():
        try:
            run_id = RunDir(path).read_run().run_id
        except TriadError:  # not created yet
            continue
        versions[name] = [r["version"] for r in loads if r["run_id"] == run_id]
    return versions


def interleave(server_dir: Path, runs: dict[str, Path], procs: dict[str, subprocess.Popen]) -> None:
    """Make the two runs overlap whatever their start-up times: the first run to load a trained
    version has its trainer stopped (SIGSTOP) until the other run loads one too. Each run alone
    takes a few seconds, and on CI's 2 cores one trainer's start-up once took longer than the
    other's whole run."""

    def trained(name: str) -> bool:
        return any(v >= 1 for v in loaded_versions(server_dir, runs)[name])

    def wait(until, what: str) -> None:
        def done() -> bool | None:
            exited = {n: p.returncode for n, p in procs.items() if p.poll() not in (None, 0)}
            assert not exited, f"waiting for {what}, these exited: {exited}"
            return until() or None

        wait_for(done, what, 600, poll=0.2)

    wait(lambda: any(trained(n) for n in runs), "trained adapter of either run")
    held = next(n for n in runs if trained(n))
    other = next(n for n in runs if n != held)
    trainer = procs[f"{held}-trainer"]
    os.killpg(trainer.pid, signal.SIGSTOP)  # torchrun and its worker: their own session
    try:
        assert max(loaded_versions(server_dir, runs)[held]) < SHARED_STEPS, "held after its last version"
        wait(lambda: trained(other), f"a trained adapter of run {other} while {held} is held")
    finally:
        os.killpg(trainer.pid, signal.SIGCONT)


def audit(run_dir: Path) -> list[int]:
    """Every sample's lag (batch step - 1 - its policy version), over all batches."""
    import pyarrow.parquet as pq

    rundir = RunDir(run_dir)
    lags = []
    for step in range(1, SHARED_STEPS + 1):
        versions = pq.read_table(rundir.batch_file(step), columns=["policy_version"]).column(0).to_pylist()
        lags += [step - 1 - v for v in versions]
    return lags


@pytest.mark.slow
def test_two_lora_runs_share_one_server_and_a_third_naming_ones_adapter_is_refused(
    server: Server, run_dir: Path, untied_model: str
):
    runs = {name: run_dir / name for name in ("a", "b")}
    procs = {
        f"{name}-{service}": lora_run(path, untied_model, server, service)
        for name, path in runs.items()
        for service in ("orchestrator", "trainer")
    }
    try:
        interleave(run_dir, runs, procs)
        finish(procs, run_dir)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    run_ids = {name: RunDir(path).read_run().run_id for name, path in runs.items()}
    loads = [r for r in RunDir(run_dir).metrics.rows("inference") if r.get("run_id")]
    for name, path in runs.items():
        lags = audit(path)
        assert max(lags) <= 1 and min(lags) >= 0 and 1 in lags, (name, lags)
        rows = RunDir(path).metrics.rows("orchestrator")
        assert sum(r["requests_failed"] for r in rows) == 0 and sum(r["groups_failed"] for r in rows) == 0
        mine = [r for r in loads if r["run_id"] == run_ids[name]]
        versions = [r["version"] for r in mine]  # a version published right after another may be skipped
        assert versions == sorted(set(versions)) and versions[-1] == SHARED_STEPS and len(versions) >= 3, mine
        # each version was an adapter load beside the base model, never a reload of the base weights
        # (how long a load takes is bench/lora_sharing.py's figure: 0.69 s here once, on 2 busy cores)
        assert all(r["adapter"] == served_adapter_name(f"run-{run_ids[name]}", r["version"]) for r in mine)
    base = [r for r in RunDir(run_dir).metrics.rows("inference") if not r.get("run_id")]
    assert [r["version"] for r in base] == [0], base  # the server's start; no base reload after it
    # the one server loaded both runs' adapters while both ran (`interleave` holds the faster one):
    # between A's first and last load, B's loads were under way. What sharing costs is a speed
    # figure, bench/lora_sharing.py's (a run's samples/s alone and shared): a timed assertion here
    # failed on CI's 2 cores (one request that overlapped a load of B was 0.5 s slower, one sample)
    times = {name: sorted(r["loaded_at"] for r in loads if r["run_id"] == run_ids[name]) for name in runs}
    assert times["a"][0] < times["b"][-1] and times["b"][0] < times["a"][-1], times
    third_sets = [
        f"run_dir={run_dir / 'c'}",
        f"model={untied_model}",
        "trainer.lora.rank=8",
        f"inference.admin_token={TOKEN}",
        f'orchestrator.servers.urls=["{server.url}"]',
        f"orchestrator.servers.adapter_name=run-{run_ids['a']}",
    ]
    third = subprocess.run(
        triad_cmd("orchestrator", *[f"--set={s}" for s in third_sets]),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert third.returncode == 2, third.stderr[-3000:]
    assert third.stderr.strip().splitlines()[-1] == (
        f"triad orchestrator: error: {server.url}: adapter name 'run-{run_ids['a']}' is owned by run "
        f"{run_ids['a']!r}, not this run {RunDir(run_dir / 'c').read_run().run_id!r}: set another "
        "orchestrator.servers.adapter_name"
    ), third.stderr[-3000:]
