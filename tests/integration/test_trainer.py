"""The real torchrun FSDP2 trainer on batches written by the test (no inference needed)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from shared.batch import publish_batch
from shared.rundir import TRAINER, RunDir
from shared.waiting import wait_for
from tests import helpers
from tests.helpers import REPO, free_port, wait_until_gone

pytestmark = pytest.mark.integration
STEPS = 4


def make_batches(
    run_dir: Path,
    model_dir: str,
    steps: range,
    seed: int = 0,
    sampler_noise: float = 0.0,
    temperature: float = 1.0,
) -> None:
    """Batches of random prompt/completion tokens sampled (as far as the trainer can
    tell) by the base model: version 0, with its logprobs as the sampler's, or with
    `sampler_noise` those plus Gaussian noise (a sampler that differs from the base model).
    The logprobs are at temperature 1; the marker says `temperature`."""
    from transformers import AutoModelForCausalLM

    from tests.reference import token_logprobs

    rundir = RunDir(run_dir)
    run_id = rundir.ensure_run({}).run_id
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for step in steps:
        rng = random.Random(f"{seed}-{step}")  # batch n is the same whichever call writes it
        noise = random.Random(f"noise-{seed}-{step}")
        rows = []
        for i in range(8):
            prompt = [rng.randrange(256) for _ in range(rng.randint(3, 6))]
            completion = [rng.randrange(256) for _ in range(rng.randint(1, 5))]
            ids = prompt + completion
            with torch.no_grad():
                lps = token_logprobs(model(input_ids=torch.tensor([ids])).logits, torch.tensor([ids]), 1.0)[0]
            mask = [False] * len(prompt) + [True] * len(completion)
            rows.append(
                dict(
                    sample_id=f"{step}-{i}",
                    group_id=f"{step}-{i // 4}",
                    step=step,
                    policy_version=0,
                    input_ids=ids,
                    loss_mask=mask,
                    logprobs=[
                        lp + noise.gauss(0, sampler_noise) if m else 0.0
                        for lp, m in zip(lps.tolist(), mask, strict=True)
                    ],
                    advantage=rng.uniform(-1, 1),
                    reward=0.0,
                    truncated=False,
                    env="test",
                    metrics="{}",
                )
            )
        publish_batch(rundir, run_id, step, rows, temperature=temperature)


def trainer_cmd(
    run_dir: Path, model: str, nproc: int, *sets: str, launch: tuple[str, ...] = ("--standalone",)
) -> list[str]:
    # A realistic RL learning rate. Adam normalises each gradient element, so float rounding
    # (which differs with the rank count) in near-zero elements becomes an update of up to lr:
    # measured 3.4e-5 apart at lr 1e-4 after 4 steps, so rank equivalence is checked at 1e-5.
    base = [f"run_dir={run_dir}", f"model={model}", f"max_steps={STEPS}", "trainer.optim.lr=1e-5"]
    base += ["trainer.checkpoint.every=2", "weights.keep=10", "trainer.batch_stall_s=120"]
    return helpers.trainer_cmd(
        *[f"--set={s}" for s in [*base, *sets]], nproc=nproc, launch=launch or ("--standalone",)
    )


def run_trainer(run_dir: Path, model: str, nproc: int, *sets: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        trainer_cmd(run_dir, model, nproc, *sets), cwd=REPO, capture_output=True, text=True, timeout=300
    )


def train(run_dir: Path, model: str, nproc: int, *sets: str) -> None:
    r = run_trainer(run_dir, model, nproc, *sets)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def final_weights(run_dir: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(RunDir(run_dir).weights_file(step))


def model_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face model directory's safetensors files."""
    return {k: v for f in RunDir.tensor_files_at(model_dir) for k, v in load_file(f).items()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tiny_model) -> Path:
    run_dir = tmp_path_factory.mktemp("straight")
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    train(run_dir, tiny_model, nproc=2)
    return run_dir


def test_one_rank_equals_two_ranks(straight: Path, tiny_model: str, tmp_path: Path):
    run_dir = tmp_path / "one-rank"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    train(run_dir, tiny_model, nproc=1)
    base = model_weights(Path(tiny_model))
    assert max_diff(final_weights(straight), base) > 2e-5  # training really moved the weights
    assert max_diff(final_weights(run_dir), final_weights(straight)) < 1e-5


def test_killed_and_resumed_equals_straight(straight: Path, tiny_model: str, tmp_path: Path):
    run_dir = tmp_path / "resumed"
    make_batches(run_dir, tiny_model, range(1, 3))  # only batches 1 and 2 exist at first
    proc = subprocess.Popen(
        trainer_cmd(run_dir, tiny_model, 2),
        cwd=REPO,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoints = RunDir(run_dir).checkpoints

    def checkpointed() -> bool | None:
        if checkpoints.has_marker(2):
            return True
        assert proc.poll() is None, f"the trainer exited ({proc.returncode}) before checkpointing step 2"
        return None

    wait_for(checkpointed, checkpoints.describe_marker(2), 240, poll=0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # kill -9 of torchrun while the ranks wait for batch 3
    proc.wait()
    # torchrun starts each rank in a session of its own: they must die with it, not train on
    assert wait_until_gone(str(run_dir)) == [], "trainer ranks outlived their torchrun"
    make_batches(run_dir, tiny_model, range(3, STEPS + 1))
    train(run_dir, tiny_model, nproc=2)
    assert max_diff(final_weights(run_dir), final_weights(straight)) < 1e-6


def test_micro_batches_equal_one_batch(straight: Path, tiny_model: str, tmp_path: Path):
    run_dir = tmp_path / "micro"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    train(run_dir, tiny_model, 2, "trainer.parallel.micro_batch_tokens=16")  # several micro-batches per rank
    trainer_rows = RunDir(run_dir).metrics.rows("trainer")
    assert all(r["micro_batches"] > 1 for r in trainer_rows)
    assert max_diff(final_weights(run_dir), final_weights(straight)) < 1e-5


def test_two_nodes_on_one_machine_equal_one_node(straight: Path, tiny_model: str, tmp_path: Path):
    """`torchrun --nnodes 2` with a c10d rendezvous, both "nodes" on this machine."""
    run_dir = tmp_path / "two-nodes"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    port = free_port()
    nodes = [
        subprocess.Popen(
            trainer_cmd(
                run_dir,
                tiny_model,
                1,
                launch=(
                    "--nnodes=2",
                    f"--node-rank={rank}",
                    "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}",
                    "--rdzv-id=triad-test",
                ),
            ),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=300)[0].decode() for node in nodes]
    assert [n.returncode for n in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert max_diff(final_weights(run_dir), final_weights(straight)) < 1e-5


def test_activation_checkpointing_changes_nothing(straight: Path, tiny_model: str, tmp_path: Path):
    run_dir = tmp_path / "checkpointed-activations"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    train(run_dir, tiny_model, 2, "trainer.parallel.activation_checkpointing=true")
    assert max_diff(final_weights(run_dir), final_weights(straight)) < 1e-6


def checkpointed_model(tiny_model: str, run_dir: Path, step: int) -> torch.nn.Module:
    """The trainer's own model after update `step`: its DCP checkpoint, loaded unsharded."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=RunDir(run_dir).trainer_state_dir(step))
    model.load_state_dict(state["model"])
    return model.eval()


def sequence_logprobs(model: torch.nn.Module, sequences: list[list[int]]) -> list[list[float]]:
    """log p(token t | tokens < t) for t >= 1, as the trainer computes it."""
    from tests.reference import token_logprobs

    out = []
    with torch.no_grad():
        for s in sequences:
            ids = torch.tensor([s])
            out.append(token_logprobs(model(input_ids=ids).logits, ids, 1.0)[0, 1:].tolist())
    return out


def vllm_prompt_logprobs(url: str, model: str, sequences: list[list[int]]) -> list[list[float]]:
    import httpx

    out = []
    for ids in sequences:
        body = dict(model=model, prompt=ids, max_tokens=1, temperature=1.0, echo=True, logprobs=0)
        r = httpx.post(url + "/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["logprobs"]["token_logprobs"][1 : len(ids)])
    return out


@pytest.mark.slow
def test_published_weights_give_the_trainers_logprobs_in_transformers_and_vllm(
    straight: Path, tiny_model: str, tmp_path: Path
):
    """weights/step_4 (HF layout) in transformers and in vLLM = the trainer's model after update 4."""
    from transformers import AutoModelForCausalLM

    from tests.helpers import Server

    rng = random.Random(7)
    sequences = [[rng.randrange(256) for _ in range(rng.randint(4, 12))] for _ in range(6)]
    published = str(RunDir(straight).weights.path(STEPS))
    trainer = sequence_logprobs(checkpointed_model(tiny_model, straight, STEPS), sequences)
    hf = sequence_logprobs(AutoModelForCausalLM.from_pretrained(published, dtype=torch.float32), sequences)
    base = sequence_logprobs(AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32), sequences)
    server = Server(tmp_path, published, tmp_path / "vllm.log", plain=True)
    try:
        server.wait_healthy()
        served = vllm_prompt_logprobs(server.url, published, sequences)
    finally:
        server.stop()

    def gap(a: list[list[float]], b: list[list[float]]) -> float:
        return max(abs(x - y) for s, t in zip(a, b, strict=True) for x, y in zip(s, t, strict=True))

    assert gap(hf, trainer) < 1e-5
    assert gap(served, trainer) < 1e-3
    assert gap(base, trainer) > 1e-3  # the comparison can tell trained weights from the base model


def test_packed_micro_batches_equal_one_batch(straight: Path, tiny_model: str, tmp_path: Path):
    run_dir = tmp_path / "packed"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    train(run_dir, tiny_model, 2, "trainer.parallel.packing=true", "trainer.parallel.micro_batch_tokens=24")
    trainer_rows = RunDir(run_dir).metrics.rows("trainer")
    assert all(r["micro_batches"] > 1 for r in trainer_rows)
    assert max_diff(final_weights(run_dir), final_weights(straight)) < 1e-5


def test_sharded_publish_equals_the_gathered_one(straight: Path, tiny_model: str, tmp_path: Path):
    """Each rank writes the parameters it owns; the shards with their index load in transformers."""
    from transformers import AutoModelForCausalLM

    run_dir = tmp_path / "sharded"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    train(run_dir, tiny_model, 2, "weights.sharded=true")
    rundir = RunDir(run_dir)
    step_dir = rundir.weights.path(STEPS)
    shards = RunDir.tensor_files_at(step_dir)
    assert shards == [rundir.shard_file(STEPS, rank, 2) for rank in range(2)], shards  # no single file
    merged = {k: v for shard in shards for k, v in load_file(shard).items()}
    assert max_diff(merged, final_weights(straight)) < 1e-6
    loaded = AutoModelForCausalLM.from_pretrained(step_dir, dtype=torch.float32).state_dict()
    assert max((loaded[k] - v).abs().max().item() for k, v in merged.items()) == 0.0


def plain_loop(
    model_dir: str, run_dir: Path, lr: float, slices: int, spec, proximal: bool, reference: bool
) -> dict[str, torch.Tensor]:
    """The reference algorithm in one process, no FSDP: each batch cut into `slices` contiguous
    optimizer steps; with `proximal`, the ratio's denominator comes from a no-grad forward pass
    before the batch's first step; with `reference`, the KL penalty is to the frozen base model."""
    import numpy as np
    from transformers import AutoModelForCausalLM

    from shared.batch import read_batch
    from tests.reference import token_logprobs
    from trainer.data import collate
    from trainer.loss import BatchTotals, policy_loss

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def logprobs(m: torch.nn.Module, batch) -> torch.Tensor:
        logits = m(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        return token_logprobs(logits, batch.input_ids, 1.0)

    for step in range(1, STEPS + 1):
        rows = read_batch(RunDir(run_dir).batch_file(step)).to_pylist()
        parts = [
            collate([rows[i] for i in idx], pad_id=0) for idx in np.array_split(np.arange(len(rows)), slices)
        ]
        with torch.no_grad():
            prox = [logprobs(model, b) if proximal else None for b in parts]
            ref = [logprobs(base, b) if reference else None for b in parts]
        for batch, lp_prox, lp_ref in zip(parts, prox, ref, strict=True):
            totals = BatchTotals(len(batch.advantages), int(batch.loss_mask.sum()))
            policy_loss(
                logprobs(model, batch),
                batch.sampler_logprobs,
                batch.advantages,
                batch.loss_mask,
                spec,
                totals,
                logp_prox=lp_prox,
                logp_ref=lp_ref,
            ).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    return model.state_dict()


@pytest.mark.slow
def test_decoupled_mini_batches_and_reference_kl_equal_a_plain_loop(tiny_model: str, tmp_path: Path):
    """AReaL's decoupled PPO over 2 optimizer steps per batch (proximal policy from a no-grad
    forward pass) with a KL penalty to the frozen base model, on 2 FSDP2 ranks, against the
    plain single-process algorithm; the plain loop with the proximal policy taken as the
    current weights, or the KL taken to the sampler, ends measurably elsewhere."""
    from shared.config import LossConfig

    run_dir = tmp_path / "decoupled"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1), sampler_noise=0.3)
    lr = 1e-3
    spec = LossConfig(eps_low=0.05, eps_high=0.05, importance="tis", importance_cap=1.2, kl_coef=0.5)
    train(
        run_dir,
        tiny_model,
        2,
        f"trainer.optim.lr={lr}",
        "trainer.optim.optimizer_steps=2",
        "trainer.loss.eps_low=0.05",
        "trainer.loss.eps_high=0.05",
        "trainer.loss.importance=tis",
        "trainer.loss.importance_cap=1.2",
        "trainer.loss.kl_coef=0.5",
        "trainer.loss.kl_target=reference",
    )
    trained = final_weights(run_dir)

    def gap(**variant: bool) -> float:
        plain = plain_loop(tiny_model, run_dir, lr, 2, spec, **variant)
        return max_diff(trained, {k: plain[k] for k in trained})

    exact, no_proximal, sampler_kl = (
        gap(proximal=True, reference=True),
        gap(proximal=False, reference=True),
        gap(proximal=True, reference=False),
    )
    measured = (
        f"trainer vs plain {exact:.2e}; without proximal {no_proximal:.2e}; KL to sampler {sampler_kl:.2e}"
    )
    # at lr 1e-3 (so that the first step moves the policy visibly) Adam turns rank-dependent
    # rounding into differences of a few 1e-6 (measured 5e-6); the mistakes cost 1e-2
    assert exact < 5e-5, measured
    assert no_proximal > 100 * exact and sampler_kl > 100 * exact, measured
    rows = RunDir(run_dir).metrics.rows("trainer")
    assert [r["optimizer_steps"] for r in rows] == [2] * STEPS
    assert all(r["clip_frac"] > 0 and r["ref_kl"] > 0 for r in rows)


def test_compiled_blocks_change_nothing(straight: Path, tiny_model: str, tmp_path: Path):
    """`trainer.parallel.compile`: decoder blocks through torch.compile (inductor, C++ on CPU), 2 ranks."""
    run_dir = tmp_path / "compiled"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1))
    train(run_dir, tiny_model, 2, "trainer.parallel.compile=true")
    assert max_diff(final_weights(run_dir), final_weights(straight)) < 1e-6


def test_mismatch_kl_compares_the_sampler_with_the_weights_the_update_started_from(
    tiny_model: str, tmp_path: Path
):
    """Two optimizer steps on a batch sampled by the base model itself, without proximal
    logprobs: the second slice's own logprobs are of weights the first step moved (lr 1e-2),
    which is not the sampler's mismatch; only the first slice counts, and it matches."""
    run_dir = tmp_path / "run"
    make_batches(run_dir, tiny_model, range(1, 2))
    train(run_dir, tiny_model, 1, "max_steps=1", "trainer.optim.optimizer_steps=2", "trainer.optim.lr=1e-2")
    (row,) = RunDir(run_dir).metrics.rows(TRAINER)
    assert row["optimizer_steps"] == 2 and row["mismatch_kl"] < 1e-6, row


def test_the_drift_alarm_fires_when_the_sampler_temperature_differs(
    straight: Path, tiny_model: str, tmp_path
):
    """Batches sampled at temperature 1 whose marker says 0.5: the trainer's logprobs are
    sharper than the sampler's on every step (mismatch KL about 3.5 per token on this model),
    so with the default limit it warns on update 1 and stops on update 2. The matched run
    (`straight`) stays silent under the default."""
    matched = [r["mismatch_kl"] for r in RunDir(straight).metrics.rows(TRAINER)]
    assert len(matched) == STEPS and max(matched) < 0.05  # measured: at most 8.6e-3
    run_dir = tmp_path / "run"
    make_batches(run_dir, tiny_model, range(1, STEPS + 1), temperature=0.5)
    r = run_trainer(run_dir, tiny_model, 1, "trainer.mismatch_kl_steps=2")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out[-3000:]
    assert "step 1: mismatch KL" in out and "over trainer.max_mismatch_kl = 1 (1 of 2 in a row" in out, out[
        -3000:
    ]
    assert "step 2: mismatch KL" in out and "for 2 updates in a row" in out, out[-3000:]
    rows = RunDir(run_dir).metrics.rows(TRAINER)
    assert [row["step"] for row in rows] == [1] and rows[0]["mismatch_kl"] > 1.0


def test_a_batch_marker_without_a_temperature_stops_the_trainer_in_one_line(tiny_model: str, tmp_path):
    """The marker's temperature divides the trainer's logits: a marker without one (written by
    another producer) stops the trainer before that step, in one line naming it, rather than
    train it at temperature 1; the steps before it are trained."""
    run_dir = tmp_path / "run"
    make_batches(run_dir, tiny_model, range(1, 3))
    rundir = RunDir(run_dir)
    run_id = rundir.read_run().run_id
    fields = rundir.rollouts.marker(2, run_id).model_dump(
        exclude={"run_id", "step", "created_at", "temperature"}
    )
    rundir.rollouts.write_marker(2, run_id, **fields)
    r = run_trainer(run_dir, tiny_model, 1, "max_steps=2")
    out = r.stdout + r.stderr
    rank = out.split("failed (exitcode: 2)")[0]  # what torchrun prints after it is its own report
    assert r.returncode != 0 and "failed (exitcode: 2)" in out and "Traceback" not in rank, out[-3000:]
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].endswith(
        f"{rundir.rollouts.describe_marker(2)} holds no sampling temperature (temperature = None): its batch "
        "was not written by this orchestrator's publish_batch; remove that step's directory and restart "
        "the orchestrator"
    ), out[-3000:]
    assert [row["step"] for row in rundir.metrics.rows(TRAINER)] == [1]
