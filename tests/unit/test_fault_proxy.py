"""The soak's fault proxy (`python -m bench.fault_proxy`): what it forwards, what it spoils, and
that each fault is what a client sees of it; and the soak's model under another family's template."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys

import httpx
import pytest

from bench.fault_proxy import FAULTS, counted_as, holds_many_calls, two_calls
from shared.config import load_config
from shared.net import free_port
from shared.waiting import wait_for
from tests.fake_openai import FakeServer
from tests.helpers import REPO

BODY = {"model": "m", "prompt": "1+1=", "max_tokens": 1}


class Proxy:
    """The proxy as a process; ready once it forwards /health, or with `upstream_down` once it
    accepts a connection (there is no upstream to forward to)."""

    def __init__(self, upstream: str, counts, *args: str, upstream_down: bool = False) -> None:
        self.upstream_down = upstream_down
        self.url = f"http://127.0.0.1:{free_port()}"
        listen = self.url.removeprefix("http://")
        cmd = [sys.executable, "-m", "bench.fault_proxy", "--listen", listen, "--upstream", upstream]
        self.proc = subprocess.Popen([*cmd, "--counts", str(counts), "--stall-s", "0.3", *args], cwd=REPO)

    def up(self) -> bool | None:
        if self.upstream_down:
            return self.listening()
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200 or None
        except httpx.HTTPError:
            return None

    def listening(self) -> bool | None:
        host, port = self.url.removeprefix("http://").split(":")
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return True
        except OSError:
            return None

    def __enter__(self) -> Proxy:
        try:
            wait_for(self.up, f"the fault proxy at {self.url}", 30, poll=0.05)
        except BaseException:
            self.__exit__()  # a proxy that never came up is not left running
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.kill()
        self.proc.wait()


def test_forwards_everything_at_share_zero(tmp_path) -> None:
    with (
        FakeServer() as upstream,
        Proxy(upstream.url, tmp_path / "c.json", "--share", "0") as proxy,
        httpx.Client(base_url=proxy.url) as client,  # one kept-alive connection for all
    ):
        for _ in range(5):
            r = client.post("/v1/completions", json=BODY)
            assert r.status_code == 200 and r.json()["choices"]
    assert upstream.state.requests == 5


@pytest.mark.parametrize("fault", FAULTS)
def test_each_fault_is_what_a_client_sees(tmp_path, fault) -> None:
    counts = tmp_path / "c.json"
    with FakeServer() as upstream, Proxy(upstream.url, counts, "--share", "1", "--faults", fault) as proxy:
        try:
            r = httpx.post(f"{proxy.url}/v1/completions", json=BODY, timeout=5)
        except httpx.HTTPError as e:
            seen = type(e).__name__
        else:
            seen = r.status_code
            if r.status_code == 200:
                with pytest.raises(json.JSONDecodeError):
                    r.json()
                seen = "cut"
        assert httpx.get(f"{proxy.url}/health", timeout=5).status_code == 200  # other routes pass
    expected = {
        "http_500": 500,
        "http_503": 503,
        "http_429": 429,
        "http_400": 400,
        "cut_body": "cut",
        "dropped": "RemoteProtocolError",
        "stall": "RemoteProtocolError",
    }
    assert seen == expected[fault]
    record = json.loads(counts.read_text())
    assert record["injected"] == {fault: 1} and record["by_route"] == {"/v1/completions": 1}


@pytest.mark.parametrize("route", ["generate", "render"])
@pytest.mark.parametrize("fault", FAULTS)
def test_the_orchestrator_counts_each_fault_under_its_kind(tmp_path, fault, route) -> None:
    """The real client and pool through the proxy: one spoiled request, one failure of its kind."""
    from orchestrator.servers.backends.frozen import Frozen
    from orchestrator.servers.client import InferenceClient
    from orchestrator.servers.pool import Server, ServerPool
    from shared.errors import TriadError

    counts = tmp_path / "c.json"
    cfg = load_config(None, [f"run_dir={tmp_path}", "orchestrator.servers.max_retries=0"])
    with FakeServer() as upstream, Proxy(upstream.url, counts, "--share", "1", "--faults", fault) as proxy:

        async def run() -> dict:
            client = InferenceClient(proxy.url, None, request_timeout=0.15)
            try:
                await client.wait_ready(10, None)
                pool = ServerPool([Server(client, Frozen())], cfg.orchestrator)
                with pytest.raises(TriadError):
                    if route == "generate":
                        await pool.complete("1+1=", 2)
                    else:
                        chat = [{"role": "user", "content": "1+1="}]
                        await pool.request(lambda s: s.client.chat.render(chat, None, True, {}), "a render")
                return pool.take_requests()
            finally:
                await client.close()

        taken = asyncio.run(run())
    assert json.loads(counts.read_text())["injected"] == {fault: 1}
    failed = {k: v for k, v in taken.items() if k.startswith("requests_failed")}
    assert failed == {"requests_failed": 1, f"requests_failed_{counted_as(fault)}": 1}


def refused_through_proxy(tmp_path, *spoil: str) -> tuple[dict, dict]:
    """One generation request the upstream refuses (a prompt over its context: 400), through the
    proxy: the proxy's record, and what the real client and pool counted."""
    from orchestrator.servers.backends.frozen import Frozen
    from orchestrator.servers.client import InferenceClient
    from orchestrator.servers.pool import Server, ServerPool
    from shared.errors import TriadError

    counts = tmp_path / "c.json"
    cfg = load_config(None, [f"run_dir={tmp_path}", "orchestrator.servers.max_retries=0"])
    with FakeServer() as upstream, Proxy(upstream.url, counts, *spoil) as proxy:

        async def run() -> dict:
            client = InferenceClient(proxy.url, None, request_timeout=5)
            try:
                await client.wait_ready(10, None)
                upstream.state.max_model_len = 2  # the prompt does not fit: vLLM answers 400
                pool = ServerPool([Server(client, Frozen())], cfg.orchestrator)
                with pytest.raises(TriadError):
                    await pool.complete("1+1=", 1)
                return pool.take_requests()
            finally:
                await client.close()

        taken = asyncio.run(run())
    failed = {k: v for k, v in taken.items() if k.startswith("requests_failed")}
    return json.loads(counts.read_text()), failed


def test_a_cut_body_of_the_upstreams_refusal_is_counted_by_its_status(tmp_path) -> None:
    """The proxy cuts whatever the upstream answered: a cut 400 (vLLM refusing a prompt over the
    context) is counted by the orchestrator as an http_400, and by the proxy as `cut_http_400`."""
    record, failed = refused_through_proxy(tmp_path, "--share", "1", "--faults", "cut_body")
    assert record["injected"] == {"cut_http_400": 1} and record["upstream_refused"] == {}
    assert failed == {"requests_failed": 1, "requests_failed_http_400": 1}
    assert counted_as("cut_http_400") == "http_400"


def test_the_upstreams_own_refusal_is_counted_apart_from_the_faults(tmp_path) -> None:
    """vLLM's own 400 (a prompt over the context, after an environment's megabyte reply) passes the
    proxy unspoiled: the proxy counts it, so a soak can match every http_400 the run counted."""
    record, failed = refused_through_proxy(tmp_path, "--share", "0")
    assert record["injected"] == {} and record["upstream_refused"] == {"http_400": 1}
    assert failed == {"requests_failed": 1, "requests_failed_http_400": 1}


def test_refuses_anything_but_loopback(tmp_path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "bench.fault_proxy",
        "--listen",
        "127.0.0.1:1",
        "--upstream",
        "http://10.0.0.1",
    ]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "loopback only" in out.stderr


def test_a_call_the_upstream_does_not_answer_is_counted_apart_from_the_faults(tmp_path) -> None:
    """A server being restarted: the proxy drops the call and counts it as `upstream_down`, even
    where it drew a cut body for it (the client saw a dropped connection, not a cut body)."""
    counts = tmp_path / "c.json"
    dead = f"http://127.0.0.1:{free_port()}"
    with Proxy(dead, counts, "--share", "1", "--faults", "cut_body", upstream_down=True) as proxy:
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{proxy.url}/v1/completions", json=BODY, timeout=5)
        with pytest.raises(httpx.RemoteProtocolError):
            httpx.post(f"{proxy.url}/tokenize", json=BODY, timeout=5)  # not a spoilable route
    record = json.loads(counts.read_text())
    assert record["injected"] == {} and record["upstream_down"] == 1


def test_the_soak_matches_the_proxys_faults_to_the_orchestrators_counts_by_kind() -> None:
    from bench.soak import requests_by_kind

    proxy = {
        "injected": {
            "stall": 2,
            "cut_body": 1,
            "cut_http_400": 1,
            "dropped": 1,
            "http_429": 1,
            "http_400": 2,
        },
        "upstream_down": 3,
        "upstream_refused": {"http_400": 5},
    }
    failed = {
        "requests_failed": 17,
        "requests_failed_timeout": 2,
        "requests_failed_bad_body": 1,
        "requests_failed_dropped": 4,
        "requests_failed_http_400": 8,
        "requests_failed_refused": 2,
        "groups_failed": 1,
    }
    assert requests_by_kind(proxy, failed) == [
        {"kind": "bad_body", "injected": 1, "counted": 1},
        {"kind": "dropped", "injected": 4, "counted": 4},
        {"kind": "http_400", "injected": 8, "counted": 8},  # 2 injected, 1 cut refusal, 5 vLLM's own
        {"kind": "http_429", "injected": 1, "counted": 0},
        {"kind": "refused", "injected": 0, "counted": 2},
        {"kind": "timeout", "injected": 2, "counted": 2},
    ]


def test_a_request_error_names_its_kind_and_a_context_full_one_is_no_http_answer() -> None:
    from orchestrator.servers.calls import failure_kind, transport_kind
    from orchestrator.servers.client import ContextFull
    from shared.errors import TriadError

    assert transport_kind(httpx.ReadTimeout("t")) == "timeout"
    assert transport_kind(httpx.ConnectError("c")) == "refused"
    assert transport_kind(httpx.RemoteProtocolError("r")) == "dropped"
    assert failure_kind(ContextFull("900 ids fill the model's context of 900")) == "context_full"
    assert failure_kind(TriadError("anything else")) == "other"


CALL = {"name": "calculate", "arguments": {"expression": "2*3+4"}}


def derender_answer(message: dict) -> bytes:
    return json.dumps({"request_id": "triad", "choices": [{"index": 0, "message": message}]}).encode()


def test_two_calls_makes_a_turn_without_calls_ask_for_the_call_twice() -> None:
    """What vLLM's parser gives back when a model asks for two calls at once: the content and
    reasoning kept, two calls of the given tool with their arguments as a JSON string."""
    answer = derender_answer({"role": "assistant", "content": "ten", "reasoning": "hm", "tool_calls": []})
    message = json.loads(two_calls(answer, CALL))["choices"][0]["message"]
    assert message["content"] == "ten" and message["reasoning"] == "hm"
    assert [c["function"] for c in message["tool_calls"]] == [
        {"name": "calculate", "arguments": '{"expression": "2*3+4"}'}
    ] * 2
    assert len({c["id"] for c in message["tool_calls"]}) == 2


def test_two_calls_leaves_a_turn_with_a_call_and_a_body_without_a_message_alone() -> None:
    """The orchestrator's start check derenders a turn with one call, which must come back as one."""
    one = {"id": "a", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}
    assert two_calls(derender_answer({"role": "assistant", "content": "", "tool_calls": [one]}), CALL) is None
    assert two_calls(b'{"choices": []}', CALL) is None
    assert two_calls(b'{"choi', CALL) is None


def test_a_render_of_a_turn_with_two_calls_is_told_apart() -> None:
    call = {"id": "a", "type": "function", "function": {"name": "calculate", "arguments": "{}"}}
    turn = {"role": "assistant", "content": "", "tool_calls": [call, {**call, "id": "b"}]}
    user = {"role": "user", "content": "1+1="}
    assert holds_many_calls(json.dumps({"messages": [user, turn]}).encode())
    assert not holds_many_calls(json.dumps({"messages": [user, {**turn, "tool_calls": [call]}]}).encode())
    assert not holds_many_calls(b"not json")


def test_the_soaks_model_dressed_in_llama_3_1_is_one_vllms_llama_parser_accepts(tmp_path) -> None:
    """The chat soak's model under Llama 3.1's template: Llama's special tokens are single ids in the
    rows its embedding holds beyond the Qwen3 tokenizer, and vLLM's llama3_json parser, which a
    start refuses without `<|python_tag|>`, accepts the tokenizer."""
    import shutil

    from transformers import AutoTokenizer

    from bench.soak import dressed
    from tests.templates import family

    pytest.importorskip("vllm")
    from vllm.tool_parsers import ToolParserManager

    source = tmp_path / "qwen3"
    shutil.copytree(REPO / "shared/data/qwen3_tokenizer", source)
    shutil.copy(REPO / "tests/data/qwen3_0_6b/config.json", source)
    tokenizer = AutoTokenizer.from_pretrained(dressed(str(source), "llama3_1", tmp_path / "dressed"))
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    for token in family("llama3_1")["special_tokens"]:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] < vocab, token
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    ToolParserManager.get_tool_parser("llama3_json")(tokenizer)
