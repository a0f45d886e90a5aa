"""A reverse proxy in front of one inference server that spoils a share of its answers.

    python -m bench.fault_proxy --listen 127.0.0.1:8601 --upstream http://127.0.0.1:8600 \
        --share 0.03 --seed 0 --counts counts.json

Generation (`/v1/completions`, `/v1/chat/completions`), render and derender calls are spoiled
with probability `--share`, each spoiled call getting one fault drawn evenly from `FAULTS`:
an HTTP 500, 503 or 429 (with Retry-After), a 400, the upstream's body cut in half, the
connection dropped before any answer, or a stall (the answer held back `--stall-s`, then the
connection dropped). Every other call, and every call on other routes (health, admin, tokenize),
is forwarded as is. The faults injected so far are written, by kind and route, to `--counts`
after each one, so a run can be checked against them; so are the spoilable calls that failed
without a fault because the upstream did not answer (`upstream_down`: a server being restarted)
or refused them itself (`upstream_refused`, by status: vLLM's 400 for a prompt over the context).
A fault is counted once it is served, as what the client saw: a cut body drawn while the upstream
is down as `upstream_down`, and one of an answer the upstream refused as `cut_http_<status>`.
With `--two-calls CALL`, a spoiled derender call may also get `two_calls`: the upstream's answer
rewritten into an assistant turn that asks for CALL twice at once, which is what vLLM's parser
gives back when a model asks for two calls (a template that allows one, Llama 3.x's, then refuses
the turn when it is rendered for what follows it). Renders of a turn with more than one call are
counted by the upstream's answer (`many_call_renders`), so a soak can check each was refused.
Loopback only: the proxy refuses to listen or forward anywhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import threading
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import h11
import httpx

FAULTS = ("http_500", "http_503", "http_429", "http_400", "cut_body", "dropped", "stall")
RENDER_ROUTE = "/v1/chat/completions/render"
DERENDER_ROUTE = "/v1/chat/completions/derender"
SPOILED_ROUTES = ("/v1/completions", "/v1/chat/completions", RENDER_ROUTE, DERENDER_ROUTE)
ANSWER_FAULTS = {"two_calls": DERENDER_ROUTE}  # a good answer rewritten, on its one route
# what the orchestrator counts each fault as (`requests_failed_<kind>`, orchestrator/servers/calls.py)
COUNTED_AS = {
    "http_500": "http_500",
    "http_503": "http_503",
    "http_429": "http_429",
    "http_400": "http_400",
    "cut_body": "bad_body",
    "dropped": "dropped",
    "stall": "timeout",  # held past the client's request timeout
    "upstream_down": "dropped",  # the proxy closes the client's connection
}
CUT_REFUSAL = "cut_http_"  # a cut body of the upstream's own refusal: `cut_http_400`
LOOPBACK = ("127.0.0.1", "localhost", "::1")
HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}


def counted_as(fault: str) -> str:
    """What the orchestrator counts a served fault as: a cut body of the upstream's own refusal
    (`cut_http_400`: vLLM refused a prompt over the context) by its status, read before the body."""
    if fault.startswith(CUT_REFUSAL):
        return "http_" + fault.removeprefix(CUT_REFUSAL)
    return COUNTED_AS[fault]


class Faults:
    """Which calls to spoil and how: seeded, so a soak run is repeatable; counted by kind and route."""

    def __init__(self, share: float, seed: int, counts: Path | None, kinds: tuple[str, ...] = FAULTS) -> None:
        self.share, self.rng, self.path, self.kinds = share, random.Random(seed), counts, kinds
        self.injected: Counter[str] = Counter()
        self.by_route: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.upstream_down = 0
        self.upstream_refused: Counter[str] = Counter()
        self.many_call_renders: Counter[str] = Counter()
        self.lock = threading.Lock()

    def draw(self, route: str) -> str | None:
        """The fault to inject into this call, if any."""
        if route not in SPOILED_ROUTES:
            return None
        with self.lock:
            self.calls[route] += 1
            if self.rng.random() >= self.share:
                return None
            kinds = [k for k in self.kinds if ANSWER_FAULTS.get(k, route) == route]
            return self.rng.choice(kinds) if kinds else None

    def served(self, fault: str, route: str) -> None:
        with self.lock:
            self.injected[fault] += 1
            self.by_route[route] += 1
            self.save()

    def upstream_failed(self, route: str) -> None:
        if route in SPOILED_ROUTES:
            with self.lock:
                self.upstream_down += 1
                self.save()

    def refused_upstream(self, status: int, route: str) -> None:
        """The upstream's own error answer to a spoilable call, forwarded as it was."""
        if route in SPOILED_ROUTES:
            with self.lock:
                self.upstream_refused[f"http_{status}"] += 1
                self.save()

    def rendered_many_calls(self, status: int) -> None:
        """The upstream's answer to a render of a turn that holds more than one tool call."""
        with self.lock:
            self.many_call_renders["ok" if status == 200 else f"http_{status}"] += 1
            self.save()

    def save(self) -> None:
        if self.path is not None:
            record = {
                "injected": self.injected,
                "by_route": self.by_route,
                "calls": self.calls,
                "upstream_down": self.upstream_down,
                "upstream_refused": self.upstream_refused,
                "many_call_renders": self.many_call_renders,
            }
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1))
            tmp.replace(self.path)


def two_calls(answer: bytes, call: dict) -> bytes | None:
    """A derender answer (`choices[0].message`) of a turn without tool calls rewritten to ask for
    `call` twice, with the content and reasoning it had. None where the answer holds no message or
    holds calls already: so the orchestrator's start check (a turn with one call of its tool, which
    must come back as one call) is never spoiled into refusing the server."""
    try:
        body = json.loads(answer)
        message = body["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(message, dict) or message.get("tool_calls"):
        return None
    function = {"name": call["name"], "arguments": json.dumps(call["arguments"])}
    message["tool_calls"] = [{"id": f"call{n}", "type": "function", "function": function} for n in range(2)]
    return json.dumps(body).encode()


def holds_many_calls(request: bytes) -> bool:
    """Whether a render request's messages hold an assistant turn with more than one tool call."""
    try:
        messages = json.loads(request)["messages"]
        return any(len(m.get("tool_calls") or []) > 1 for m in messages if isinstance(m, dict))
    except (ValueError, KeyError, TypeError):
        return False


class Proxy:
    def __init__(self, upstream: str, faults: Faults, stall_s: float, call: dict | None = None) -> None:
        host = urlsplit(upstream).hostname
        if host not in LOOPBACK:
            raise SystemExit(f"fault_proxy forwards to loopback only, not {upstream}")
        self.http = httpx.AsyncClient(base_url=upstream, timeout=None)
        self.faults, self.stall_s, self.call = faults, stall_s, call

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while await self.one_exchange(conn, reader, writer):
                conn.start_next_cycle()
        except (ConnectionError, h11.RemoteProtocolError, h11.LocalProtocolError):
            pass
        finally:
            writer.transport.abort()

    async def one_exchange(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Read one request, answer it (or spoil it); False when the connection is to close."""
        request, body = None, b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                if not data and request is None:
                    return False
                continue
            if isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                return False
        path = request.target.decode()
        route = path.split("?")[0]
        fault = self.faults.draw(route)
        if fault not in (None, "cut_body", *ANSWER_FAULTS):
            self.faults.served(fault, route)
        if fault in ("dropped", "stall"):
            if fault == "stall":
                await asyncio.sleep(self.stall_s)
            return False
        if fault in ("http_500", "http_503", "http_429", "http_400"):
            status = int(fault[-3:])
            extra = [(b"retry-after", b"1")] if status in (429, 503) else []
            message = json.dumps({"error": {"message": f"injected {status}", "code": status}}).encode()
            await self.send(conn, writer, status, extra, message)
            return True
        headers = [(k, v) for k, v in request.headers if k.lower() not in HOP_BY_HOP]
        try:
            r = await self.http.request(request.method.decode(), path, headers=headers, content=body)
        except httpx.HTTPError:
            self.faults.upstream_failed(route)
            return False  # the server is down: so is the proxy's answer
        if fault == "cut_body":
            self.faults.served(fault if r.is_success else f"{CUT_REFUSAL}{r.status_code}", route)
        elif not r.is_success:
            self.faults.refused_upstream(r.status_code, route)
        if route == RENDER_ROUTE and holds_many_calls(body):
            self.faults.rendered_many_calls(r.status_code)
        content = r.content[: len(r.content) // 2] if fault == "cut_body" else r.content
        if fault == "two_calls" and r.is_success and self.call is not None:
            rewritten = two_calls(r.content, self.call)
            if rewritten is not None:
                self.faults.served(fault, route)
                content = rewritten
        kept = [
            (k.encode(), v.encode()) for k, v in r.headers.items() if k.encode().lower() not in HOP_BY_HOP
        ]
        await self.send(conn, writer, r.status_code, kept, content)
        return True

    @staticmethod
    async def send(
        conn: h11.Connection, writer: asyncio.StreamWriter, status: int, headers: list, body: bytes
    ) -> None:
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        writer.write(conn.send(h11.Response(status_code=status, headers=headers)))
        writer.write(conn.send(h11.Data(data=body)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()


async def serve(listen: str, upstream: str, faults: Faults, stall_s: float, call: dict | None) -> None:
    host, port = listen.rsplit(":", 1)
    if host not in LOOPBACK:
        raise SystemExit(f"fault_proxy listens on loopback only, not {host}")
    proxy = Proxy(upstream, faults, stall_s, call)
    server = await asyncio.start_server(proxy.serve, host, int(port))
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT on loopback")
    parser.add_argument("--upstream", required=True, help="the inference server's URL (loopback)")
    parser.add_argument("--share", type=float, default=0.03)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stall-s", type=float, default=20.0)
    parser.add_argument("--counts", type=Path)
    parser.add_argument(
        "--faults",
        nargs="+",
        choices=[*FAULTS, *ANSWER_FAULTS],
        default=FAULTS,
        help="the kinds to draw from",
    )
    parser.add_argument(
        "--two-calls",
        type=json.loads,
        metavar="CALL",
        help='the call `two_calls` asks for twice: {"name": ..., "arguments": {...}}; adds it to the kinds',
    )
    args = parser.parse_args()
    kinds = tuple(args.faults) + (("two_calls",) if args.two_calls and "two_calls" not in args.faults else ())
    if "two_calls" in kinds and not args.two_calls:
        parser.error("the two_calls fault needs --two-calls CALL: the call it asks for twice")
    faults = Faults(args.share, args.seed, args.counts, kinds)
    asyncio.run(serve(args.listen, args.upstream, faults, args.stall_s, args.two_calls))


if __name__ == "__main__":
    main()
