"""Bad input gets one clear line naming the problem, never a traceback."""

from __future__ import annotations

import os
import subprocess

import pytest

from shared.rundir import RunDir
from tests.helpers import free_port, run_triad, triad_cmd


def assert_one_line_error(result, *needles: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, result.stderr
    for needle in needles:
        assert needle in error_lines[0], error_lines[0]


def test_unknown_config_key(tmp_path):
    r = run_triad("up", f"--set=run_dir={tmp_path}", "--set=trainer.lrr=1")
    assert_one_line_error(r, "unknown config key 'trainer.lrr'")


def test_a_config_path_that_is_a_directory(tmp_path):
    r = run_triad("up", "-c", str(tmp_path))
    assert_one_line_error(r, f"cannot read config file {tmp_path}")


def test_a_config_file_that_is_not_text(tmp_path):
    path = tmp_path / "triad.toml"
    path.write_bytes(b"\xff\xfe\x00binary")
    r = run_triad("up", "-c", str(path))
    assert_one_line_error(r, f"cannot read config file {path}", "UTF-8")


def test_a_triad_variable_table_that_is_not_json(tmp_path):
    r = run_triad("up", f"--set=run_dir={tmp_path}", env={"TRIAD_INFERENCE__VLLM_ARGS": "--enable-lora"})
    assert_one_line_error(r, "TRIAD_* variable", "JSON")


def test_missing_model_path(tmp_path):
    r = run_triad("up", f"--set=run_dir={tmp_path}", "--set=model=/no/such/model")
    assert_one_line_error(r, "model path /no/such/model does not exist")


def test_unwritable_run_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = run_triad("up", f"--set=run_dir={blocker}/run")
    assert_one_line_error(r, f"run directory {blocker}/run is not writable")


def test_inference_that_does_not_answer(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    r = run_triad(
        "orchestrator",
        f"--set=run_dir={tmp_path}",
        f'--set=orchestrator.servers.urls=["{url}"]',
        "--set=orchestrator.servers.ready_timeout_s=2",
    )
    assert_one_line_error(r, f"{url}/health", "gave up after 2 s")


@pytest.mark.parametrize("command", ["inference", "trainer"])
def test_service_commands_check_the_model_first(tmp_path, command):
    r = run_triad(command, f"--set=run_dir={tmp_path}", "--set=model=./missing-model")
    assert_one_line_error(r, "missing-model does not exist")


def test_admin_token_required_off_loopback(tmp_path, tiny_model):
    r = run_triad(
        "inference", f"--set=run_dir={tmp_path}", f"--set=model={tiny_model}", "--set=inference.host=0.0.0.0"
    )
    assert_one_line_error(r, "refusing to expose the admin routes without a token")


def test_unknown_environment_fails_before_waiting_for_inference(tmp_path):
    r = run_triad("orchestrator", f"--set=run_dir={tmp_path}", '--set=orchestrator.environment.name="chess"')
    assert_one_line_error(r, "unknown environment 'chess'", "triad.environments")


def test_a_joiner_advertised_off_loopback_needs_the_admin_token(tmp_path, tiny_model):
    r = run_triad(
        "inference",
        "--join",
        f"--set=run_dir={tmp_path}",
        f"--set=model={tiny_model}",
        "--set=inference.advertise_url=http://gpu-7.example:9000",
    )
    assert_one_line_error(
        r, "--join would advertise http://gpu-7.example:9000 (not loopback)", "without a token"
    )
    assert not RunDir(tmp_path).fleet.read_all()  # nothing registered


def test_w_and_b_online_without_a_login_is_one_line_before_any_service_starts(tmp_path, tiny_model):
    """`metrics.wandb_mode = "online"` on a machine with no W&B key (a HOME of its own): wandb's
    UsageError came after the three services had started, as a traceback."""
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")} | {"HOME": str(tmp_path)}
    sets = [
        f"run_dir={tmp_path / 'run'}",
        'metrics.wandb_project="triad-test"',
        'metrics.wandb_mode="online"',
    ]
    r = subprocess.run(
        triad_cmd("up", *[f"--set={s}" for s in sets]), capture_output=True, text=True, timeout=120, env=env
    )
    assert_one_line_error(r, "W&B could not start", "wandb login", 'metrics.wandb_mode = "offline"')
    assert not RunDir(tmp_path / "run").logs_dir.exists(), "a service was started"


def test_a_model_cache_that_cannot_be_written_is_one_line_naming_it(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = run_triad("up", f"--set=run_dir={tmp_path / 'run'}", env={"TRIAD_CACHE": str(blocker / "cache")})
    assert_one_line_error(r, f"cannot write the model cache {blocker}/cache/models", "TRIAD_CACHE")


def test_cores_this_machine_lacks_are_one_line_before_any_service_starts(tmp_path):
    r = run_triad("up", f"--set=run_dir={tmp_path / 'run'}", '--set=trainer.cpus="0-4095"')
    assert_one_line_error(
        r, "trainer.cpus = '0-4095': cores ", "not among the cores this process may use here"
    )
    assert not RunDir(tmp_path / "run").logs_dir.exists(), "a service was started"


def test_api_server_cores_this_machine_lacks_are_one_line_before_any_service_starts(tmp_path):
    r = run_triad("up", f"--set=run_dir={tmp_path / 'run'}", '--set=inference.frontend_cpus="4095"')
    assert_one_line_error(
        r, "inference.frontend_cpus = '4095': core 4095 is", "not among the cores this process may use here"
    )
    assert not RunDir(tmp_path / "run").logs_dir.exists(), "a service was started"
