"""Rollout requests are streamed (`InferenceClient.complete`, for a bound on each token rather
than on the whole generation): against a real vLLM server, the streamed chunks, joined, are the
token ids, logprobs, text and finish reason vLLM answers the same request with unstreamed, and
each sample of a request gets its own tokens and their own logprobs."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from orchestrator.servers.client import InferenceClient
from tests.helpers import Server

pytestmark = pytest.mark.integration


def unstreamed(server: Server, model: str, prompt: str | list[int], n: int, max_tokens: int) -> list[dict]:
    body = dict(
        model=model,
        prompt=prompt,
        n=n,
        max_tokens=max_tokens,
        temperature=0.0,
        logprobs=0,
        return_token_ids=True,
    )
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"]


def complete(server: Server, prompt: str | list[int], n: int, temperature: float):
    async def streamed():
        client = InferenceClient(server.url, None, 60)
        try:
            await client.wait_ready(60, None)
            return client.model, await client.complete(prompt, n, 40, temperature)
        finally:
            await client.close()

    return asyncio.run(streamed())


# plain prompts, the first whose greedy answer runs to max_tokens is used: the chat model is built
# on each machine, and its weights (so where its greedy answer ends) differ between CPUs (on an AMD
# EPYC, "1+2=" was answered with its end of turn alone)
LONG_ANSWER_PROMPTS = ("1+2=", "Hello, ", "The answer is", "What is 7*8?", "<tool_call>")


def long_answer_prompt(server: Server) -> str:
    """A prompt whose unstreamed greedy answer runs to 40 tokens: several streamed chunks."""
    model = httpx.get(server.url + "/v1/models", timeout=60).json()["data"][0]["id"]
    for prompt in LONG_ANSWER_PROMPTS:
        if unstreamed(server, model, prompt, 1, 40)[0]["finish_reason"] == "length":
            return prompt
    raise AssertionError(f"the greedy answer to each of {LONG_ANSWER_PROMPTS} ends before 40 tokens")


def test_a_streamed_sample_is_what_vllm_answers_unstreamed(chat_server: Server):
    """The chat model's greedy answer to a plain prompt runs to `max_tokens`: several chunks."""
    prompt = long_answer_prompt(chat_server)
    model, (got,) = complete(chat_server, prompt, 1, 0.0)  # greedy: vLLM asks n = 1
    (want,) = unstreamed(chat_server, model, prompt, 1, 40)
    assert len(got.token_ids) == 40 and got.finish_reason == "length"
    assert got.prompt_ids == want["prompt_token_ids"]
    assert got.token_ids == want["token_ids"]
    assert got.text == want["text"]
    assert got.logprobs == pytest.approx(want["logprobs"]["token_logprobs"], abs=1e-5)
    _, (again,) = complete(chat_server, got.prompt_ids, 1, 0.0)  # ids to continue, as multi-turn sends
    assert (again.prompt_ids, again.token_ids) == (got.prompt_ids, got.token_ids)


def rescored(server: Server, model: str, ids: list[int]) -> list[float | None]:
    """vLLM's logprob of each token of `ids` given the ones before it (one prefill)."""
    body = dict(model=model, prompt=ids, max_tokens=1, temperature=0.0, prompt_logprobs=0)
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    positions = r.json()["choices"][0]["prompt_logprobs"]
    return [None if p is None else p[str(t)]["logprob"] for p, t in zip(positions, ids, strict=True)]


# sampled logprobs (decode steps) against one prefill of the same tokens: equal (0.0) on the chat
# model here, as the greedy test's 1e-5 allows; a sample joined with another's chunks is off by
# whole units
RESCORE_TOLERANCE = 1e-5


def test_samples_streamed_together_each_get_their_own_chunks(chat_server: Server):
    """Joined chunks of the same request stay apart: (sampled at temperature 1) the samples differ,
    and each sample's logprobs are vLLM's own for its tokens, rescored in one prefill."""
    model, samples = complete(chat_server, "Hello, ", 4, 1.0)
    assert len({tuple(s.token_ids) for s in samples}) > 1
    assert {tuple(s.prompt_ids) for s in samples} == {tuple(samples[0].prompt_ids)}
    worst = 0.0
    for s in samples:
        assert len(s.logprobs) == len(s.token_ids) > 0
        expected = rescored(chat_server, model, s.prompt_ids + s.token_ids)[len(s.prompt_ids) :]
        worst = max(worst, *(abs(a - b) for a, b in zip(s.logprobs, expected, strict=True)))
    print(f"largest difference from the rescored logprobs: {worst:.2e}")
    assert worst <= RESCORE_TOLERANCE


@pytest.mark.parametrize("max_tokens", [8, 40], ids=["whole", "streamed"])
def test_a_list_of_prompts_is_answered_as_each_prompt_alone(chat_server: Server, max_tokens: int):
    """The pool sends first requests asked for together as one request with a list of prompts
    (`orchestrator/servers/coalesce.py`): vLLM's answer, whole or streamed, gives each prompt its
    own samples, as that prompt's own request does."""
    prompts = list(LONG_ANSWER_PROMPTS[:3])

    async def run() -> tuple[list, list, list]:
        client = InferenceClient(chat_server.url, None, 60)
        try:
            await client.wait_ready(60, None)
            together = await client.complete_many(prompts, 1, max_tokens, 0.0)
            alone = [(await client.complete(p, 1, max_tokens, 0.0))[0] for p in prompts]
            sampled = await client.complete_many(prompts, 3, max_tokens, 1.0)
            return together, alone, sampled
        finally:
            await client.close()

    together, alone, sampled = asyncio.run(run())
    assert len({tuple(c.prompt_ids) for c in alone}) == 3
    for (got,), want in zip(together, alone, strict=True):  # greedy: the same tokens
        assert (got.prompt_ids, got.token_ids, got.text) == (want.prompt_ids, want.token_ids, want.text)
    for samples, want in zip(sampled, alone, strict=True):  # k * n + i: prompt k's sample i
        assert [c.prompt_ids for c in samples] == [want.prompt_ids] * 3
        assert all(len(c.token_ids) == len(c.logprobs) > 0 for c in samples)
