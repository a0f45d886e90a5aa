"""`auto` parsers for a family inference/families.py does not list, served by real vLLM.

A tiny Seed-OSS model (random weights; the vendored Seed-OSS template and special tokens on Qwen3's BPE,
tests/templates.py) is served by `triad inference` with `tool_parser = reasoning_parser = "auto"`. The
parsers are those that read back the template's own rendering (inference/parser_probe.py), and a chat tool
episode goes through them: the orchestrator's start check of the server's parsers, the template's own tool
call turn parsed into a call and reasoning by the server's derender, the tool's result rendered back, and a
turn the model samples parsed. And a call the server's parser cannot read is one line in its log.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from inference.families import chat_template_of, family_of
from inference.parser_probe import auto_parsers
from orchestrator.episodes.turns import TurnParser, pool_renderer
from orchestrator.servers.client import ChatRoutes, Completion, InferenceClient
from orchestrator.servers.pool import ServerPool
from shared.config import load_config
from tests.helpers import CHAT_VLLM_ARGS, Server, server_tracebacks
from tests.templates import family_tokenizer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]
USER = {"role": "user", "content": "What is 2+3?"}
REPLY = {
    "role": "assistant",
    "content": "",
    "reasoning_content": "I add two and three with the calculator.",
    "tool_calls": [
        {
            "id": "call00000",
            "type": "function",
            "function": {"name": "calc", "arguments": json.dumps({"expression": "2+3"})},
        }
    ],
}


def seed_oss_model(dest: Path) -> Path:
    import torch
    from transformers import GenerationConfig, SeedOssConfig, SeedOssForCausalLM

    tokenizer = family_tokenizer("seed_oss")
    torch.manual_seed(0)
    config = SeedOssConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.eos_token_id,
        torch_dtype="float32",
    )
    SeedOssForCausalLM(config).save_pretrained(dest)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id).save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


async def episode(url: str, run_dir: Path) -> None:
    cfg = load_config(None, [f"run_dir={run_dir}", f'orchestrator.servers.urls=["{url}"]'])
    client = InferenceClient(url, None, 120)
    await client.wait_ready(120, None)
    try:
        from orchestrator.servers.backends.frozen import Frozen
        from orchestrator.servers.pool import Server as PoolServer

        pool = ServerPool([PoolServer(client, Frozen())], cfg.orchestrator)
        renderer = pool_renderer(pool, TOOLS, {})
        parser = TurnParser(pool, TOOLS, {}, "auto")
        await parser.check(renderer, "calc")  # the orchestrator's start check of the server's parsers

        prompt = await renderer.prompt([USER])
        full = await renderer.render([USER, REPLY], False)
        assert full[: len(prompt)] == prompt
        written = full[len(prompt) :]  # the template's own turn, ending on <seed:eos>
        turn = await parser.parse(Completion(prompt, written, [], "", False, "stop"), prompt, None)
        assert [(c.name, c.arguments) for c in turn.calls] == [("calc", {"expression": "2+3"})]
        assert turn.reasoning is not None and turn.reasoning.strip() == REPLY["reasoning_content"]
        assert not turn.errors and not turn.content.strip()

        result = {"role": "tool", "tool_call_id": "call00000", "content": "5"}
        after = await renderer.render([USER, REPLY, result], True)
        assert after[: len(full)] == full and len(after) > len(full)
        sampled = (await client.complete(after, 1, 8, 1.0))[0]
        parsed = await parser.parse(sampled, after, None)
        assert isinstance(parsed.content, str)
    finally:
        await client.close()


def test_auto_serves_a_family_no_table_lists_with_the_parsers_that_read_its_template_back(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TRIAD_CACHE", str(tmp_path / "cache-test"))
    model = seed_oss_model(tmp_path / "seed-oss-tiny")
    template = chat_template_of(model)
    assert template is not None and family_of(template) is None
    assert auto_parsers(str(model), template, "auto", "auto") == ("seed_oss", "seed_oss")

    monkeypatch.setenv("TRIAD_CACHE", str(tmp_path / "cache-server"))  # the server reads it back itself
    server = Server(tmp_path / "run", str(model), tmp_path / "inference.log", "inference.max_model_len=1024")
    try:
        server.wait_healthy(600)
        asyncio.run(episode(server.url, tmp_path / "run"))
    finally:
        server.stop()
    log = (tmp_path / "inference.log").read_text(errors="replace")
    assert server_tracebacks(log) == []
    assert [p.read_text() for p in (tmp_path / "cache-server" / "parsers").glob("*.json")] == [
        '{"tool_parser": "seed_oss", "reasoning_parser": "seed_oss"}'
    ]


@pytest.mark.parametrize("backend", ["triad", "vllm"])
def test_a_tool_call_the_servers_parser_cannot_read_is_one_line_in_its_log(tmp_path, chat_model, backend):
    """vLLM's hermes parser logs a traceback for each call it cannot read (a chat soak's log held
    a hundred in 20 steps); the server logs one warning instead, and the call comes back as content.
    `triad inference` adds the filter after vLLM configured its logging; a stock `vllm serve`
    (backend vllm) reads it from the logging configuration triad gives it
    (inference/model_output_log.py)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    vllm_args = f"inference.vllm_args={json.dumps(list(CHAT_VLLM_ARGS))}"
    sets = (vllm_args, f"inference.backend={backend}")
    server = Server(tmp_path / "run", chat_model, tmp_path / "inference.log", *sets)
    messages = [{"role": "user", "content": "What is 2+3?"}]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    cut = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+\n</tool_call><|im_end|>'

    async def derender() -> dict | None:
        client = InferenceClient(server.url, None, 60)
        try:
            await client.wait_ready(60, None)
            ids = tokenizer.encode(cut, add_special_tokens=False)
            return await ChatRoutes(client).derender(ids, "stop", messages, TOOLS, {}, prompt)
        finally:
            await client.close()

    try:
        server.wait_healthy(600)
        message = asyncio.run(derender())
    finally:
        server.stop()
    assert message is not None and message["content"].startswith('<tool_call>\n{"name": "calc"')
    assert not message.get("tool_calls")
    log = (tmp_path / "inference.log").read_text(errors="replace")
    assert server_tracebacks(log) == []
    [line] = [x for x in log.splitlines() if "Error in extracting tool call" in x]
    assert " WARNING " in line and "JSONDecodeError: " in line and line.endswith("(the model's output)")
