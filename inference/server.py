"""Start vLLM's OpenAI-compatible server with triad's `/admin` routes.

    triad inference -c config.toml
    triad inference -c config.toml --join     also join the run's fleet (see `shared/fleet.py`)

With `inference.backend = "vllm"` it starts a stock `vllm serve` instead (`stock_vllm_cmd`):
vLLM's RL routes (`VLLM_SERVER_DEV_MODE=1`) with triad's `triad_disk` weight-transfer engine,
which vLLM finds through its plugin entry point. Those routes have no authentication: the server
must listen on loopback.

vLLM's own routes are served unchanged. The app is assembled from vLLM's
public launcher pieces (engine client, app builder, app state, HTTP server)
with the admin router added; new weights are loaded by the worker extension
in `inference.worker_extension`. Sampler logprobs are taken after temperature
scaling (`--logprobs-mode processed_logprobs`) so they match the trainer's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import uuid
from argparse import Namespace
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import urlsplit

from inference.families import chat_template_of
from inference.model_output_log import write_stock_logging_config
from inference.parser_probe import auto_parsers
from inference.server_children import mark_server
from inference.socket_dir import own_socket_dir
from inference.worker_extension import on_cpu_build
from shared.config import LOOPBACK_HOSTS, TriadConfig
from shared.cpus import move_threads
from shared.errors import TriadError
from shared.fleet import Registration, default_url
from shared.heap import started
from shared.logs import restore_root_levels, root_levels
from shared.net import check_can_listen
from shared.rundir import INFERENCE, RunDir
from shared.storage import machine_cache

WORKER_EXTENSION = "inference.worker_extension.TriadWorkerExtension"
log = logging.getLogger("triad.inference")
STOCK_ENGINE = '{"backend": "triad_disk"}'  # inference/vllm_engine.py, registered by its entry point


def check_admin_exposure(host: str, token: str | None) -> None:
    """`host` is the address vLLM will really bind (after `vllm_args`)."""
    if host not in LOOPBACK_HOSTS and token is None:
        raise TriadError(
            f"inference listens on {host!r} (not loopback) but no inference.admin_token "
            "is set: refusing to expose the admin routes without a token"
        )


def check_advertised_exposure(url: str, token: str | None) -> None:
    """A server bound to loopback but advertised elsewhere (a tunnel, a proxy) is exposed all the same."""
    if urlsplit(url).hostname not in LOOPBACK_HOSTS and token is None:
        raise TriadError(
            f"--join would advertise {url} (not loopback) but no inference.admin_token is set: "
            "refusing to expose the admin routes without a token"
        )


def model_dtype(requested: str, model_path: str) -> str:
    """`auto` means the dtype the model's config.json names, as the trainer uses;
    vLLM's own `auto` would run a float32 model in bfloat16 on CPU."""
    config = Path(model_path) / "config.json"
    if requested != "auto" or not config.is_file():
        return requested
    raw = json.loads(config.read_text())
    return str(raw.get("dtype") or raw.get("torch_dtype") or "auto")


def eager(requested: bool | str, cpu_build: Callable[[], bool]) -> bool:
    return cpu_build() if requested == "auto" else bool(requested)


def cpu_kv_cache_args(gib: float, cpu_build: Callable[[], bool]) -> list[str]:
    """`inference.kv_cache_gib` on the CPU build, in bytes: vLLM's `VLLM_CPU_KVCACHE_SPACE`
    takes whole GiB, and vLLM writes zeros over all of it at every start (a GiB took 3.2-4.6 s
    on a 2-core VM; the embedded model's 0.125 GiB holds 65,536 tokens)."""
    return ["--kv-cache-memory-bytes", str(int(gib * 2**30))] if cpu_build() else []


def parser_args(cfg: TriadConfig, model_path: str) -> list[str]:
    """vLLM's tool-call and reasoning parsers for the model (`inference.tool_parser` and
    `reasoning_parser`, `auto` by its chat template: its family, else what reads back its own
    rendering, `inference/parser_probe.py`), which `/v1/chat/completions/derender` applies."""
    ic = cfg.inference
    template = chat_template_of(Path(model_path))
    tool, reasoning = auto_parsers(model_path, template, ic.tool_parser, ic.reasoning_parser)
    args = ["--enable-auto-tool-choice", "--tool-call-parser", tool] if tool else []
    return args + (["--reasoning-parser", reasoning] if reasoning else [])


def check_parsers(args: Namespace) -> None:
    """Unknown parser names fail here in one line, not inside vLLM's start."""
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    for option, name, manager, known in (
        ("tool_parser", args.tool_call_parser, ToolParserManager, "tool_parsers"),
        ("reasoning_parser", args.reasoning_parser, ReasoningParserManager, "reasoning_parsers"),
    ):
        names = sorted(manager.list_registered())
        if name and name not in names:
            raise TriadError(
                f"inference.{option} = {name!r} is not one of this vLLM's {known}: {', '.join(names)}"
            )


def vllm_cli_args(
    cfg: TriadConfig, model_path: str, cpu_build: Callable[[], bool] = on_cpu_build
) -> list[str]:
    inf = cfg.inference
    return [
        "--model",
        model_path,
        "--host",
        inf.host,
        "--port",
        str(inf.port),
        "--dtype",
        model_dtype(inf.dtype, model_path),
        "--gpu-memory-utilization",
        str(inf.gpu_memory_utilization),
        "--seed",
        str(cfg.seed),
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--logprobs-mode",
        "processed_logprobs",
        # not the model's generation_config.json defaults (Qwen3's top_k 20, top_p 0.95): a request
        # sends the temperature only, and the trainer's policy is the full softmax at it
        "--generation-config",
        "vllm",
        "--disable-uvicorn-access-log",
        "--enable-scale-out",  # render, derender: chat rollouts in the model's own formats
        *parser_args(cfg, model_path),
        *(["--max-model-len", str(inf.max_model_len)] if inf.max_model_len else []),
        *(["--enforce-eager"] if eager(inf.enforce_eager, cpu_build) else []),
        *cpu_kv_cache_args(inf.kv_cache_gib, cpu_build),
        *inf.vllm_args,
    ]


def stock_vllm_cmd(
    cfg: TriadConfig, model_path: str, cpu_build: Callable[[], bool] = on_cpu_build
) -> list[str]:
    """`vllm serve` as triad's launcher would start it, without triad's worker extension, with
    triad's weight-transfer engine; TriadError if it would listen beyond loopback."""
    args = vllm_cli_args(cfg, model_path, cpu_build)
    at = args.index("--worker-extension-cls")
    args = args[:at] + args[at + 2 :]
    parsed = parse_vllm_args(args)
    host = bind_host(parsed)
    if host not in LOOPBACK_HOSTS:
        raise TriadError(
            f"inference.backend = 'vllm' would serve vLLM's unauthenticated RL routes on {host!r}: "
            "set inference.host = '127.0.0.1', or use backend 'triad' with inference.admin_token"
        )
    serve = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]  # the `vllm serve` server
    return [*serve, *args, "--weight-transfer-config", STOCK_ENGINE]


def check_plugin_installed() -> None:
    """vLLM finds the engine through this distribution's entry point: an install without it
    (an older `pip install -e .`) would fail only at the first weight update."""
    from importlib.metadata import entry_points

    from inference.vllm_engine import ENGINE_NAME

    if ENGINE_NAME not in entry_points(group="vllm.general_plugins").names:
        raise TriadError(
            f"inference.backend = 'vllm' needs triad's vLLM plugin {ENGINE_NAME!r}, which is not "
            "installed: run `pip install -e .` in triad's checkout again (pyproject's vllm.general_plugins)"
        )


def run_stock_vllm(
    cfg: TriadConfig, model_path: str, join: bool, cpu_build: Callable[[], bool] = on_cpu_build
) -> None:
    check_plugin_installed()
    if join:
        raise TriadError("--join needs triad's launcher: backend 'vllm' servers are local only")
    cmd = stock_vllm_cmd(cfg, model_path)
    env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
    if "VLLM_LOGGING_CONFIG_PATH" not in env:  # a user's own configuration is kept
        env["VLLM_LOGGING_CONFIG_PATH"] = str(write_stock_logging_config(machine_cache()))
    args = parse_vllm_args(cmd[3:])
    check_can_listen(bind_host(args), args.port, "inference.port")
    for name, value in cpu_env(args, cpu_build).items():
        env.setdefault(name, value)
    mark_server(env)  # the exec keeps this pid
    own_socket_dir(env)  # vLLM runs in this pid and leaves it; the next server here sweeps it
    os.execve(sys.executable, cmd, env)


def cpu_env(args: Namespace, cpu_build: Callable[[], bool] = on_cpu_build) -> dict[str, str]:
    """The environment vLLM's processes read at start on a CPU build (a GPU gets none of it); a
    variable already set is kept.

    Eager compiles nothing: vLLM's sampler would still compile its logprob-rank helper with
    inductor on the first request that asks for logprobs (1.8 s of the first batch here), so its
    processes run it as plain torch (`TORCHDYNAMO_DISABLE=0` keeps the compiled helper).

    One worker runs inside the engine's process, as vLLM runs one GPU (its uniprocess executor):
    its CPU platform otherwise spawns a third process that imports vLLM and torch again. Measured
    A B A B A B on the embedded model: healthy after 31-37 s instead of 43-47 s, and batches of
    64 completions were no slower (4,814-5,578 against 3,850-4,238 tokens/s, within this
    machine's noise)."""
    if not cpu_build():
        return {}
    env = {"TORCHDYNAMO_DISABLE": "1"} if args.enforce_eager else {}
    if args.tensor_parallel_size * args.pipeline_parallel_size * args.data_parallel_size == 1:
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return env


def move_frontend(spec: str) -> None:
    """With `inference.frontend_cpus` set (`triad up` sets it on `inference.cpus = "auto"`), this
    process, vLLM's API server, moves to those cores once it has started its engine core, which
    keeps the cores the process started on. On one core the two took turns: the engine at ~80% of
    it, the API server at ~40% (HTTP, output processing, /admin); apart, the step was 0.91x and the
    hand-off 0.77x (19 A B pairs, `bench/results/quick_profile.md`)."""
    if spec == "auto":
        return
    move_threads("inference.frontend_cpus", spec)
    log.info("vLLM's API server moved to cores %s (its engine core stays where it started)", spec)


def bind_host(args: Namespace) -> str:
    """The address vLLM binds: `--host`, or every IPv4 address without one."""
    return args.host or "0.0.0.0"


def parse_vllm_args(argv: list[str]) -> Namespace:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(prog="triad inference"))
    args = parser.parse_args(argv)
    validate_parsed_serve_args(args)
    return args


def advertised_url(cfg: TriadConfig, args: Namespace) -> str:
    """The URL `--join` registers: `inference.advertise_url`, or the address vLLM binds."""
    return cfg.inference.advertise_url or default_url(bind_host(args), args.port)


@asynccontextmanager
async def joined(cfg: TriadConfig, url: str | None, server_id: str) -> AsyncIterator[None]:
    """With a `url`, keep this server's record in the run's fleet registry while the body runs,
    and remove it on the way out."""
    if url is None:
        yield
        return
    registration = Registration(RunDir.of(cfg), url, server_id)
    heartbeat = asyncio.create_task(registration.keep_alive(cfg.inference.heartbeat_interval_s))
    try:
        yield
    finally:
        heartbeat.cancel()
        await asyncio.to_thread(registration.leave)


async def serve(cfg: TriadConfig, args: Namespace, join_as: str | None = None) -> None:
    saved_levels = root_levels()  # a library vLLM imports while it builds its app sets them to ERROR
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.launcher import serve_http, setup_server

    from inference.adapters import AdapterManager
    from inference.admin import WeightManager, add_admin_routes
    from inference.model_output_log import parser_errors_in_one_line
    from inference.vllm_api import check_engine

    token = cfg.inference.token()
    server_id = uuid.uuid4().hex[:12]  # names its metrics file and its fleet record
    metrics = RunDir.of(cfg).metrics.writer(INFERENCE, server_id)
    try:
        listen_address, sock = setup_server(args, reuse_port=False)
    except OSError:  # taken since run_inference's check: that check's one line, if it is that
        check_can_listen(bind_host(args), args.port, "inference.port")
        raise
    async with build_async_engine_client(args) as engine:
        check_engine(engine)
        await engine.collective_rpc("triad_check_worker")
        move_frontend(cfg.inference.frontend_cpus)
        tasks = await engine.get_supported_tasks()
        app = build_app(args, tasks, engine.model_config)
        restore_root_levels(saved_levels)
        parser_errors_in_one_line()  # on the handlers vLLM's engine client configured
        manager = WeightManager(engine, RunDir.of(cfg), args.model, metrics, token)
        adapters = AdapterManager(engine, RunDir.of(cfg), metrics)
        add_admin_routes(app, manager, token, adapters)
        await init_app_state(engine, app.state, args, tasks)
        adapters.models = app.state.openai_serving_models
        sweeper = asyncio.create_task(adapters.sweep_forever(cfg.inference.adapter_idle_s))
        await metrics.log_from_loop(0, version=0, path=args.model)
        started()
        async with joined(cfg, join_as, server_id):  # serve_http returns once the server has stopped
            shutdown = await serve_http(
                app,
                sock=sock,
                host=args.host,
                port=args.port,
                log_level=args.uvicorn_log_level,
                access_log=False,
            )
    try:
        await shutdown
    finally:
        sweeper.cancel()
        sock.close()


def run_inference(cfg: TriadConfig, model_path: str, join: bool = False) -> None:
    if cfg.inference.backend == "vllm":
        run_stock_vllm(cfg, model_path, join)
    from inference.vllm_api import check_launcher

    check_launcher()
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup

    args = parse_vllm_args(vllm_cli_args(cfg, model_path))
    check_parsers(args)
    check_can_listen(bind_host(args), args.port, "inference.port")
    for name, value in cpu_env(args).items():
        os.environ.setdefault(name, value)
    mark_server()
    check_admin_exposure(bind_host(args), cfg.inference.token())
    join_as = advertised_url(cfg, args) if join else None
    if join_as is not None:
        check_advertised_exposure(join_as, cfg.inference.token())
    rundir = RunDir.of(cfg)
    rundir.check_writable()  # a bad bucket, credentials or endpoint fail here, not at the first load
    rundir.store.sweep()  # what a killed server left: partial copies, the version it served
    cli_env_setup()

    import uvloop

    sockets = own_socket_dir()
    try:
        uvloop.run(serve(cfg, args, join_as))
    finally:
        if sockets is not None:
            shutil.rmtree(sockets, ignore_errors=True)
