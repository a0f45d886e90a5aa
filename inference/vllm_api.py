"""The vLLM attributes triad is written against (vLLM 0.32.0, CUDA and CPU builds alike),
checked once at start-up so that a different vLLM fails with the attribute's name instead
of misbehaving later (a skipped lm_head repack would serve stale weights silently).

The server checks the launcher pieces and engine methods it uses; each worker checks,
through `collective_rpc("triad_check_worker")`, the model-runner pieces the weight swap uses.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from types import ModuleType

from shared.errors import TriadError

VLLM_VERSION = "0.32.0"

LAUNCHER_ATTRIBUTES = (
    "vllm.entrypoints.launchers.cli_args:make_arg_parser",
    "vllm.entrypoints.launchers.cli_args:validate_parsed_serve_args",
    "vllm.utils.argparse_utils:FlexibleArgumentParser",
    "vllm.entrypoints.launchers.api_server.app_state:init_app_state",
    "vllm.entrypoints.launchers.api_server.entry:build_async_engine_client",
    "vllm.entrypoints.launchers.app:build_app",
    "vllm.entrypoints.launchers.launcher:serve_http",
    "vllm.entrypoints.launchers.launcher:setup_server",
    "vllm.entrypoints.serve.utils.api_utils:cli_env_setup",
)
ENGINE_METHODS = ("get_supported_tasks", "resume_generation", "collective_rpc", "reset_prefix_cache")
ENGINE_CORE_METHODS = ("pause_scheduler_async",)  # on the engine's core client, `engine.engine_core`
CPU_REPACK = "vllm.model_executor.layers.utils:dispatch_cpu_unquantized_gemm"
# The in-place reload logs the model's parameters that no loaded tensor reached, with this
# message, on this logger (`inference/worker_extension.py` turns it into an error).
RELOAD = "vllm.model_executor.model_loader.reload.inplace:reload_weights"
SKIPPED_LOGGER = "vllm.model_executor.model_loader.reload.inplace"
SKIPPED_MESSAGE = "Following weights were not loaded from checkpoint"
# The layerwise reload warns, with this message on this logger, of each layer that no loaded
# tensor reached, and keeps its tensors: a tied `lm_head` and the rotary cache at every load.
LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
LAYER_KEPT_MESSAGE = "%s: Failed to load weights"


def missing(what: str) -> TriadError:
    return TriadError(
        f"this vLLM has no {what}, which triad's inference relies on (written against vLLM "
        f"{VLLM_VERSION}): install that version (pyproject extra 'inference' or 'inference-cpu')"
    )


def resolve(spec: str, importer: Callable[[str], ModuleType] = importlib.import_module) -> object:
    """The object `module:attribute` names, or a TriadError naming it."""
    module_name, attribute = spec.split(":")
    try:
        module = importer(module_name)
    except ImportError:
        raise missing(f"module {module_name}") from None
    if not hasattr(module, attribute):
        raise missing(f"{module_name}.{attribute}")
    return getattr(module, attribute)


def check_launcher(importer: Callable[[str], ModuleType] = importlib.import_module) -> None:
    for spec in LAUNCHER_ATTRIBUTES:
        resolve(spec, importer)


def check_engine(engine: object) -> None:
    for name in ENGINE_METHODS:
        if not callable(getattr(engine, name, None)):
            raise missing(f"engine client method {type(engine).__name__}.{name}")
    core = getattr(engine, "engine_core", None)
    for name in ENGINE_CORE_METHODS:
        if not callable(getattr(core, name, None)):
            raise missing(f"engine core client method {type(engine).__name__}.engine_core.{name}")


async def pause_keeping_requests(engine) -> None:
    """Stop scheduling between two engine steps, requests in flight kept (they continue after
    `resume_generation`). The engine client's own `pause_generation` makes the same call and
    then sleeps 20 ms so that the final outputs of aborted requests reach their callers first;
    keeping aborts none, and that sleep was 20 ms of idle engine on every weight load."""
    await engine.engine_core.pause_scheduler_async(mode="keep", clear_cache=False)


def check_worker(
    worker: object, on_cpu: bool, importer: Callable[[str], ModuleType] = importlib.import_module
) -> None:
    """What the worker extension uses: the runner's in-place reload taking a weights iterator,
    its model, and on the CPU build the `lm_head.cpu_linear` repack."""
    runner = getattr(worker, "model_runner", None)
    if runner is None:
        raise missing("worker attribute model_runner")
    reload = getattr(runner, "reload_weights", None)
    if not callable(reload) or "weights_iterator" not in inspect.signature(reload).parameters:
        raise missing(f"{type(runner).__name__}.reload_weights(weights_iterator=...)")
    if not callable(getattr(runner, "get_model", None)):
        raise missing(f"{type(runner).__name__}.get_model")
    if not on_cpu:
        return
    resolve(CPU_REPACK, importer)
    lm_head = getattr(runner.get_model(), "lm_head", None)
    if lm_head is not None and not hasattr(lm_head, "cpu_linear"):
        raise missing(f"lm_head.cpu_linear on the CPU build (the tied head's prepacked copy, {CPU_REPACK})")


def check_reload_report(importer: Callable[[str], ModuleType] = importlib.import_module) -> None:
    """The in-place reload still reports the parameters it skipped, as the worker expects:
    without that report a skipped parameter would go unnoticed."""
    reload = resolve(RELOAD, importer)
    try:
        source = inspect.getsource(reload)
    except (OSError, TypeError):
        source = ""
    if SKIPPED_MESSAGE not in source:
        raise missing(f"report of skipped parameters ({SKIPPED_MESSAGE!r} in {RELOAD.replace(':', '.')})")
