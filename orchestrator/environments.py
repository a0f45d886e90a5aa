"""The environment API: what a task must provide, and how triad finds one.

An environment is any object with

    name: str
    def sample(self, rng: random.Random) -> Prompt
    def reward(self, prompt: Prompt, completion: str) -> float          # or async

and, optionally,

    max_turns: int                                   # > 1: a multi-turn environment
    def respond(self, prompt, completion) -> str | None   # or async: the environment's
        # next message after a model turn, appended to the conversation as tokens the
        # model did not sample (loss_mask false); None ends the episode
    tools: list[Callable]                            # plain or async functions the model may call
    def metrics(self, prompt, episode) -> dict[str, float]   # or async; agent environments: numbers of
        # an episode besides its reward (a rubric's functions), averaged into `env/<key>`
    def eval_prompts(self) -> list[Prompt]           # a held-out set for evaluation

A text prompt (`Prompt.text`) is sent as is (base models); `completion` is then
the conversation after the prompt as text: model turns and the environment's
messages in order. A chat prompt (`Prompt.messages`, OpenAI format) is rendered
with the model's own chat template (`orchestrator/episodes/render.py`); `reward` and
`respond` then get the conversation after the prompt as OpenAI messages
(assistant messages with their parsed `tool_calls`, tool results, the
environment's user messages), and `respond` answers with a user message. With
`orchestrator.chat.text_prompts = true` a text prompt is sent as one user message and its
environment keeps seeing text. Rewards, responses, metrics and tools may be
coroutines, and may call out (a subprocess, a sandbox); each call is bounded by
`orchestrator.environment.timeout_s`. Plain functions run in worker threads, off the event
loop (`env_calls.py`: a bounded thread pool, no sandbox); a coroutine must not block.

`orchestrator.environment.name` names the environment: a built-in (see `BUILTIN`), a library
adapter's `prefix:name` (see `ADAPTERS`: `reasoning_gym:<task>`), the name
of an entry point in the group `triad.environments` of an installed package, or
`module:attribute`. If the object found is a class or function it is called with
`orchestrator.environment.args` as keyword arguments to make the environment.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import math
import numbers
import random
from collections.abc import Awaitable, Callable
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from orchestrator import env_calls
from orchestrator.env_calls import TooManyStuck
from orchestrator.failures import EpisodeEnded, RolloutFailed
from orchestrator.prompt import Prompt
from shared.errors import TriadError, one_line

log = logging.getLogger("triad.orchestrator")
ENTRY_POINT_GROUP = "triad.environments"
EVAL_SEED = "held-out"


@runtime_checkable
class Environment(Protocol):
    name: str

    def sample(self, rng: random.Random) -> Prompt: ...

    def reward(self, prompt: Prompt, completion: str) -> float | Awaitable[float]: ...


def max_turns(env: Environment) -> int:
    return int(getattr(env, "max_turns", 1))


def env_tools(env: Environment) -> list[Callable[..., Any]]:
    return list(getattr(env, "tools", None) or [])


async def _call(fn: Callable[..., Any], timeout: float, what: str, *args: Any) -> Any:
    """fn(*args) through `env_calls` (a sync fn in a pool thread), bounded by `timeout` from now
    (TimeoutError); TooManyStuck if it never started, every thread it could have had being stuck
    all that time. What fn raises, its own TimeoutError (a socket's) too, is a TriadError: the
    bound reaches the call as a cancellation, never as a TimeoutError inside it."""
    try:
        async with asyncio.timeout(timeout):
            try:
                return await env_calls.call(fn, *args)
            except Exception as e:
                raise TriadError(one_line(f"{what} raised {type(e).__name__}: {e}")) from e
    except TimeoutError:
        why = env_calls.not_started()
        if why is not None:
            raise TooManyStuck(f"{what}: {why}") from None
        raise


async def _call_or(
    error: type[RolloutFailed | EpisodeEnded],
    cause: str,
    fn: Callable[..., Any],
    timeout: float,
    what: str,
    *args,
) -> Any:
    """`_call`, with a failure or a run past `timeout` raised as `error` of `cause`."""
    try:
        return await _call(fn, timeout, what, *args)
    except TimeoutError:
        raise error(f"{what} took over {timeout:g} s (orchestrator.environment.timeout_s)", cause) from None
    except TriadError as e:
        raise error(str(e), cause) from None


async def score(env: Environment, prompt: Prompt, completion: str | list[dict], timeout: float) -> float:
    """The environment's reward, as a float. One that raises, runs past `timeout` or returns anything
    but a finite number drops its group (RolloutFailed, cause `reward`): a score it did not give
    would train the group on a reward nobody computed."""
    what = f"environment {env.name!r}: reward"
    value = await _call_or(RolloutFailed, "reward", env.reward, timeout, what, prompt, completion)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RolloutFailed(f"{what} returned {type(value).__name__}, not a number", "reward")
    if not math.isfinite(value):
        raise RolloutFailed(f"{what} returned {value}, not a finite number", "reward")
    return float(value)


async def respond(
    env: Environment, prompt: Prompt, completion: str | list[dict], timeout: float
) -> str | None:
    """The environment's next message, or None; EpisodeEnded (cause `respond`) if it raises, runs
    past `timeout` or returns no str: the episode cannot go on."""
    what = f"environment {env.name!r}: respond"
    reply = await _call_or(EpisodeEnded, "respond", env.respond, timeout, what, prompt, completion)
    if reply is not None and not isinstance(reply, str):
        raise EpisodeEnded(f"{what} returned {type(reply).__name__}, not str/None", "respond")
    return reply


async def group_rewards(env: Environment, prompt: Prompt, seen: list[Any], timeout: float) -> list[float]:
    """The reward of each of a group's episodes, from what the environment sees of it (a completion,
    a conversation, an agent episode), scored at once; one that fails drops the group (`score`)."""
    return list(await asyncio.gather(*(score(env, prompt, x, timeout) for x in seen)))


async def env_metrics(env: Environment, prompt: Prompt, seen: Any, timeout: float) -> dict[str, float]:
    """The environment's own numbers for one episode; {} if it keeps none. One that raises or
    returns no dict of numbers drops its group (RolloutFailed, cause `metrics`)."""
    if not hasattr(env, "metrics"):
        return {}
    what = f"environment {env.name!r}: metrics"
    try:
        values = await _call(env.metrics, timeout, what, prompt, seen)
    except TimeoutError:
        log.warning(
            "environment %r: metrics took over %g s (orchestrator.environment.timeout_s): none kept",
            env.name,
            timeout,
        )
        return {}
    except TriadError as e:
        raise RolloutFailed(str(e), "metrics") from None
    if not isinstance(values, dict) or not all(isinstance(v, int | float) for v in values.values()):
        got = one_line(repr(values), 200)
        raise RolloutFailed(f"{what}() must return a dict of numbers, got {got}", "metrics")
    return {str(k): float(v) for k, v in values.items()}


def eval_prompts(env: Environment, size: int) -> list[Prompt]:
    """The environment's held-out set, or `size` prompts from a fixed seed."""
    if hasattr(env, "eval_prompts"):
        return list(env.eval_prompts())[:size]
    rng = random.Random(EVAL_SEED)
    return [env.sample(rng) for _ in range(size)]


def _find(ref: str) -> Any:
    from orchestrator.envs import ADAPTERS, BUILTIN

    if ref in BUILTIN:
        return BUILTIN[ref]
    prefix, sep, name = ref.partition(":")
    if sep and prefix in ADAPTERS:
        return ADAPTERS[prefix](name)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == ref:
            try:
                return ep.load()
            except Exception as e:
                raise TriadError(f"entry point {ref!r} ({ep.value}) failed to load: {e!r}") from None
    module_name, sep, attr = ref.partition(":")
    if not sep:
        plugins = sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))
        raise TriadError(
            f"unknown environment {ref!r}: not a built-in {sorted(BUILTIN)}, not an entry point in "
            f"{ENTRY_POINT_GROUP!r} {plugins}, and not module:attribute"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise TriadError(f"environment {ref!r}: cannot import {module_name!r}: {e}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TriadError(f"environment {ref!r}: module {module_name!r} has no {attr!r}") from None


def load_environment(ref: str, args: dict[str, Any] | None = None) -> Environment:
    found = _find(ref)
    if inspect.isclass(found) or (callable(found) and not isinstance(found, Environment)):
        try:
            found = found(**(args or {}))
        except TypeError as e:
            raise TriadError(f"environment {ref!r}: bad orchestrator.environment.args: {e}") from None
    elif args:
        raise TriadError(
            f"environment {ref!r} is an object, not a factory: it takes no orchestrator.environment.args"
        )
    if not isinstance(found, Environment):
        what = type(found).__name__
        raise TriadError(f"environment {ref!r} has no name, sample() and reward(): got a {what}")
    if max_turns(found) > 1 and not hasattr(found, "respond") and not env_tools(found):
        raise TriadError(f"environment {ref!r} has max_turns > 1 but neither respond() nor tools")
    return found
