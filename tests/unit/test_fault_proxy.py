"""The soak's fault proxy (`python -m bench.fault_proxy`): what it forwards, what it spoils, and
that each fault is what a client sees of it."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from bench.fault_proxy import FAULTS
from shared.net import free_port
from shared.waiting import wait_for
from tests.fake_openai import FakeServer
from tests.helpers import REPO

BODY = {"model": "m", "prompt": "1+1=", "max_tokens": 1}


class Proxy:
    def __init__(self, upstream: str, counts, *args: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        listen = self.url.removeprefix("http://")
        cmd = [sys.executable, "-m", "bench.fault_proxy", "--listen", listen, "--upstream", upstream]
        self.proc = subprocess.Popen([*cmd, "--counts", str(counts), "--stall-s", "0.3", *args], cwd=REPO)

    def up(self) -> bool | None:
        try:
            return httpx.get(f"{self.url}/health", timeout=1).status_code == 200 or None
        except httpx.HTTPError:
            return None

    def __enter__(self) -> Proxy:
        wait_for(self.up, f"the fault proxy at {self.url}", 30, poll=0.05)
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
