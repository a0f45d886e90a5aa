"""Environments against a real vLLM server that has no triad admin routes (vLLM's own).

- the multi-turn text calculator environment produces batches whose loss_mask is
  false exactly on the environment's tokens and whose input_ids re-tokenise to
  the rendered conversation;
- a run (orchestrator + torchrun trainer) uses an environment from a separate
  package found through its `triad.environments` entry point, with this plain
  server as the rollout backend: the policy stays frozen and the run says so;
- a chat environment against a model without a chat template stops at start, in one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from orchestrator.batches.builder import Group
from orchestrator.environments import load_environment
from orchestrator.loop import Orchestrator, connect_servers
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.pool import ServerPool
from shared.batch import publish_batch, read_batch
from shared.config import load_config
from shared.rundir import RunDir
from tests.helpers import REPO, run_triad, trainer_cmd, triad_cmd, write_env_plugin

pytestmark = pytest.mark.integration


def runs_of(mask: list[bool], value: bool, start: int) -> list[tuple[int, int]]:
    """[a, b) index ranges from `start` on where mask == value."""
    out, a = [], None
    for i in range(start, len(mask) + 1):
        inside = i < len(mask) and mask[i] == value
        if inside and a is None:
            a = i
        elif not inside and a is not None:
            out.append((a, i))
            a = None
    return out


def collect_calculator_batch(run_dir: Path, model: str, url: str) -> tuple[list[Group], list[dict]]:
    cfg = load_config(
        None,
        [
            f"run_dir={run_dir}",
            f"model={model}",
            f'orchestrator.servers.urls=["{url}"]',
            'orchestrator.environment.name="calculator_text"',
            "orchestrator.batch_size=3",
            "orchestrator.group_size=3",
            "orchestrator.sampling.max_tokens=8",
            "orchestrator.sampling.temperature=0.4",
            "max_steps=2",
        ],
    )
    rundir = RunDir(run_dir)
    run = rundir.ensure_run({})

    async def run_one_batch() -> list[Group]:
        clients = [InferenceClient(u, None, 60) for u in cfg.inference_urls()]
        servers = await connect_servers(cfg, clients, "")
        assert [s.backend.kind for s in servers] == ["none"]
        env = load_environment(cfg.orchestrator.environment.name)
        orch = Orchestrator(cfg, run.run_id, ServerPool(servers, cfg.orchestrator), env)
        await orch.weights.connect()
        producer = asyncio.create_task(orch.produce())
        batch, _, _ = await orch.assemble(1)
        publish_batch(
            rundir, run.run_id, 1, orch.builder.rows(1, batch), cfg.orchestrator.sampling.temperature
        )
        producer.cancel()
        await asyncio.gather(producer, return_exceptions=True)
        for client in clients:
            await client.close()
        return batch

    batch = asyncio.run(run_one_batch())
    assert rundir.rollouts.marker(1, run.run_id) is not None
    return batch, read_batch(rundir.batch_file(1)).to_pylist()


def test_multi_turn_batches_mask_exactly_the_environment_tokens(tmp_path, tiny_model, plain_server):
    batch, rows = collect_calculator_batch(tmp_path, tiny_model, plain_server.url)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    env = load_environment("calculator_text")
    samples = [(g.prompt, s) for g in batch for s in g.samples]
    assert len(rows) == len(samples) == 9
    replies_seen = retokenised = 0
    for row, (prompt, sample) in zip(rows, samples, strict=True):
        ids, mask, logprobs = row["input_ids"], row["loss_mask"], row["logprobs"]
        assert ids == sample.input_ids and row["env"] == "calculator_text"
        # the ids are the rendered conversation, and re-tokenise to themselves (unless the random
        # model sampled bytes that are not UTF-8: text cannot carry those, token ids do)
        if "\ufffd" not in tok.decode(ids):
            assert tok.decode(ids, skip_special_tokens=True) == prompt.text + sample.completion
            assert tok(tok.decode(ids), add_special_tokens=False).input_ids == ids
            retokenised += 1
        n_prompt = len(tok(prompt.text, add_special_tokens=False).input_ids)
        assert not any(mask[:n_prompt]) and mask[n_prompt]
        # replay the environment over the model's turns: its replies are exactly the masked runs
        turns = [tok.decode(ids[a:b], skip_special_tokens=True) for a, b in runs_of(mask, True, n_prompt)]
        env_runs = runs_of(mask, False, n_prompt)
        assert len(turns) == sample.turns == row_turns(row) and len(env_runs) == len(turns) - 1
        conversation = ""
        for turn, (a, b) in zip(turns, env_runs, strict=False):
            conversation += turn
            reply = env.respond(prompt, conversation)
            assert ids[a:b] == tok(reply, add_special_tokens=False).input_ids, (turn, reply)
            conversation += reply
            replies_seen += 1
        assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
        assert all(lp < 0.0 for lp, m in zip(logprobs, mask, strict=True) if m)
    assert retokenised >= len(rows) // 2, retokenised
    assert replies_seen > 0, "no episode had a second turn: the multi-turn path was not exercised"


def row_turns(row: dict) -> int:
    return json.loads(row["metrics"])["turns"]


def echo_run_sets(run_dir: Path, model: str, url: str, *extra: str) -> list[str]:
    """Three steps of the `echo` entry-point environment against a plain vLLM server."""
    return [
        f"run_dir={run_dir}",
        f"model={model}",
        "max_steps=3",
        f'orchestrator.servers.urls=["{url}"]',
        'orchestrator.environment.name="echo"',
        "orchestrator.batch_size=4",
        "orchestrator.group_size=4",
        "orchestrator.sampling.max_tokens=4",
        "trainer.batch_stall_s=300",
        "orchestrator.weights_stall_s=300",
        *extra,
    ]


def run_services(tmp_path: Path, plugins: Path, sets: list[str]) -> tuple[dict[str, int], dict[str, str]]:
    """The orchestrator and a 1-rank trainer with `sets` (a plain vLLM server's url among them: the
    policy stays frozen) and the environment packages under `plugins` importable, until both exit:
    their exit codes and logs, by name. Each service stops itself on its peer's lack of progress
    (`trainer.batch_stall_s`, `orchestrator.weights_stall_s`); the timeout is the test's backstop."""
    flags = [f"--set={s}" for s in sets]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(REPO)])}
    commands = {"orchestrator": triad_cmd("orchestrator", *flags), "trainer": trainer_cmd(*flags)}
    procs = {}
    try:
        for name, command in commands.items():
            with open(tmp_path / f"{name}.log", "w") as log:
                procs[name] = subprocess.Popen(
                    command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
                )
        codes = {name: p.wait(timeout=400) for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    return codes, {name: (tmp_path / f"{name}.log").read_text() for name in commands}


def test_frozen_policy_run_with_an_entry_point_environment(tmp_path, tiny_model, plain_server):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    write_env_plugin(plugins, "echo_env_pkg", "echo")
    run_dir = tmp_path / "run"
    sets = echo_run_sets(run_dir, tiny_model, plain_server.url, "trainer.optim.lr=1e-4")
    codes, text = run_services(tmp_path, plugins, sets)
    assert codes == {"orchestrator": 0, "trainer": 0}, text
    assert text["orchestrator"].count("the policy stays frozen") == 1
    rundir = RunDir(run_dir)
    for step in (1, 2, 3):
        batch = read_batch(rundir.batch_file(step)).to_pylist()
        assert {r["env"] for r in batch} == {"echo"} and {r["policy_version"] for r in batch} == {0}
    assert [r["step"] for r in rundir.metrics.rows("trainer")] == [1, 2, 3]
    orchestrator = rundir.metrics.rows("orchestrator")
    assert [r["step"] for r in orchestrator] == [1, 2, 3] and "reward/echo" in orchestrator[0]


def test_a_chat_environment_needs_a_chat_template(tmp_path, tiny_model, plain_server):
    """tiny-addition has no chat template: the orchestrator says so in one line, before any rollout."""
    sets = [
        f"run_dir={tmp_path / 'run'}",
        f"model={tiny_model}",
        'orchestrator.environment.name="calculator"',
        f'orchestrator.servers.urls=["{plain_server.url}"]',
    ]
    result = run_triad("orchestrator", *[f"--set={s}" for s in sets], timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "chat template" in errors[0], result.stderr
    assert not RunDir(tmp_path / "run").rollouts.steps()


def test_a_run_whose_prompts_are_sometimes_over_the_context_trains_every_step(
    tmp_path, tiny_model, plain_server
):
    """A batch's first requests go to vLLM as one request (`orchestrator/servers/coalesce.py`), which
    vLLM refuses whole for one prompt over its context (256 here): the run asks each prompt alone
    again, drops only the long prompts' groups (counted), and trains every step."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    write_env_plugin(plugins, "long_env_pkg", "echo")
    source = plugins / "long_env_pkg" / "__init__.py"
    short = 'return Prompt(text=f"{digit}+0=", answer=str(digit))'
    assert short in source.read_text()
    long = 'return Prompt(text=("x" * 400 if digit % 3 == 0 else "") + f"{digit}+0=", answer=str(digit))'
    source.write_text(source.read_text().replace(short, long))
    run_dir = tmp_path / "run"
    sets = echo_run_sets(run_dir, tiny_model, plain_server.url)
    codes, logs = run_services(tmp_path, plugins, sets)
    text = logs["orchestrator"]
    assert codes == {"orchestrator": 0, "trainer": 0}, text
    assert "Traceback" not in text
    rundir = RunDir(run_dir)
    assert [r["step"] for r in rundir.metrics.rows("trainer")] == [1, 2, 3]
    rows = rundir.metrics.rows("orchestrator")
    assert [r["samples"] for r in rows] == [16, 16, 16]  # every batch full, of short prompts only
    dropped = sum(r["groups_failed"] for r in rows)  # the long prompts' groups
    refusals = sum(r.get("requests_failed_http_400", 0) for r in rows)
    # each dropped group's own refusal, and before them their batches': a batch refused whole would
    # drop its short prompts' groups too, with one refusal for them all
    assert 0 < dropped < refusals, (dropped, refusals)
