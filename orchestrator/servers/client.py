"""Talking to one inference server: the OpenAI API for rollouts, `/admin` for weights."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import openai
from pydantic import BaseModel, ValidationError

from orchestrator.servers.calls import (
    RequestFailed,
    RequestRejected,
    ServerUnreachable,
    answer_error,
    refused,
    send,
    transport_kind,
)
from shared.admin_api import (
    ADAPTERS_ROUTE,
    ADMIN_PREFIX,
    BROADCAST_INIT_ROUTE,
    BROADCAST_RECEIVE_ROUTE,
    WEIGHTS_ROUTE,
    AdapterInfo,
    AdaptersInfo,
    BroadcastInit,
    BroadcastReceive,
    BroadcastState,
    LoadAdapterRequest,
    LoadWeightsRequest,
    WeightsInfo,
)
from shared.errors import TriadError, one_line
from shared.waiting import async_wait_for

log = logging.getLogger("triad.orchestrator")
M = TypeVar("M", bound=BaseModel)
HEALTH_POLL_S = 0.25  # how often a starting server's /health is asked
RENDER_ROUTE = "/v1/chat/completions/render"  # vLLM's scale-out API (`vllm serve --enable-scale-out`)
DERENDER_ROUTE = "/v1/chat/completions/derender"


class ContextFull(RequestRejected):
    """The ids so far leave no room in the model's context for another token."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "context", kind="context_full")  # refused here, before any request


@dataclass(frozen=True)
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    truncated: bool
    finish_reason: str = "stop"  # "stop": it ended on an end-of-turn token; "length": truncated


FINISHED = ("stop", "length")  # vLLM's other finish reasons (abort, error) end no turn


STREAM_INTERVAL = 16  # tokens per streamed chunk of a sample (vLLM's `stream_interval`)
HEALTH_TIMEOUT_S = 5.0  # bound on one /health probe (one not answered alone takes no busy server out)


class AnswerLogprobs(BaseModel):
    token_logprobs: list[float | None] | None = None


class AnswerChoice(BaseModel):
    """What triad reads of one choice of a `/v1/completions` answer or chunk (vLLM's extra fields
    `token_ids` and `prompt_token_ids` included). Validated by pydantic-core from the JSON the
    OpenAI SDK decoded: the SDK's own models cost 0.3 ms a chunk to build (`bench/streaming_cost.py`)."""

    index: int
    text: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    logprobs: AnswerLogprobs | None = None
    finish_reason: str | None = None


class CompletionAnswer(BaseModel):
    choices: list[AnswerChoice]


@dataclass
class StreamedSample:
    """One sample's streamed chunks (vLLM sends its prompt ids with the first, its finish reason with
    the last), joined; an answer not streamed is its one chunk."""

    texts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float | None] = field(default_factory=list)
    prompt_ids: list[int] | None = None
    finish_reason: str | None = None
    without_ids: bool = False  # a chunk came without `token_ids`
    without_logprobs: bool = False

    def add(self, choice: AnswerChoice) -> None:
        if self.prompt_ids is None and choice.prompt_token_ids is not None:
            self.prompt_ids = choice.prompt_token_ids
        if choice.token_ids is None:
            self.without_ids = True
        else:
            self.token_ids.extend(choice.token_ids)
        if choice.logprobs is None or choice.logprobs.token_logprobs is None:
            self.without_logprobs = True
        else:
            self.logprobs.extend(choice.logprobs.token_logprobs)
        self.texts.append(choice.text or "")
        self.finish_reason = choice.finish_reason or self.finish_reason

    def completion(self, sent: str | list[int]) -> Completion:
        """Token ids and sampler logprobs exactly as the server produced them, for the prompt `sent`.
        A sample the server did not finish (`abort`, `error`) or whose prompt ids are not the ids
        sent is a failed request (TriadError: retried)."""
        if self.prompt_ids is None or self.without_ids:
            raise TriadError(
                "the inference server did not return token ids (`return_token_ids`); "
                "triad needs a vLLM-compatible server that does"
            )
        if self.finish_reason not in FINISHED:
            raise TriadError(f"the inference server ended a sample with finish_reason {self.finish_reason!r}")
        if isinstance(sent, list) and self.prompt_ids != sent:
            pairs = enumerate(zip(self.prompt_ids, sent, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), min(len(sent), len(self.prompt_ids)))
            raise TriadError(
                f"the inference server's prompt_token_ids differ from the {len(sent)} ids sent, at index "
                f"{at} ({len(self.prompt_ids)} came back)"
            )
        if self.without_logprobs or len(self.logprobs) != len(self.token_ids) or None in self.logprobs:
            raise TriadError("the inference server did not return one logprob per sampled token")
        return Completion(
            prompt_ids=self.prompt_ids,
            token_ids=self.token_ids,
            logprobs=[float(x) for x in self.logprobs],
            text="".join(self.texts),
            truncated=self.finish_reason == "length",
            finish_reason=self.finish_reason,
        )


def join(samples: dict[int, StreamedSample], data: object) -> None:
    """Add a chunk of a streamed answer (or a whole answer), as decoded JSON, to its samples;
    ValidationError where it is not a completion."""
    for choice in CompletionAnswer.model_validate(data).choices:
        samples.setdefault(choice.index, StreamedSample()).add(choice)


@dataclass(frozen=True)
class Health:
    ok: bool
    why: str = ""  # why not ok
    slow: bool = False  # no answer in time, not a refusal: a busy server's API process can be that slow


def rollout_error(e: openai.APIError | httpx.HTTPError | ValueError, url: str) -> TriadError:
    """What a failed rollout request to the server at `url` means to the pool (`calls.py`)."""
    if isinstance(e, openai.APITimeoutError):
        return ServerUnreachable(f"rollout request to {url} timed out", "timeout")
    if isinstance(e, openai.APIStatusError):
        message = f"rollout request to {url} failed: {e}"
        if refused(e.status_code):
            message = f"{url} rejected a rollout request: {e}"
        return answer_error(e.status_code, e.response.headers, message, "generate")
    if isinstance(e, openai.APIConnectionError):  # its cause: httpx's error
        return ServerUnreachable(f"rollout request to {url} failed: {e}", transport_kind(e.__cause__))
    if isinstance(e, openai.APIError):  # an error event in the stream: vLLM's, with the status it stands for
        code = e.body.get("code") if isinstance(e.body, dict) else None
        message = f"rollout request to {url} failed mid-stream: {e.message}"
        return answer_error(code if isinstance(code, int) else 500, httpx.Headers(), message, "generate")
    if isinstance(e, httpx.HTTPError):
        return TriadError(f"rollout request to {url} failed: {e}")
    why = one_line(f"{type(e).__name__}: {e}", 200)  # a cut or invalid chunk (json's JSONDecodeError)
    return RequestFailed(f"rollout request to {url} answered no completion: {why}")


class InferenceClient:
    def __init__(
        self,
        base_url: str,
        admin_token: str | None,
        request_timeout: float,
        stream_interval: int | None = STREAM_INTERVAL,
    ) -> None:
        """`stream_interval`: tokens per streamed chunk of a rollout answer; None answers every
        request whole (what `bench/streaming_cost.py` compares streaming with)."""
        self.base_url = base_url
        self.stream_interval = stream_interval
        headers = {"Authorization": f"Bearer {admin_token}"} if admin_token else {}
        self.http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=request_timeout)
        self.openai = openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key=admin_token or "none", timeout=request_timeout, max_retries=0
        )  # the server pool retries, on another server
        self.model: str | None = None
        self.max_model_len: int | None = None  # the served model's context, as /v1/models says
        self.inflight = 0
        self.progressed_at = 0.0  # wall clock of the last rollout answer or chunk this server sent
        self.chat = ChatRoutes(self)
        self.admin = AdminRoutes(self)

    async def _healthy(self) -> bool | None:
        return True if (await self.health()).ok else None

    async def wait_ready(self, timeout: float, model_name: str | None) -> None:
        # on the launch's critical path: vLLM answers within a quarter second of being up
        what = f"inference server {self.base_url}/health"
        await async_wait_for(self._healthy, what, timeout, poll=HEALTH_POLL_S)
        try:
            models = await self.openai.models.list()
        except openai.APIError as e:
            if model_name is not None:  # named in the config: the context is then not known
                self.model = model_name
                return
            raise TriadError(f"GET {self.base_url}/v1/models failed: {e}") from None
        # the base model, not a LoRA adapter (which vLLM lists with its `parent`)
        bases = [m for m in models.data if not (m.model_extra or {}).get("parent")]
        if model_name is None and not bases:
            raise TriadError(f"inference server {self.base_url} serves no model")
        served = next((m for m in bases if m.id == model_name), bases[0] if bases else None)
        self.model = model_name or served.id
        length = (served.model_extra or {}).get("max_model_len") if served is not None else None
        self.max_model_len = length if isinstance(length, int) and length > 0 else None

    def room(self, prompt: str | list[int], max_tokens: int) -> int:
        """`max_tokens`, or fewer where the ids so far leave less room in the model's context;
        ContextFull where they leave none."""
        if self.max_model_len is None or isinstance(prompt, str):
            return max_tokens
        left = self.max_model_len - len(prompt)
        if left < 1:
            raise ContextFull(
                f"{len(prompt)} ids fill the model's context of {self.max_model_len} at {self.base_url}"
            )
        return min(max_tokens, left)

    async def complete(
        self,
        prompt: str | list[int],
        n: int,
        max_tokens: int,
        temperature: float,
        model: str | None = None,
        seed: int | None = None,
    ) -> list[Completion]:
        """`n` samples of `prompt`: `complete_many` of one prompt."""
        return (await self.complete_many([prompt], n, max_tokens, temperature, model, seed))[0]

    async def complete_many(
        self,
        prompts: list[str] | list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        model: str | None = None,
        seed: int | None = None,
    ) -> list[list[Completion]]:
        """`n` samples of each prompt (text, or token ids to continue exactly), in one request (vLLM's
        completions API takes a list of prompts), from `model` (a LoRA adapter's served name) or the
        served model, with the server's randomness or `seed` (vLLM gives each prompt the same). The
        read timeout bounds the wait for each chunk (vLLM sends a sample's first token at once,
        then every `stream_interval` tokens), so the request fails once no chunk of it came for
        `request_timeout`, however long a healthy generation takes; a request for no more than one
        chunk's tokens is answered whole (streamed, the embedded default's 8-token requests made
        its step 12% slower, `bench/quick.py`)."""
        self.inflight += len(prompts)  # the pool balances prompts, not requests
        try:
            samples = await self._samples(prompts, n, max_tokens, temperature, model, seed)
        except (openai.APIError, httpx.HTTPError, ValueError) as e:  # pydantic's ValidationError too
            raise rollout_error(e, self.base_url) from None
        finally:
            self.inflight -= len(prompts)
        asked = n * len(prompts)  # vLLM numbers prompt k's sample i k * n + i
        unfinished = [i for i in range(asked) if samples.get(i) is None or samples[i].finish_reason is None]
        if unfinished:
            raise RequestFailed(
                f"rollout request to {self.base_url}: its stream ended before sample {unfinished[0]} of "
                f"{asked} finished"
            )
        return [[samples[k * n + i].completion(prompt) for i in range(n)] for k, prompt in enumerate(prompts)]

    async def _samples(
        self,
        prompts: list[str] | list[list[int]],
        n: int,
        max_tokens: int,
        temperature: float,
        model: str | None,
        seed: int | None,
    ) -> dict[int, StreamedSample]:
        """The answer's samples by index, read from its stream or whole."""
        samples: dict[int, StreamedSample] = {}
        interval = self.stream_interval
        streamed = interval is not None and max_tokens > interval
        body = dict(
            model=model or self.model,
            prompt=prompts[0] if len(prompts) == 1 else prompts,
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            logprobs=0,
            stream=streamed,
            return_token_ids=True,
            **({"stream_interval": interval} if streamed else {}),
            **({"seed": seed} if seed is not None else {}),
        )
        # the SDK sends the request, names its failures and reads the events; `object`: the JSON as
        # decoded, for `join` to validate
        if not streamed:
            whole = await self.openai.post("/completions", cast_to=object, body=body)
            self.progressed_at = time.time()
            join(samples, whole)
            return samples
        stream = await self.openai.post(
            "/completions", cast_to=object, body=body, stream=True, stream_cls=openai.AsyncStream[object]
        )
        self.progressed_at = time.time()
        async with stream:  # closed on any exit: a request given up is aborted by the server
            async for chunk in stream:
                self.progressed_at = time.time()
                join(samples, chunk)
        return samples

    async def health(self) -> Health:
        """One /health probe, bounded by `HEALTH_TIMEOUT_S`."""
        try:
            r = await self.http.get("/health", timeout=HEALTH_TIMEOUT_S)
        except httpx.TimeoutException:
            return Health(False, f"its /health does not answer in {HEALTH_TIMEOUT_S:g} s", slow=True)
        except httpx.HTTPError as e:
            return Health(False, f"its /health does not answer ({type(e).__name__})")
        if r.status_code != 200:
            return Health(False, f"its /health answered {r.status_code}")
        return Health(True)

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as the server's tokenizer makes them (no special tokens); an error
        answer as `answer_error` maps it (a refusal ends the episode, the rest are retried)."""
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        url = f"{self.base_url}/tokenize"
        r = await send(self.http, "POST", "/tokenize", json=body)
        if r.status_code != 200:
            need = (
                ": multi-turn environments need a server with vLLM's /tokenize route"
                if r.status_code == 404
                else ""
            )
            message = f"POST {url} answered {r.status_code}: {one_line(r.text, 300)}{need}"
            raise answer_error(r.status_code, r.headers, message, "tokenize")
        try:
            tokens = r.json()["tokens"]
            if not all(isinstance(t, int) for t in tokens):
                raise TypeError(f"token ids that are not all ints: {one_line(repr(tokens), 100)}")
        except (ValueError, KeyError, TypeError) as e:  # a cut or invalid body
            raise RequestFailed(f"POST {url} answered no 'tokens': {one_line(repr(e), 200)}") from None
        return list(tokens)

    @property
    def closed(self) -> bool:
        return self.http.is_closed

    async def close(self) -> None:
        await self.http.aclose()
        await self.openai.close()


class AdminRoutes:
    """triad's `/admin` routes of one server (`inference/admin.py`): the weights it serves and loads,
    broadcast groups, and LoRA adapters."""

    def __init__(self, client: InferenceClient) -> None:
        self.client = client

    async def weights(self) -> WeightsInfo | None:
        """What the server serves, or None if it has no triad admin routes."""
        r = await self._call("GET")
        if r.status_code == 404:
            return None
        return self._parse(r, "GET")

    async def load_weights(self, version: int, path: str, timeout: float) -> WeightsInfo:
        body = LoadWeightsRequest(version=version, path=path).model_dump()
        return self._parse(await self._call("POST", json=body, timeout=timeout), "POST")

    async def broadcast_state(self) -> BroadcastState:
        r = await self._call("GET", route=BROADCAST_INIT_ROUTE)
        return self._parse(r, "GET", BroadcastState, BROADCAST_INIT_ROUTE)

    async def broadcast_init(self, body: BroadcastInit) -> BroadcastState:
        r = await self._call("POST", route=BROADCAST_INIT_ROUTE, json=body.model_dump())
        return self._parse(r, "POST", BroadcastState, BROADCAST_INIT_ROUTE)

    async def broadcast_receive(self, version: int, path: str, timeout: float) -> WeightsInfo:
        body = BroadcastReceive(version=version, path=path).model_dump()
        r = await self._call("POST", route=BROADCAST_RECEIVE_ROUTE, json=body, timeout=timeout)
        return self._parse(r, "POST", WeightsInfo, BROADCAST_RECEIVE_ROUTE)

    async def adapters(self) -> AdaptersInfo | None:
        """The server's LoRA adapters, or None if it has no `/admin/adapters` route."""
        r = await self._call("GET", route=ADAPTERS_ROUTE)
        if r.status_code == 404:
            return None
        return self._parse(r, "GET", AdaptersInfo, ADAPTERS_ROUTE)

    async def load_adapter(self, body: LoadAdapterRequest, timeout: float) -> AdapterInfo:
        r = await self._call("POST", route=ADAPTERS_ROUTE, json=body.model_dump(), timeout=timeout)
        return self._parse(r, "POST", AdapterInfo, ADAPTERS_ROUTE)

    async def _call(self, method: str, route: str = WEIGHTS_ROUTE, **kwargs) -> httpx.Response:
        try:
            return await self.client.http.request(method, ADMIN_PREFIX + route, **kwargs)
        except httpx.TransportError as e:
            where = f"{method} {self.client.base_url}{ADMIN_PREFIX}{route}"
            raise ServerUnreachable(f"{where} failed: {e!r}", transport_kind(e)) from None
        except httpx.HTTPError as e:
            raise TriadError(f"{method} {self.client.base_url}{ADMIN_PREFIX}{route} failed: {e!r}") from None

    def _parse(
        self, r: httpx.Response, method: str, model: type[M] = WeightsInfo, route: str = WEIGHTS_ROUTE
    ) -> M:
        url = f"{self.client.base_url}{ADMIN_PREFIX}{route}"
        if r.status_code != 200:
            raise TriadError(f"{method} {url} answered {r.status_code}: {r.text[:300]}")
        try:
            return model.model_validate_json(r.content)
        except ValidationError:
            raise TriadError(f"{method} {url} answered something that is not triad's admin API") from None


class ChatRoutes:
    """vLLM's scale-out routes of one server (`vllm serve --enable-scale-out`): a chat rendered to
    ids with the model's template, and sampled ids split into a message by the server's parsers."""

    def __init__(self, client: InferenceClient) -> None:
        self.client = client
        self.has_render: bool | None = None  # None: not asked yet
        self.has_derender: bool | None = None

    async def render(
        self, messages: list[dict], tools: list[dict] | None, generation_prompt: bool, template_kwargs: dict
    ) -> list[int]:
        """Token ids of `messages` rendered with the served model's own chat template: vLLM's
        `/v1/chat/completions/render`, or `/tokenize` with messages on a server without it."""
        body: dict = {
            "model": self.client.model,
            "messages": messages,
            "add_generation_prompt": generation_prompt,
        }
        if tools:
            body["tools"] = tools
        if template_kwargs:
            body["chat_template_kwargs"] = template_kwargs
        if self.has_render is not False:
            r = await self._post(RENDER_ROUTE, body)
            if self.has_render is None:  # decided once: a later 403/404 is that request's refusal
                self.has_render = r.status_code not in (403, 404)
            if self.has_render:
                return list(self._rendered(r, RENDER_ROUTE, "token_ids"))
        if not generation_prompt:
            body["continue_final_message"] = False
        return list(self._rendered(await self._post("/tokenize", body), "/tokenize", "tokens"))

    async def derender(
        self,
        token_ids: list[int],
        finish_reason: str,
        messages: list[dict],
        tools: list[dict] | None,
        template_kwargs: dict,
        prompt_ids: list[int],
    ) -> dict | None:
        """The assistant message that sampled `token_ids` make, split by the server's own tool-call
        and reasoning parsers (vLLM's `/v1/chat/completions/derender`); None on a server without it."""
        if self.has_derender is False:
            return None
        request: dict = {"model": self.client.model, "messages": messages}
        if tools:
            request["tools"] = tools
        if template_kwargs:
            request["chat_template_kwargs"] = template_kwargs
        body = {
            "model": self.client.model,
            "generate_response": {
                "request_id": "triad",
                "choices": [{"index": 0, "token_ids": token_ids, "finish_reason": finish_reason}],
            },
            "chat_request": request,
            "prompt_token_ids": prompt_ids,  # a reasoning parser sees whether the prompt opened `<think>`
        }
        r = await self._post(DERENDER_ROUTE, body)
        if self.has_derender is None:  # decided once: a later 403/404 is that request's refusal
            self.has_derender = r.status_code not in (403, 404)
        if not self.has_derender:
            return None
        choices = self._rendered(r, DERENDER_ROUTE, "choices")
        try:
            return dict(choices[0]["message"])
        except (IndexError, KeyError, TypeError, ValueError):
            raise RequestFailed(f"POST {self.client.base_url}{DERENDER_ROUTE} answered no message") from None

    async def _post(self, route: str, body: dict) -> httpx.Response:
        try:
            return await self.client.http.post(route, json=body)
        except httpx.TransportError as e:
            where = f"POST {self.client.base_url}{route}"
            raise ServerUnreachable(f"{where} failed: {e!r}", transport_kind(e)) from None
        except httpx.HTTPError as e:
            raise TriadError(f"POST {self.client.base_url}{route} failed: {e!r}") from None

    def _rendered(self, r: httpx.Response, route: str, key: str) -> Any:
        """`key` of the answer's JSON body; an error answer as `answer_error` maps it."""
        url = f"{self.client.base_url}{route}"
        if r.status_code != 200:
            message = f"POST {url} answered {r.status_code}: {one_line(r.text, 300)}"
            cause = "derender" if route == DERENDER_ROUTE else "render"
            raise answer_error(r.status_code, r.headers, message, cause)
        try:
            return r.json()[key]
        except (ValueError, KeyError, TypeError) as e:  # a cut or invalid body
            raise RequestFailed(f"POST {url} answered no {key!r}: {one_line(repr(e), 200)}") from None
