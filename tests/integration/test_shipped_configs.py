"""Every shipped config's chat set-up starts: the Qwen3 configs' environments, with their own
orchestrator settings, against a stock vLLM server (`CHAT_VLLM_ARGS`) serving the embedded chat model,
which carries the real Qwen3 chat template. Each environment starts (its template and parser checks)
and makes one group of rollouts."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from orchestrator.environments import load_environment
from orchestrator.episodes import episodes_for
from orchestrator.failures import Failures
from orchestrator.servers.backends.frozen import Frozen
from orchestrator.servers.client import InferenceClient
from orchestrator.servers.pool import Server, ServerPool
from shared.config import load_config
from tests.helpers import REPO

pytestmark = [pytest.mark.integration]
CONFIGS = sorted(p.name for p in (REPO / "configs").glob("qwen3-*.toml"))


@pytest.mark.parametrize("name", CONFIGS)
def test_each_qwen3_configs_environment_starts_and_rolls_out_a_group(
    name: str, tmp_path: Path, chat_model: str, chat_server
) -> None:
    sets = [
        f"run_dir={tmp_path}",
        f"model={chat_model}",
        f'orchestrator.servers.urls=["{chat_server.url}"]',
    ]
    cfg = load_config(REPO / "configs" / name, sets)
    oc = cfg.orchestrator
    assert oc.chat.text_prompts and oc.chat.template_kwargs == {"enable_thinking": False}
    env = load_environment(oc.environment.name, oc.environment.args)

    async def run():
        client = InferenceClient(chat_server.url, None, 120)
        try:
            await client.wait_ready(60, None)
            pool = ServerPool([Server(client, Frozen())], oc)
            episodes = episodes_for(env, pool, oc, cfg.inference.tool_parser, Failures(oc.max_failed_groups))
            prompt = env.sample(random.Random(0))
            await episodes.start(prompt)
            return await episodes.group(prompt, 2)
        finally:
            await client.close()

    samples = asyncio.run(run())
    tokenizer = AutoTokenizer.from_pretrained(chat_model)
    assert len(samples) == 2
    for sample in samples:
        sampled = [i for i, m in enumerate(sample.loss_mask) if m]
        assert sampled and sampled[0] > 0, "a prompt, then sampled ids"
        assert all(sample.logprobs[i] <= 0 for i in sampled)
        assert sample.conversation[0]["role"] == "assistant"
        # thinking off reached the template: its generation prompt ends with the empty think block
        assert tokenizer.decode(sample.input_ids[: sampled[0]]).endswith("<think>\n\n</think>\n\n")
