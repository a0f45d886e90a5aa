"""`auto` parsers for a family shared/families.py does not list, served by real vLLM.

A tiny Seed-OSS model (random weights; the vendored Seed-OSS template and special tokens on Qwen3's BPE,
tests/templates.py) is served by `triad inference` with `tool_parser = reasoning_parser = "auto"`. The
parsers are those that read back the template's own rendering (inference/parser_probe.py), and a chat tool
episode goes through them: the orchestrator's start check of the server's parsers, the template's own tool
call turn parsed into a call and reasoning by the server's derender, the tool's result rendered back, and a
turn the model samples parsed.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from inference.parser_probe import auto_parsers
from orchestrator.client import Completion, InferenceClient
from orchestrator.pool import ServerPool
from orchestrator.turns import TurnParser, pool_renderer
from shared.config import load_config
from shared.families import chat_template_of, family_of
from tests.helpers import Server, server_tracebacks
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
    cfg = load_config(None, [f"run_dir={run_dir}", f'orchestrator.inference_urls=["{url}"]'])
    client = InferenceClient(url, None, 120)
    await client.wait_ready(120, None)
    try:
        from orchestrator.backends.frozen import Frozen
        from orchestrator.pool import Server as PoolServer

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
