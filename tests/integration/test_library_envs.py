"""Environments from task libraries, trained for a few steps: a real vLLM server, a real torchrun trainer.

Plain vLLM servers (the policy stays frozen; the trainer still trains on every batch) serve the
embedded chat model `builtin:tiny-tools` and, for text prompts, the base `builtin:tiny-addition`.
Each test recomputes every row's reward with the library itself, from the text of the row's own
token ids:

- reasoning-gym's `basic_arithmetic`, text and chat prompts: the dataset's `score_answer`;
- a verifiers environment written by the test (two model turns, a rubric of two functions),
  run by verifiers' own rollout through the agent proxy: the rubric's functions and weights.
"""

from __future__ import annotations

import json
import re

import pytest
from transformers import AutoTokenizer

from orchestrator.environments import load_environment
from shared.batch import read_batch
from shared.rundir import RunDir
from tests.helpers import write_verifiers_env
from tests.integration.test_chat import answered_turns, config, runs, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 3
NO_THINKING = {"enable_thinking": False}
# the learning config's task (configs/tiny-reasoning-gym.toml): sums the base model scores on
ARITH = {
    "min_terms": 2,
    "max_terms": 2,
    "max_digits": 1,
    "operators": ["+"],
    "allow_parentheses": False,
    "allow_negation": False,
}


def rows_of(run_dir) -> list[dict]:
    rundir = RunDir(run_dir)
    return [r for step in range(1, STEPS + 1) for r in read_batch(rundir.batch_file(step)).to_pylist()]


def texts(row: dict, tok) -> tuple[str, list[str]]:
    """The row's prompt as text, and each model turn's text."""
    parts = runs(row["loss_mask"])
    prompt = tok.decode(row["input_ids"][: parts[0][2]], skip_special_tokens=True)
    return prompt, [
        tok.decode(row["input_ids"][a:b], skip_special_tokens=True).strip() for v, a, b in parts if v
    ]


@pytest.mark.parametrize("chat", [False, True], ids=["text-prompts", "chat-prompts"])
def test_a_reasoning_gym_task_trains_and_its_rewards_are_the_librarys_scores(
    tmp_path, request, chat, chat_model, tiny_model
):
    """Text prompts to the embedded base model (its digits often contain the sum: partial credit),
    chat prompts (the default) to the embedded chat model, rendered with its template."""
    import reasoning_gym as rg

    model, url = (
        (chat_model, request.getfixturevalue("chat_server").url)
        if chat
        else (tiny_model, request.getfixturevalue("plain_server").url)
    )
    args = {"config": ARITH, "system_prompt": "none", "answer_tag": False, "size": 300, "chat": chat}
    config_toml = (
        'config={min_terms=2,max_terms=2,max_digits=1,operators=["+"],'
        "allow_parentheses=false,allow_negation=false}"
    )
    cfg, flags = config(
        tmp_path / "run",
        model,
        url,
        "reasoning_gym:basic_arithmetic",
        f'orchestrator.environment.args={{{config_toml},system_prompt="none",answer_tag=false,size=300,chat={str(chat).lower()}}}',
        "orchestrator.sampling.max_tokens=2",
        f"max_steps={STEPS}",
        "orchestrator.group_size=8",
    )
    assert cfg.orchestrator.environment.args == args
    train(
        cfg,
        flags,
        load_environment(cfg.orchestrator.environment.name, cfg.orchestrator.environment.args),
        tmp_path / "trainer.log",
    )
    dataset = rg.create_dataset("basic_arithmetic", **ARITH, seed=0, size=300)
    entries = [dataset[i] for i in range(300)]
    tok = AutoTokenizer.from_pretrained(model)
    rows = rows_of(cfg.run_dir)
    assert len(rows) == STEPS * 4 * 8
    scores = []
    for row in rows:
        prompt, turns = texts(row, tok)
        if chat:  # the answer the environment got: the server's reasoning parser splits off `<think>...`
            turns = [m.get("content") or "" for m in answered_turns(row, tok, url, tools=[])]
        if "\ufffd" in turns[-1]:
            continue  # sampled bytes that are not UTF-8: the server's text and this decoding differ
        asked = [
            e
            for e in entries
            if (f"user\n{e['question']}\n" in prompt if chat else prompt == f"{e['question']}\n")
        ]
        assert asked and len({e["answer"] for e in asked}) == 1, prompt
        want = dataset.score_answer(turns[-1], asked[0])
        assert row["reward"] == pytest.approx(want) == json.loads(row["metrics"])["env_reward"], (
            turns,
            asked[0],
        )
        scores.append(want)
    # the base model samples many lone bytes: 46 of 96 rows were UTF-8 in one run
    assert len(scores) >= len(rows) // 4, f"only {len(scores)} of {len(rows)} rows were UTF-8"
    print(
        f"reasoning-gym ({'chat' if chat else 'text'}): {len(scores)} samples, mean reward "
        f"{sum(scores) / len(scores):.3f}, {sum(s > 0 for s in scores)} above 0"
    )
    # whether any sample scores is chance (a frozen policy on a new prompt format); non-zero
    # scores against the library's are checked in tests/unit/test_env_adapters.py
    trainer_rows = RunDir(cfg.run_dir).metrics.rows("trainer")
    assert [r["step"] for r in trainer_rows] == list(range(1, STEPS + 1))


def test_a_verifiers_environment_runs_its_own_rollouts_and_rubric(
    tmp_path, chat_model, chat_server, monkeypatch
):
    write_verifiers_env(tmp_path, "vf_two_turns")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg, flags = config(
        tmp_path / "run",
        chat_model,
        chat_server.url,
        "verifiers:vf_two_turns",
        "orchestrator.sampling.max_tokens=24",
        f"max_steps={STEPS}",
        # the prompt closes the think block: the chat model rarely writes `</think>` now, and
        # vLLM's qwen3 parser reads a reply without it as reasoning, so the rubric (which reads
        # content) saw an empty reply in 48 of 48 samples in two runs of three
        "orchestrator.chat.template_kwargs={enable_thinking=false}",
    )
    assert cfg.orchestrator.chat.template_kwargs == NO_THINKING
    train(cfg, flags, load_environment(cfg.orchestrator.environment.name), tmp_path / "trainer.log")
    tok = AutoTokenizer.from_pretrained(chat_model)
    rows = rows_of(cfg.run_dir)
    assert len(rows) == STEPS * 4 * 4  # one chain per episode: the second call extends the first
    for row in rows:
        prompt, _ = texts(row, tok)
        # each turn as verifiers got it through the proxy: read by the server's own parsers (the
        # template's empty think block in the prompt; its tool calls, none offered)
        replies = answered_turns(row, tok, chat_server.url, tools=[], template_kwargs=NO_THINKING)
        # verifiers ends a rollout at an empty reply (no content, tool call or reasoning) and leaves it out
        last = replies[-1]
        empty = not (
            last.get("content") or last.get("tool_calls") or last.get("reasoning_content") is not None
        )
        kept = replies[:-1] if empty else replies
        reply = (kept[-1].get("content") or "") if kept else ""
        a, b, c = map(int, re.search(r"(\d+)\*(\d+)\+(\d+)=\?", prompt).groups())
        contains = 1.0 if str(a * b + c) in reply else 0.0
        brevity = max(0.0, 1.0 - len(reply) / 64)
        metrics = json.loads(row["metrics"])
        assert (
            len(replies) == metrics["turns"] and metrics["env/num_turns"] == len(kept) and len(replies) <= 2
        )
        assert metrics["env/contains_answer"] == contains and metrics["env/brevity"] == pytest.approx(brevity)
        assert row["reward"] == pytest.approx(contains + 0.5 * brevity) == metrics["env_reward"], replies
    steps = RunDir(cfg.run_dir).metrics.rows("orchestrator")
    by_step = [rows[i * 16 : (i + 1) * 16] for i in range(STEPS)]
    for logged, batch in zip(steps, by_step, strict=True):
        mean = sum(json.loads(r["metrics"])["env/brevity"] for r in batch) / len(batch)
        assert logged["env/brevity"] == pytest.approx(mean) and "env/contains_answer" in logged
    assert len({round(r["reward"], 6) for r in rows}) > 1, "the rubric gave every sample the same reward"
