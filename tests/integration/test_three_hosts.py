"""The three services on three network hosts (namespaces) sharing only a directory.

The orchestrator runs from its own virtual environment, installed from the
`orchestrator` extra alone: neither torch nor vLLM can be imported there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shared.rundir import RunDir
from tests.helpers import REPO, trainer_cmd

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 3
INFERENCE_IP, ORCHESTRATOR_IP = "10.231.77.1", "10.231.77.2"
TOKEN = "netns-test-token"


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True)


@pytest.fixture(scope="module")
def hosts():
    """Three namespaces: inference and orchestrator joined by a veth pair, the trainer alone."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    tag = uuid.uuid4().hex[:6]
    names = {role: f"triad-{role}-{tag}" for role in ("inf", "orc", "trn")}
    try:
        for ns in names.values():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
    a, b = f"vi{tag}", f"vo{tag}"
    sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    for dev, ns, ip in ((a, names["inf"], INFERENCE_IP), (b, names["orc"], ORCHESTRATOR_IP)):
        sh("ip", "link", "set", dev, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
    yield names
    for ns in names.values():
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def orchestrator_venv(tmp_path_factory) -> Path:
    venv = tmp_path_factory.mktemp("orchestrator-venv")
    source = tmp_path_factory.mktemp("source")  # build from a copy: no build/ left in the repo
    for item in ("pyproject.toml", "README.md", "shared", "inference", "orchestrator", "trainer", "services"):
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy
        copy(REPO / item, source / item)
    sh(sys.executable, "-m", "venv", str(venv))
    sh(str(venv / "bin" / "pip"), "install", "-q", f"{source}[orchestrator]")
    for heavy in ("torch", "vllm"):
        probe = subprocess.run([str(venv / "bin" / "python"), "-c", f"import {heavy}"], capture_output=True)
        assert probe.returncode != 0, f"{heavy} is importable in the orchestrator-only environment"
    return venv


def in_ns(ns: str, *cmd: str, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *cmd], stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def stop(proc: subprocess.Popen) -> None:
    """Stop a service and everything it started (vLLM's engine, torchrun's ranks)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_three_hosts_share_only_a_directory(hosts, orchestrator_venv, tiny_model, tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "triad.toml"
    config.write_text(
        f'run_dir = "{run_dir}"\nmodel = "{tiny_model}"\nmax_steps = {STEPS}\nmax_async_level = 1\n'
        f'[inference]\nhost = "{INFERENCE_IP}"\nport = 8000\nadmin_token = "{TOKEN}"\n'
        f'[orchestrator]\nservers.urls = ["http://{INFERENCE_IP}:8000"]\nbatch_size = 4\ngroup_size = 4\n'
        f"[trainer.optim]\nlr = 1e-3\n"
    )
    py = sys.executable
    inference = in_ns(
        hosts["inf"], py, "-m", "services.cli", "inference", "-c", str(config), log=tmp_path / "inf.log"
    )
    trainer = in_ns(
        hosts["trn"],
        *trainer_cmd("-c", str(config), nproc=2, python=py),
        log=tmp_path / "trn.log",
    )
    orchestrator = in_ns(
        hosts["orc"],
        str(orchestrator_venv / "bin" / "triad"),
        "orchestrator",
        "-c",
        str(config),
        log=tmp_path / "orc.log",
    )
    try:
        for name, proc in (("orchestrator", orchestrator), ("trainer", trainer)):
            code = proc.wait(timeout=600)
            logs = "\n".join(p.name + ":\n" + p.read_text()[-2500:] for p in sorted(tmp_path.glob("*.log")))
            assert code == 0, f"{name} failed:\n{logs}"
    finally:
        for proc in (inference, trainer, orchestrator):
            stop(proc)
    rundir = RunDir(run_dir)
    run_id = rundir.read_run().run_id
    assert rundir.rollouts.done_steps(run_id) == list(range(1, STEPS + 1))
    assert rundir.weights.done_steps(run_id)[-1] == STEPS
    assert rundir.metrics.rows("inference")[-1]["version"] == STEPS
    assert f"http://{INFERENCE_IP}:8000" in (tmp_path / "orc.log").read_text()
