"""LoRA RL on a real torchrun FSDP2 trainer and a real vLLM server with `--enable-lora`: each
published adapter version, loaded by name, gives the trainer's logprobs."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
import torch

from shared.rundir import RunDir
from tests.helpers import Server
from tests.integration.test_trainer import make_batches, train

pytestmark = pytest.mark.integration
TOKEN = "s3cret"
STEPS = 3
LORA = [
    "trainer.lora.rank=8",
    "trainer.lora.alpha=16",
    "trainer.lora.target_modules=['q_proj','v_proj','o_proj']",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lora-run")


@pytest.fixture(scope="module")
def server(run_dir: Path, tiny_model: str, tmp_path_factory):
    log = tmp_path_factory.mktemp("lora-logs") / "inference.log"
    lora_args = "inference.vllm_args=['--enable-lora','--max-lora-rank','8','--max-loras','2']"
    s = Server(run_dir, tiny_model, log, f"inference.admin_token={TOKEN}", lora_args)
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
    from trainer.loss import token_logprobs

    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        lps = token_logprobs(model(input_ids=ids).logits, ids, 1.0)[0]
    return lps[len(prompt) :].tolist()


def merged(tiny_model: str, adapter_dir: Path) -> torch.nn.Module:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload().eval()


@pytest.mark.slow
def test_each_adapter_version_on_vllm_gives_the_trainers_greedy_logprobs(
    server: Server, run_dir: Path, tiny_model: str
):
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    train(run_dir, tiny_model, 2, *LORA, "trainer.optim.lr=1e-2", f"max_steps={STEPS}")
    rundir = RunDir(run_dir)
    run_id = rundir.read_run().run_id
    rng = random.Random(3)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(3, 8))] for _ in range(4)]
    from transformers import AutoModelForCausalLM

    merged_base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    for version in range(1, STEPS + 1):
        marker = rundir.weights.marker(version, run_id)
        assert marker is not None and marker.adapter and marker.bytes < 200_000  # the adapter only
        r = load_adapter(server, "run-a", run_id, version, rundir.weights.relative(version))
        assert r.status_code == 200, r.text
        assert r.json()["served_as"] == f"run-a@v{version}" and r.json()["digest"] == marker.digest
        model = merged(tiny_model, rundir.weights.path(version))
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


@pytest.mark.slow
def test_an_adapter_name_another_run_owns_is_refused(server: Server, run_dir: Path, tiny_model: str):
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
    sets = [*LORA, "trainer.optim.lr=1e-2", "trainer.checkpoint.every=2", "trainer.batch_timeout_s=20"]
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
