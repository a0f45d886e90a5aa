"""The orchestrator's OpenAI-compatible endpoint for agent episodes (see `agents.py`).

    POST {base}/episodes/{id}/v1/chat/completions    one call of episode `id`
    GET  {base}/episodes/{id}/v1/models              the served model

Served on `orchestrator.proxy_host` (loopback by default) while agent episodes
run. The routes are thin: the logic is in `EpisodeRecorder`. A call of an episode
that is over (finished, timed out, cancelled) is answered 404 at once, one that
is in flight when its episode ends gets 410, and a bad body gets 400, each with
an OpenAI-style `{"error": {"message", "type"}}` body; a failed rollout gets 502.
Sampling follows the run's settings: the sampler's temperature must be the one
the trainer divides its logits by, so a request's `temperature` is ignored, and
`max_tokens` is capped at `orchestrator.max_tokens`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import socket
import time
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from orchestrator.agents import AgentEpisode, EpisodeRecorder, check_request, run_agent
from orchestrator.chat import ChatRenderer
from orchestrator.chat_rollout import pool_renderer
from orchestrator.environments import env_metrics, score
from orchestrator.pool import RolloutFailed, ServerPool
from shared.config import OrchestratorConfig
from shared.errors import TriadError
from shared.waiting import async_wait_for

log = logging.getLogger("triad.orchestrator")
START_S, STOP_S = 30.0, 10.0


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


class AgentProxy:
    def __init__(self, pool: ServerPool, oc: OrchestratorConfig) -> None:
        self.pool, self.oc = pool, oc
        self.episodes: dict[str, EpisodeRecorder] = {}
        self.ids = itertools.count()
        self.port = 0
        self.server = None
        self.task: asyncio.Task | None = None
        self.app = Starlette(
            routes=[
                Route("/episodes/{episode}/v1/chat/completions", self.chat_completions, methods=["POST"]),
                Route("/episodes/{episode}/v1/models", self.models, methods=["GET"]),
            ]
        )

    @property
    def model(self) -> str:
        return self.pool.servers[0].client.model or "model"

    def renderer(self, tools: list[dict] | None) -> ChatRenderer:
        return pool_renderer(self.pool, tools, self.oc.chat_template_kwargs)

    def open(self) -> tuple[str, EpisodeRecorder]:
        episode = f"e{next(self.ids)}"
        self.episodes[episode] = EpisodeRecorder(self.pool, self.oc, self.renderer)
        return episode, self.episodes[episode]

    def close(self, episode: str) -> None:
        recorder = self.episodes.pop(episode, None)
        if recorder is not None:
            recorder.close()

    def base_url(self, episode: str) -> str:
        return f"http://{self.oc.proxy_host}:{self.port}/episodes/{episode}/v1"

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model"}]})

    async def chat_completions(self, request: Request) -> JSONResponse:
        episode = request.path_params["episode"]
        recorder = self.episodes.get(episode)
        if recorder is None:
            return error(404, f"episode {episode} is over (finished, timed out or cancelled)")
        try:
            body = json.loads(await request.body())
            messages, tools, max_tokens = check_request(body, self.oc.max_tokens)
        except ValueError as e:
            return error(400, f"the body is not JSON: {e}")
        except TriadError as e:
            return error(400, str(e))
        try:
            out = await recorder.call(messages, tools, max_tokens)
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
        try:
            sock.bind((self.oc.proxy_host, self.oc.proxy_port))
        except OSError as e:
            raise TriadError(
                f"orchestrator.proxy_port: cannot listen on {self.oc.proxy_host}:{self.oc.proxy_port}: {e}"
            ) from None
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
            up, f"the agent proxy on {self.oc.proxy_host}:{self.port} to start", START_S, 0.01
        )
        log.info("agent proxy at http://%s:%d/episodes/<id>/v1", self.oc.proxy_host, self.port)

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
            except asyncio.CancelledError:
                pass


class AgentRollouts:
    """Agent episodes of one environment: each runs the environment's agent program against its
    own proxy URL; the calls it makes become the samples (`agents.py`)."""

    def __init__(self, env, pool: ServerPool, oc: OrchestratorConfig) -> None:
        self.env, self.oc = env, oc
        self.proxy = AgentProxy(pool, oc)

    async def start(self, prompt) -> None:
        await self.proxy.start()

    async def stop(self) -> None:
        await self.proxy.stop()

    async def episode(self, prompt) -> AgentEpisode:
        episode, recorder = self.proxy.open()
        try:
            result = await run_agent(
                self.env, prompt, self.proxy.base_url(episode), self.proxy.model, self.oc.agent_timeout_s
            )
        except TimeoutError:
            log.warning("environment %r: an agent episode ran over %g s (orchestrator.agent_timeout_s): "
                        "scored as it stands", self.env.name, self.oc.agent_timeout_s)  # fmt: skip
            result = None
        except Exception as e:  # the agent program's own failure is part of its episode
            log.warning("environment %r: the agent raised %s: %s", self.env.name, type(e).__name__, e)
            result = e
        finally:
            self.proxy.close(episode)
        recorder.episode.result = result
        return recorder.episode

    async def group(self, prompt, size: int) -> list:
        """Every sample of `size` episodes, each with its episode's reward."""
        episodes = await asyncio.gather(*(self.episode(prompt) for _ in range(size)))
        rewards = await asyncio.gather(*(score(self.env, prompt, e, self.oc.env_timeout_s) for e in episodes))
        samples = []
        for episode, reward in zip(episodes, rewards, strict=True):
            metrics = await env_metrics(self.env, prompt, episode, self.oc.env_timeout_s)
            for sample in episode.samples:
                sample.reward, sample.metrics = reward, metrics
                samples.append(sample)
        if not samples:
            raise RolloutFailed(f"environment {self.env.name!r}: no agent episode of a prompt made a call")
        return samples
