"""The start-up check of the vLLM attributes triad relies on, against fakes with one missing."""

import os
import types

import pytest

from inference import vllm_api
from inference.server_children import SERVER_PID_VAR
from shared.config import TriadConfig
from shared.errors import TriadError

KNOWN = vllm_api.LAUNCHER_ATTRIBUTES + (vllm_api.CPU_REPACK,)


def importer_without(module_name: str, attribute: str | None):
    """A fake vLLM holding every attribute triad uses, except `attribute` of `module_name`
    (None: that whole module is missing)."""

    def fake(name: str) -> types.SimpleNamespace:
        if name == module_name and attribute is None:
            raise ImportError(name)
        present = [s.split(":")[1] for s in KNOWN if s.split(":")[0] == name]
        return types.SimpleNamespace(
            **{a: object() for a in present if (name, a) != (module_name, attribute)}
        )

    return fake


def test_every_launcher_attribute_is_named_when_missing():
    for spec in vllm_api.LAUNCHER_ATTRIBUTES:
        module, attribute = spec.split(":")
        with pytest.raises(TriadError, match=f"no {module}.{attribute},.*vLLM 0.32.0"):
            vllm_api.check_launcher(importer_without(module, attribute))
    module = vllm_api.LAUNCHER_ATTRIBUTES[0].split(":")[0]
    with pytest.raises(TriadError, match=f"no module {module}"):
        vllm_api.check_launcher(importer_without(module, None))
    vllm_api.check_launcher(importer_without("elsewhere", "nothing"))  # all present: passes


class Runner:
    def __init__(self, model) -> None:
        self.model = model

    def reload_weights(self, weights_iterator=None, weights_path=None) -> None: ...

    def get_model(self):
        return self.model


class OldRunner(Runner):
    def reload_weights(self) -> None: ...  # type: ignore[override]


def model_with_head(**head_attributes):
    return types.SimpleNamespace(lm_head=types.SimpleNamespace(weight=None, **head_attributes))


def test_worker_check_names_the_missing_runner_and_cpu_head_attributes():
    present = importer_without("elsewhere", "nothing")
    good = types.SimpleNamespace(model_runner=Runner(model_with_head(cpu_linear=print)))
    vllm_api.check_worker(good, on_cpu=True, importer=present)
    with pytest.raises(TriadError, match=r"lm_head.cpu_linear on the CPU build"):
        stale = types.SimpleNamespace(model_runner=Runner(model_with_head()))
        vllm_api.check_worker(stale, on_cpu=True, importer=present)
    # on GPU the head has no prepacked copy, rightly
    vllm_api.check_worker(types.SimpleNamespace(model_runner=Runner(model_with_head())), on_cpu=False)
    with pytest.raises(TriadError, match=r"OldRunner.reload_weights\(weights_iterator=...\)"):
        vllm_api.check_worker(types.SimpleNamespace(model_runner=OldRunner(None)), on_cpu=False)
    with pytest.raises(TriadError, match="worker attribute model_runner"):
        vllm_api.check_worker(object(), on_cpu=False)
    module, attribute = vllm_api.CPU_REPACK.split(":")
    with pytest.raises(TriadError, match=f"no {module}.{attribute}"):
        vllm_api.check_worker(good, on_cpu=True, importer=importer_without(module, attribute))


def test_engine_check_names_the_missing_method():
    class Engine:
        pass

    class Core:
        pass

    def engine_without(name: str | None) -> Engine:
        engine = Engine()
        engine.engine_core = Core()
        for other in vllm_api.ENGINE_METHODS:
            setattr(engine, other, print)
        for other in vllm_api.ENGINE_CORE_METHODS:
            setattr(engine.engine_core, other, print)
        if name is not None:
            delattr(engine.engine_core if name in vllm_api.ENGINE_CORE_METHODS else engine, name)
        return engine

    for name in vllm_api.ENGINE_METHODS:
        with pytest.raises(TriadError, match=f"Engine.{name}"):
            vllm_api.check_engine(engine_without(name))
    for name in vllm_api.ENGINE_CORE_METHODS:
        with pytest.raises(TriadError, match=f"Engine.engine_core.{name}"):
            vllm_api.check_engine(engine_without(name))
    vllm_api.check_engine(engine_without(None))


def test_a_cpu_build_runs_the_samplers_helpers_as_plain_torch_when_eager_and_one_worker_in_the_engine():
    from inference.server import cpu_env, parse_vllm_args

    def env(*flags: str, cpu: bool = True) -> dict[str, str]:
        return cpu_env(parse_vllm_args(["--model", "m", *flags]), cpu_build=lambda: cpu)

    one = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert env("--enforce-eager") == {"TORCHDYNAMO_DISABLE": "1", **one}
    assert env() == one
    assert env("--enforce-eager", cpu=False) == {}  # GPUs keep the compiled helpers and vLLM's executor
    assert env("--tensor-parallel-size", "2") == {}  # several workers: vLLM's process per worker
    assert env("--data-parallel-size", "2") == {}


def test_a_stock_vllm_server_on_a_cpu_build_gets_the_same_environment(monkeypatch, tmp_path):
    from inference import server

    seen = {}
    monkeypatch.setattr(server, "check_plugin_installed", lambda: None)
    monkeypatch.setattr(server, "stock_vllm_cmd", lambda cfg, path: ["python", "-m", "x", "--model", "m"])
    monkeypatch.setattr(server.os, "execve", lambda exe, cmd, env: seen.update(env))
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH", raising=False)
    monkeypatch.setenv("TRIAD_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")  # what the user set is kept
    server.run_stock_vllm(TriadConfig(), "m", join=False, cpu_build=lambda: True)
    assert seen["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and seen["TORCHDYNAMO_DISABLE"] == "0"
    assert seen[SERVER_PID_VAR] == str(os.getpid())  # vLLM's processes die with this one
    [written] = tmp_path.glob("vllm-logging-*.json")  # parser errors in one line (model_output_log.py)
    assert seen["VLLM_LOGGING_CONFIG_PATH"] == str(written)
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", "/etc/my-logging.json")  # a user's own is kept
    server.run_stock_vllm(TriadConfig(), "m", join=False, cpu_build=lambda: True)
    assert seen["VLLM_LOGGING_CONFIG_PATH"] == "/etc/my-logging.json"


def test_eager_is_the_cpu_builds_default_and_either_choice_can_be_forced():
    from inference.server import vllm_cli_args
    from shared.config import load_config

    def args(cpu: bool, *sets: str) -> list[str]:
        return vllm_cli_args(load_config(None, list(sets)), "/m", cpu_build=lambda: cpu)

    assert "--enforce-eager" in args(True)
    assert "--enforce-eager" not in args(False)
    assert "--enforce-eager" not in args(True, "inference.enforce_eager=false")
    assert "--enforce-eager" in args(False, "inference.enforce_eager=true")
    with pytest.raises(TriadError, match="enforce_eager"):
        load_config(None, ["inference.enforce_eager=sometimes"])


def test_the_kv_cache_on_a_cpu_build_is_given_in_bytes_so_a_fraction_of_a_gib_is_what_vllm_allocates():
    from inference.server import parse_vllm_args, vllm_cli_args
    from services.cli import EMBEDDED_DEFAULT
    from shared.config import load_config

    def parsed(cpu: bool, *sets: str):
        cfg = load_config(EMBEDDED_DEFAULT, list(sets))
        return parse_vllm_args(vllm_cli_args(cfg, "/m", cpu_build=lambda: cpu))

    assert parsed(True).kv_cache_memory_bytes == 2**27  # the embedded default's 0.125 GiB
    assert load_config(None).inference.kv_cache_gib == 1  # a config that names none
    assert parsed(True, "inference.kv_cache_gib=1.5").kv_cache_memory_bytes == 3 * 2**29
    assert parsed(False).kv_cache_memory_bytes is None  # GPUs size it by gpu_memory_utilization
    mine = parsed(True, 'inference.vllm_args=["--kv-cache-memory-bytes", "1000000"]')
    assert mine.kv_cache_memory_bytes == 1_000_000  # the user's own vLLM argument comes last and wins
    with pytest.raises(TriadError, match="kv_cache_gib"):
        load_config(None, ["inference.kv_cache_gib=0"])


def test_the_stock_vllm_command_swaps_triads_extension_for_its_engine_and_stays_on_loopback(tmp_path):
    import json
    import sys

    from inference.server import stock_vllm_cmd
    from shared.config import load_config

    (tmp_path / "config.json").write_text(json.dumps({"dtype": "float32"}))
    cmd = stock_vllm_cmd(load_config(None, ["inference.backend=vllm"]), str(tmp_path), lambda: True)
    assert cmd[:3] == [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    assert (
        "--worker-extension-cls" not in cmd and "inference.worker_extension.TriadWorkerExtension" not in cmd
    )
    assert cmd[-2:] == ["--weight-transfer-config", '{"backend": "triad_disk"}']
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and cmd[cmd.index("--dtype") + 1] == "float32"
    exposed = load_config(None, ["inference.backend=vllm", "inference.host=0.0.0.0"])
    with pytest.raises(TriadError, match=r"unauthenticated RL routes on '0.0.0.0': set inference.host"):
        stock_vllm_cmd(exposed, str(tmp_path), lambda: True)
    smuggled = load_config(None, ["inference.backend=vllm", 'inference.vllm_args=["--host", "10.1.2.3"]'])
    with pytest.raises(TriadError, match="'10.1.2.3'"):
        stock_vllm_cmd(smuggled, str(tmp_path), lambda: True)


def test_the_engine_registers_once_however_often_vllm_loads_the_plugin():
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    from inference.vllm_engine import ENGINE_NAME, DiskWeightTransferEngine, register

    register()
    register()
    assert WeightTransferEngineFactory._registry[ENGINE_NAME]() is DiskWeightTransferEngine


def test_unknown_parser_names_fail_in_one_line_naming_the_option():
    from argparse import Namespace

    from inference.server import check_parsers

    check_parsers(Namespace(tool_call_parser="hermes", reasoning_parser="qwen3"))
    check_parsers(Namespace(tool_call_parser=None, reasoning_parser=None))
    with pytest.raises(
        TriadError,
        match=r"^inference.tool_parser = 'hermse' is not one of this vLLM's tool_parsers: .*hermes",
    ):
        check_parsers(Namespace(tool_call_parser="hermse", reasoning_parser=None))
    with pytest.raises(
        TriadError,
        match=r"^inference.reasoning_parser = 'qwen4' is not one of this vLLM's reasoning_parsers",
    ):
        check_parsers(Namespace(tool_call_parser=None, reasoning_parser="qwen4"))


def test_the_reload_still_reports_skipped_parameters():
    vllm_api.check_reload_report()  # the installed vLLM

    def silent_reload(*args) -> None: ...

    module, attribute = vllm_api.RELOAD.split(":")
    fake = {module: types.SimpleNamespace(**{attribute: silent_reload})}
    with pytest.raises(TriadError, match="report of skipped parameters"):
        vllm_api.check_reload_report(fake.__getitem__)


def test_a_parameter_the_reload_skipped_is_an_error_at_any_log_level():
    import logging

    from inference.worker_extension import every_parameter_loaded

    logger = logging.getLogger(vllm_api.SKIPPED_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)  # VLLM_LOGGING_LEVEL=ERROR must not silence the check
    try:
        with every_parameter_loaded("version 3"):
            logger.info("Reloading weights inplace...")
        with pytest.raises(RuntimeError) as e, every_parameter_loaded("version 3"):
            logger.warning(vllm_api.SKIPPED_MESSAGE + ": %s", {"model.norm.weight", "lm_head.weight"})
        assert str(e.value) == (
            "loading version 3 left 2 parameter(s) of the model without a value: "
            "lm_head.weight, model.norm.weight (publish every parameter)"
        )
        assert logger.level == logging.ERROR and not logger.handlers
    finally:
        logger.setLevel(level)


def test_a_layer_the_reload_kept_is_logged_at_debug_and_other_warnings_stay(caplog):
    import logging

    from inference.worker_extension import KeptLayersAtDebug, kept_layers_at_debug

    logger = logging.getLogger(vllm_api.LAYERWISE_LOGGER)
    try:
        kept_layers_at_debug()
        kept_layers_at_debug()  # once per logger
        assert sum(isinstance(f, KeptLayersAtDebug) for f in logger.filters) == 1
        with caplog.at_level(logging.DEBUG, logger=vllm_api.LAYERWISE_LOGGER):
            logger.warning(vllm_api.LAYER_KEPT_MESSAGE, "ParallelLMHead")
            logger.warning("%s: something else", "ParallelLMHead")
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("DEBUG", "ParallelLMHead: Failed to load weights"),
            ("WARNING", "ParallelLMHead: something else"),
        ]
    finally:
        for f in [f for f in logger.filters if isinstance(f, KeptLayersAtDebug)]:
            logger.removeFilter(f)
