"""The orchestrator's OpenAI-compatible endpoint for agent episodes (see `agents.py`): HTTP only.

    POST {base}/episodes/{id}/v1/chat/completions    one call of episode `id`
    GET  {base}/episodes/{id}/v1/models              the served model

Served on `orchestrator.agents.proxy_host` (loopback by default) while agent episodes
run. The routes are thin: the logic is in `EpisodeRecorder`. A call of an episode
that is over (finished, timed out, cancelled) is answered 404 at once, one that
is in flight when its episode ends gets 410, a bad body or a request the
inference server refused (a prompt over its context, say) gets 400, each with an
OpenAI-style `{"error": {"message", "type"}}` body; a failed rollout gets 502.
A request option the proxy does not honour (`stop`, `tool_choice`, `response_format`,
`top_p`, ...) gets a 400 that names it, unless its value is what the proxy does anyway
(`tool_choice` "auto", `top_p` 1, ..., or null): an option dropped silently would train
the policy on samples the agent did not ask for.
Episode ids are unguessable (`secrets`); on an address other than loopback the
proxy needs `orchestrator.agents.proxy_token` as a bearer token.
Sampling follows the run's settings: the sampler's temperature must be the one
the trainer divides its logits by, so a request's `temperature` is ignored, and
`max_tokens` is capped at `orchestrator.sampling.max_tokens`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import socket
import time
from typing import Any, Protocol

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchestrator.episodes.render import check_messages
from orchestrator.servers.client import RequestRejected
from shared.config import LOOPBACK_HOSTS, OrchestratorConfig
from shared.errors import TriadError
from shared.waiting import async_wait_for

log = logging.getLogger("triad.orchestrator")
START_S, STOP_S = 30.0, 10.0


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


class Recorder(Protocol):
    """One episode's side of the proxy (`agents.EpisodeRecorder`)."""

    async def call(self, messages: list[dict], tools: list[dict] | None, max_tokens: int) -> dict | None: ...

    def close(self) -> None: ...


def check_tools(raw: Any) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(t, dict) and t.get("type") == "function" for t in raw):
        raise TriadError("tools must be a list of OpenAI function tools ({'type': 'function', ...})")
    return raw


HONOURED = frozenset({"messages", "model", "tools", "max_tokens", "max_completion_tokens", "n", "stream"})
TOKEN_REQUIRED = "a bearer token (orchestrator.agents.proxy_token) is required"
IGNORED = frozenset({"temperature", "user"})  # the run's temperature is the trainer's; `user` is a label
AS_DONE = {  # options whose value is what the proxy does anyway
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "top_p": 1,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "logprobs": False,
    "stop": [],
}


def unsupported(body: dict) -> list[str]:
    """The options of `body` that the proxy would not honour, sorted."""
    known = HONOURED | IGNORED
    return sorted(
        k
        for k, v in body.items()
        if k not in known and v is not None and (k not in AS_DONE or AS_DONE[k] != v)
    )


def check_request(body: Any, max_tokens: int) -> tuple[list[dict], list[dict] | None, int]:
    """(messages, tools, max_tokens) of a chat-completions body; TriadError naming what is wrong."""
    if not isinstance(body, dict):
        raise TriadError("the body must be a JSON object")
    refused = unsupported(body)
    if refused:
        raise TriadError(
            f"unsupported by the training proxy: {', '.join(refused)}; sampling follows the run's settings "
            "(orchestrator.sampling.temperature, max_tokens): leave them out"
        )
    if body.get("stream"):
        raise TriadError("stream is not supported by the training proxy")
    if body.get("n", 1) != 1:
        raise TriadError("n must be 1")
    messages = check_messages(body.get("messages"), "request")
    asked = body.get("max_completion_tokens")
    asked = body.get("max_tokens") if asked is None else asked
    asked = max_tokens if asked is None else asked
    if not isinstance(asked, int) or isinstance(asked, bool) or asked < 1:
        raise TriadError(f"max_tokens must be a positive integer, got {asked!r}")
    return messages, check_tools(body.get("tools")), min(asked, max_tokens)


def check_exposure(oc: OrchestratorConfig) -> None:
    if oc.agents.proxy_host not in LOOPBACK_HOSTS and oc.agents.proxy_token is None:
        raise TriadError(
            f"orchestrator.agents.proxy_host is {oc.agents.proxy_host!r} (not loopback) but no "
            "orchestrator.agents.proxy_token is set: refusing to expose the agent proxy without a token"
        )


class AgentProxy:
    def __init__(self, oc: OrchestratorConfig) -> None:
        check_exposure(oc)
        self.oc = oc
        self.model = "model"  # the served model's name, set once the servers are known
        self.token = oc.agents.proxy_token.get_secret_value() if oc.agents.proxy_token else None
        self.episodes: dict[str, Recorder] = {}
        self.port = 0
        self.server = None
        self.task: asyncio.Task | None = None
        self.app = Starlette(
            routes=[
                Route("/episodes/{episode}/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/episodes/{episode}/v1/models", self.models, methods=["GET"]),
            ]
        )

    def open(self, recorder: Recorder) -> str:
        """Serve `recorder` under a new, unguessable episode id."""
        episode = secrets.token_urlsafe(16)
        self.episodes[episode] = recorder
        return episode

    def close(self, episode: str) -> None:
        recorder = self.episodes.pop(episode, None)
        if recorder is not None:
            recorder.close()

    def base_url(self, episode: str) -> str:
        return f"http://{self.oc.agents.proxy_host}:{self.port}/episodes/{episode}/v1"

    def authorized(self, request: Request) -> bool:
        if self.token is None:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode())

    async def models(self, request: Request) -> JSONResponse:
        if not self.authorized(request):
            return error(401, TOKEN_REQUIRED, "authentication_error")
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def chat_completions(self, request: Request) -> JSONResponse:
        if not self.authorized(request):
            return error(401, TOKEN_REQUIRED, "authentication_error")
        episode = request.path_params["episode"]
        recorder = self.episodes.get(episode)
        if recorder is None:
            return error(404, f"episode {episode} is over (finished, timed out or cancelled)")
        try:
            body = json.loads(await request.body())
            messages, tools, max_tokens = check_request(body, self.oc.sampling.max_tokens)
        except ValueError as e:
            return error(400, f"the body is not JSON: {e}")
        except TriadError as e:
            return error(400, str(e))
        try:
            out = await recorder.call(messages, tools, max_tokens)
        except RequestRejected as e:
            return error(400, f"the inference server refused the request: {e}")
        except TriadError as e:
            return error(502, f"the rollout failed: {e}", "server_error")
        if out is None:
            return error(410, f"episode {episode} ended while this call was in flight")
        return JSONResponse(self.response(episode, out))

    def response(self, episode: str, out: dict[str, Any]) -> dict[str, Any]:
        prompt, completion = out["prompt_tokens"], out["completion_tokens"]
        choice = dict(index=0, message=out["message"], finish_reason=out["finish_reason"], logprobs=None)
        usage = dict(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        return {
            "id": f"chatcmpl-{episode}-{time.monotonic_ns()}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }

    async def start(self) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        host, port = self.oc.agents.proxy_host, self.oc.agents.proxy_port
        try:
            sock.bind((host, port))
        except OSError as e:
            sock.close()
            raise TriadError(f"orchestrator.agents.proxy_port: cannot listen on {host}:{port}: {e}") from None
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.task = asyncio.create_task(self.server.serve(sockets=[sock]))

        async def up() -> bool | None:
            if self.task.done():
                self.task.result()  # its error, if it failed to start
                raise TriadError("the agent proxy stopped while starting")
            return True if self.server.started else None

        await async_wait_for(
            up, f"the agent proxy on {self.oc.agents.proxy_host}:{self.port} to start", START_S, 0.01
        )
        log.info("agent proxy at http://%s:%d/episodes/<id>/v1", self.oc.agents.proxy_host, self.port)

    async def stop(self) -> None:
        for episode in list(self.episodes):
            self.close(episode)
        if self.server is not None and self.task is not None:
            self.server.should_exit = True
            try:
                async with asyncio.timeout(STOP_S):
                    await self.task
            except TimeoutError:
                log.warning("the agent proxy did not stop within %g s: cancelled", STOP_S)
                self.task.cancel()
            except asyncio.CancelledError:  # the server's task ended cancelled; ours is passed on
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
