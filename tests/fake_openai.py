"""A fake OpenAI-compatible completions server over real HTTP, for orchestrator unit tests.

Tokens are the prompt's bytes (as with the tiny models' byte-level tokenizer).
Each server's behaviour is switched through its `state`: answer normally after
`delay` (or once a test opens its `gate`), fail with 500, hang (to make clients
time out), or report unhealthy. A completion asked as a stream is streamed as vLLM
streams one, and can be cut or end on vLLM's error event.
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from shared.net import free_port
from shared.waiting import wait_for


@dataclass
class FakeState:
    mode: str = "ok"  # ok | fail | hang
    healthy: bool = True
    health_delay: float = 0.0  # before /health answers (a busy API process)
    delay: float = 0.01
    token_delay: float = 0.0  # between a streamed answer's chunks (a token each, the samples' interleaved)
    stream_error: int | None = None  # the next streamed answer ends, after its first chunk, on vLLM's
    # error event with this status
    stream_cut: bool = False  # the next streamed answer stops after its first chunk, with no [DONE]
    misshapen_chunk: bool = False  # the next streamed chunk's token_ids is a string (a server not vLLM)
    answer: str = "2"
    inflight: int = 0  # prompts generating (a completion request may ask for several)
    peak: int = 0
    requests: int = 0
    gate: threading.Semaphore | None = None  # if set, each completion waits to acquire it (`gate.release()`)
    tokenize_failures: int = 0  # the next N /tokenize requests answer 500
    # SGLang's weight routes, as its http_server documents them: GET /get_model_info ->
    # {"model_path", ...}; POST /update_weights_from_disk {"model_path"} -> 200 {"success": true,
    # "message", "num_paused_requests"} or 400 {"success": false, "message", ...}
    sglang_model: str | None = None  # None: no SGLang routes (404)
    admin_status: int = 404  # GET /admin/weights: 404 as a server without triad's admin routes; 401
    # as triad's to a client without its admin token; any other status (a 500) as given
    sglang_loaded: list[str] = field(default_factory=list)
    sglang_refuse: str | None = None  # the next load fails with this message
    # vLLM's RL routes (`VLLM_SERVER_DEV_MODE=1`, vllm/entrypoints/rl/online/api_router.py): pause,
    # resume, init/start/update/finish weight update, /weight_info, /weight_checker. Each load
    # changes every parameter's checksum except those in `vllm_skip` (a reload that skipped them).
    # As vLLM's worker (v1/worker/gpu_worker.py): start moves the model to the meta device
    # (`vllm_broken`) until a finish; an update that fails (a path in `vllm_refuse`: 500) ends
    # the session, so a finish after it answers 500, and the model stays broken until a whole
    # start/update/finish succeeds.
    vllm_routes: bool = False
    vllm_refuse: set[str] = field(default_factory=set)
    vllm_session: bool = False
    vllm_broken: bool = False
    vllm_paused: bool = False
    vllm_resumed_broken: int = 0  # /resume while the model was broken: it would serve it
    vllm_version: str = "default"
    vllm_checksums: dict[str, str] = field(default_factory=lambda: {"a": "a0", "b": "b0", "c": "c0"})
    vllm_skip: set[str] = field(default_factory=set)
    vllm_calls: list[str] = field(default_factory=list)  # each RL route called, with its payload
    adapters: list[str] = field(default_factory=list)  # LoRA adapters /v1/models lists first (as `parent`)
    models_asked: list[str] = field(default_factory=list)  # each completion request's `model`
    max_model_len: int | None = None  # as vLLM: in /v1/models, and a longer request is answered 400
    max_tokens_asked: list[int] = field(default_factory=list)
    seeds_asked: list[int | None] = field(default_factory=list)  # each prompt's `seed`
    streams: list[bool] = field(default_factory=list)  # whether each completion request asked a stream
    fail_after: int | None = None  # completion requests after this many answer 500
    finish_reasons: list[str | None] = field(default_factory=list)  # the next completions' (vLLM's: abort...)
    prompt_ids_cut: int = 0  # the next N completions return prompt_token_ids without the last id sent
    renders: int = 0
    prompts: int = 0  # prompts asked for by completion requests (one request may ask several)
    # the next requests to `spoiled_route` answer these statuses (with Retry-After seconds, if given),
    # then the next `cut_bodies` answers are cut short (invalid JSON)
    spoiled_route: str = "/v1/chat/completions/render"
    busy: list[tuple[int, float | None]] = field(default_factory=list)
    cut_bodies: int = 0


def encode(text: str) -> list[int]:
    return list(text.encode())


def prompts_of(prompt: str | list) -> list:
    """The prompts of a completion request: one (text or ids) or a list of them, as vLLM reads them."""
    if isinstance(prompt, str) or all(isinstance(token, int) for token in prompt):
        return [prompt]
    return list(prompt)


def ids(prompt: str | list[int]) -> list[int]:
    return prompt if isinstance(prompt, list) else encode(prompt)


def make_app(state: FakeState) -> Starlette:
    def spoiled(request: Request) -> Response | None:
        """A busy server's answer, or a body cut short, as a proxy in front of vLLM may give."""
        if request.url.path != state.spoiled_route:
            return None
        if state.busy:
            status, after = state.busy.pop(0)
            headers = {"Retry-After": f"{after:g}"} if after is not None else {}
            return JSONResponse({"error": {"message": "busy"}}, status_code=status, headers=headers)
        if state.cut_bodies > 0:
            state.cut_bodies -= 1
            return Response('{"id": "x", "choices": [{"ind', media_type="application/json")
        return None

    def track(delta: int) -> None:  # prompts generating
        state.inflight += delta
        state.peak = max(state.peak, state.inflight)

    async def health(request: Request) -> JSONResponse:
        await asyncio.sleep(state.health_delay)
        return JSONResponse({}, status_code=200 if state.healthy else 503)

    async def models(request: Request) -> JSONResponse:
        card = {"id": "fake", "object": "model", "created": 0, "owned_by": "tests"}
        if state.max_model_len is not None:
            card["max_model_len"] = state.max_model_len
        loras = [{**card, "id": name, "parent": "fake"} for name in state.adapters]
        return JSONResponse({"object": "list", "data": [*loras, card]})

    async def tokenize(request: Request) -> Response:
        if (answer := spoiled(request)) is not None:
            return answer
        if state.tokenize_failures > 0:
            state.tokenize_failures -= 1
            return JSONResponse({"error": {"message": "connection reset"}}, status_code=500)
        return JSONResponse({"tokens": encode((await request.json())["prompt"])})

    async def render(request: Request) -> JSONResponse:
        """A ChatML-like rendering over bytes: `role: content` lines (not vLLM's template). As vLLM's
        render, a rendering that leaves no room in `max_model_len` for a token is answered 400."""
        body = await request.json()
        state.renders += 1
        if (answer := spoiled(request)) is not None:
            return answer
        text = "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in body["messages"])
        ids = encode(text + ("assistant: " if body["add_generation_prompt"] else ""))
        if state.max_model_len is not None and len(ids) >= state.max_model_len:
            message = (
                f"This model's maximum context length is {state.max_model_len} tokens. However, your "
                f"request has {len(ids)} input tokens."
            )
            return JSONResponse({"error": {"message": message, "type": "BadRequestError"}}, status_code=400)
        return JSONResponse({"token_ids": ids})

    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        state.requests += 1
        if (answer := spoiled(request)) is not None:
            return answer
        state.models_asked.append(body.get("model"))
        state.max_tokens_asked.append(body.get("max_tokens"))
        state.streams.append(bool(body.get("stream")))
        prompts = [ids(prompt) for prompt in prompts_of(body["prompt"])]
        state.prompts += len(prompts)
        state.seeds_asked += [body.get("seed")] * len(prompts)  # vLLM seeds each prompt of a list alike
        longest = max(len(prompt) for prompt in prompts) + body.get("max_tokens", 16)
        if state.max_model_len is not None and longest > state.max_model_len:
            message = f"This model's maximum context length is {state.max_model_len} tokens"
            return JSONResponse({"error": {"message": message}}, status_code=400)
        if state.fail_after is not None and state.requests > state.fail_after:
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if state.mode == "fail":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        if state.prompt_ids_cut > 0:
            state.prompt_ids_cut -= 1
            prompts[0] = prompts[0][:-1]
        finish = state.finish_reasons.pop(0) if state.finish_reasons else "stop"
        n = body.get("n", 1)
        if body.get("stream"):
            return StreamingResponse(streamed(prompts, n, finish), media_type="text/event-stream")
        track(+len(prompts))
        try:
            await generating()
        finally:
            track(-len(prompts))
        answer = encode(state.answer)
        choices = [
            {**piece(k * n + i, state.answer, answer, finish), "prompt_token_ids": prompt_ids}
            for k, prompt_ids in enumerate(prompts)
            for i in range(n)
        ]  # as vLLM numbers them: prompt k's sample i is k * n + i
        return JSONResponse(
            {"id": "x", "object": "text_completion", "created": 0, "model": "fake", "choices": choices}
        )

    async def generating() -> None:
        await asyncio.sleep(3600 if state.mode == "hang" else state.delay)
        while state.gate is not None and not state.gate.acquire(blocking=False):
            await asyncio.sleep(0.002)

    def piece(index: int, text: str, ids: list[int], finish: str | None) -> dict:
        logprobs = {
            "tokens": list(text),
            "token_logprobs": [-0.5] * len(ids),
            "top_logprobs": None,
            "text_offset": list(range(len(ids))),
        }
        return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs, "token_ids": ids}

    async def streamed(prompts: list[list[int]], n: int, finish: str | None):
        """As vLLM streams (headers first, then chunks: a sample's prompt ids with its first, its
        finish reason with its last; the samples interleaved), a token a chunk; a request whose
        client went away ends (the generator is cancelled)."""
        track(+len(prompts))
        try:
            await generating()
            last = len(state.answer) - 1
            for at, char in enumerate(state.answer):
                for k, i in ((k, i) for k in range(len(prompts)) for i in range(n)):
                    chunk = piece(k * n + i, char, encode(char), finish if at == last else None)
                    if at == 0:
                        chunk["prompt_token_ids"] = prompts[k]
                    if state.misshapen_chunk:
                        state.misshapen_chunk = False
                        chunk["token_ids"] = "".join(map(str, chunk["token_ids"]))
                    data = {"id": "x", "object": "text_completion", "created": 0, "model": "fake"}
                    yield f"data: {json.dumps({**data, 'choices': [chunk]})}\n\n"
                    if state.stream_cut:
                        state.stream_cut = False
                        return
                    if state.stream_error is not None:
                        error = {"message": "Internal server error", "type": "InternalServerError"}
                        yield f"data: {json.dumps({'error': {**error, 'code': state.stream_error}})}\n\n"
                        state.stream_error = None
                        return
                await asyncio.sleep(state.token_delay)
            yield "data: [DONE]\n\n"
        finally:
            track(-len(prompts))

    async def admin_weights(request: Request) -> JSONResponse:
        detail = {401: "missing or wrong admin token", 404: "Not Found"}.get(state.admin_status, "boom")
        return JSONResponse({"detail": detail}, status_code=state.admin_status)

    async def model_info(request: Request) -> JSONResponse:
        if state.sglang_model is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return JSONResponse(
            {"model_path": state.sglang_model, "tokenizer_path": state.sglang_model, "is_generation": True}
        )

    async def update_from_disk(request: Request) -> JSONResponse:
        if state.sglang_model is None:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        path = (await request.json())["model_path"]
        if state.sglang_refuse is not None:
            message, state.sglang_refuse = state.sglang_refuse, None
            return JSONResponse({"success": False, "message": message, "num_paused_requests": 0}, 400)
        state.sglang_loaded.append(path)
        state.sglang_model = path
        return JSONResponse(
            {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0}
        )

    def worker_error(message: str) -> JSONResponse:
        raise WorkerFailed(message)  # as vLLM's collective_rpc: out of the route, unhandled

    async def vllm_rl(request: Request) -> JSONResponse:
        if not state.vllm_routes:
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        route = request.url.path
        body = await request.json() if request.method == "POST" and await request.body() else {}
        state.vllm_calls.append(f"{route} {body or dict(request.query_params) or ''}".strip())
        if route == "/start_weight_update":
            if state.vllm_session:
                return worker_error("start_weight_update called while a weight update is already active")
            state.vllm_session = state.vllm_broken = True
        if route == "/update_weights":
            path = body["update_info"]["path"]
            if not state.vllm_session:
                return worker_error("start_weight_update must be called before update_weights.")
            if path in state.vllm_refuse:
                state.vllm_session = False
                return worker_error(f"FileNotFoundError: no .safetensors files in {path}")
            for name in state.vllm_checksums:
                if name not in state.vllm_skip:
                    state.vllm_checksums[name] = f"{name}:{path}"
        if route == "/finish_weight_update":
            if not state.vllm_session:
                return worker_error("finish_weight_update called without a matching start_weight_update.")
            state.vllm_session = state.vllm_broken = False
            state.vllm_version = body.get("weight_version") or state.vllm_version
        if route in ("/pause", "/resume"):
            state.vllm_paused = route == "/pause"
            state.vllm_resumed_broken += route == "/resume" and state.vllm_broken
        if route == "/weight_info":
            return JSONResponse({"weight_version": state.vllm_version})
        if route == "/weight_checker":
            return JSONResponse({"checksums": dict(state.vllm_checksums)})
        return JSONResponse({"message": "ok"})

    rl_routes = (
        "/pause",
        "/resume",
        "/init_weight_transfer_engine",
        "/start_weight_update",
        "/update_weights",
        "/finish_weight_update",
        "/weight_checker",
    )
    return Starlette(
        routes=[
            *(Route(route, vllm_rl, methods=["POST"]) for route in rl_routes),
            Route("/weight_info", vllm_rl),
            Route("/get_model_info", model_info),
            Route("/admin/weights", admin_weights, methods=["GET", "POST"]),
            Route("/update_weights_from_disk", update_from_disk, methods=["POST"]),
            Route("/health", health),
            Route("/v1/models", models),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/v1/chat/completions/render", render, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
        ],
        exception_handlers={Exception: unhandled},
    )


class WorkerFailed(Exception):
    pass


async def unhandled(request: Request, error: Exception) -> JSONResponse:
    """vLLM's answer to an exception out of a route: a 500 with a JSON body; then the exception goes
    on to uvicorn, which closes the connection that carried it (the next request needs another)."""
    return JSONResponse({"error": {"message": str(error), "type": "InternalServerError"}}, status_code=500)


class FakeServer:
    def __init__(self) -> None:
        self.state = FakeState()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        app = make_app(self.state)
        config = uvicorn.Config(
            app, port=self.port, log_level="error", lifespan="off", timeout_graceful_shutdown=1
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        wait_for(
            lambda: self.server.started or None, f"the fake server at {self.url} to start", 10, poll=0.01
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def main() -> None:
    """`python -m tests.fake_openai PORT [DELAY_S]`: serve until killed (for benchmarks)."""
    import sys

    state = FakeState(delay=float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
    uvicorn.run(make_app(state), port=int(sys.argv[1]), log_level="error", lifespan="off")


if __name__ == "__main__":
    main()
