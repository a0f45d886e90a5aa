"""Rollout requests are streamed (`InferenceClient.complete` against the fake server over real
HTTP, which streams as vLLM does): a generation longer than `request_timeout` finishes while its
tokens keep coming, its samples' chunks joined; a request fails once no token of it came for the
bound, and one given up is closed so the server stops generating it; a stream that ends early or
on an error event fails with the kind of failure it stands for, and a chunk that is not a
completion is a bad body. A request for no more tokens than one chunk holds is answered whole,
with the same samples."""

from __future__ import annotations

import asyncio
import time

import pytest

from orchestrator.servers.calls import RequestFailed, RequestRejected, ServerUnreachable
from orchestrator.servers.client import STREAM_INTERVAL, InferenceClient
from tests.fake_openai import FakeServer, encode

BOUND_S = 0.25


def complete(
    url: str,
    n: int = 2,
    prompt: str | list[int] = "1+1=",
    max_tokens: int = 64,
    stream_interval: int | None = STREAM_INTERVAL,
) -> tuple[float, object]:
    """`n` samples of `prompt`, or the error they failed with; and how long the call took."""

    async def run():
        client = InferenceClient(url, None, BOUND_S, stream_interval)
        client.model = "fake"
        started = time.monotonic()
        try:
            out = await client.complete(prompt, n, max_tokens, 1.0)
        except Exception as e:  # noqa: BLE001 (the test asserts which)
            out = e
        finally:
            await client.close()
        return time.monotonic() - started, out

    return asyncio.run(run())


def test_a_generation_longer_than_the_bound_finishes_while_its_tokens_keep_coming():
    with FakeServer() as server:
        server.state.answer, server.state.token_delay = "12345", 0.15  # 0.6 s in all, 0.15 s a token
        took, out = complete(server.url, prompt=encode("7+5="))
    assert took > 2 * BOUND_S
    assert [(c.text, c.token_ids, c.prompt_ids, c.finish_reason) for c in out] == [
        ("12345", encode("12345"), encode("7+5="), "stop")
    ] * 2
    assert [c.logprobs for c in out] == [[-0.5] * 5] * 2


def test_a_request_whose_tokens_stop_coming_fails_at_the_bound_and_the_server_stops_it():
    with FakeServer() as server:
        server.state.answer, server.state.token_delay = "12", 5.0
        took, out = complete(server.url)
        assert isinstance(out, ServerUnreachable) and out.kind == "timeout", out
        assert BOUND_S <= took < BOUND_S + 2
        deadline = time.monotonic() + 5
        while server.state.inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.state.inflight == 0  # the connection closed: the server's generator ended


def test_a_request_whose_first_token_never_comes_fails_at_the_bound():
    with FakeServer() as server:
        server.state.mode = "hang"
        took, out = complete(server.url)
    assert isinstance(out, ServerUnreachable) and out.kind == "timeout" and took < BOUND_S + 2


def test_a_stream_cut_before_each_sample_finished_is_a_bad_body():
    with FakeServer() as server:
        server.state.answer, server.state.stream_cut = "12", True
        _, out = complete(server.url)
    assert isinstance(out, RequestFailed) and out.kind == "bad_body"
    assert str(out) == f"rollout request to {server.url}: its stream ended before sample 0 of 2 finished"


def test_a_chunk_that_is_not_a_completion_is_a_bad_body_that_names_the_field():
    with FakeServer() as server:
        server.state.answer, server.state.misshapen_chunk = "12", True
        _, out = complete(server.url)
    assert isinstance(out, RequestFailed) and out.kind == "bad_body", out
    message = str(out)
    assert message.startswith(f"rollout request to {server.url} answered no completion: ValidationError"), (
        message
    )
    assert "choices.0.token_ids" in message and "\n" not in message, message


@pytest.mark.parametrize(("status", "error"), [(500, RequestFailed), (400, RequestRejected)])
def test_an_error_event_in_the_stream_fails_the_request_with_its_status(status, error):
    with FakeServer() as server:
        server.state.answer, server.state.stream_error = "12", status
        _, out = complete(server.url)
    assert type(out) is error and out.kind == f"http_{status}", out
    assert "failed mid-stream: Internal server error" in str(out)


def test_a_caller_that_gives_up_closes_the_request():
    with FakeServer() as server:
        server.state.delay = 30

        async def run() -> None:
            client = InferenceClient(server.url, None, 60)
            client.model = "fake"
            task = asyncio.create_task(client.complete("1+1=", 1, 64, 1.0))
            while server.state.inflight == 0:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(500):
                if server.state.inflight == 0:
                    break
                await asyncio.sleep(0.01)
            await client.close()

        asyncio.run(run())
        assert server.state.inflight == 0


def test_a_request_for_one_chunk_of_tokens_is_answered_whole_with_the_same_samples():
    with FakeServer() as server:
        server.state.answer = "12345"
        _, whole = complete(server.url, max_tokens=STREAM_INTERVAL)
        _, streamed = complete(server.url, max_tokens=STREAM_INTERVAL + 1)
    assert server.state.streams == [False, True]
    assert whole == streamed and [c.text for c in whole] == ["12345"] * 2


def test_a_client_with_no_stream_interval_asks_for_every_answer_whole():
    with FakeServer() as server:
        server.state.answer = "12345"
        _, whole = complete(server.url, max_tokens=4 * STREAM_INTERVAL, stream_interval=None)
        _, streamed = complete(server.url, max_tokens=4 * STREAM_INTERVAL)
    assert server.state.streams == [False, True]
    assert whole == streamed and [c.text for c in whole] == ["12345"] * 2
