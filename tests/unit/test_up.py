"""`triad up`'s placement of its children: GPUs, CPU cores and thread counts."""

from __future__ import annotations

import subprocess

import pytest

from services.up import child_env, parse_cpus, pinned
from shared.config import load_config
from shared.errors import TriadError
from shared.rundir import INFERENCE, ORCHESTRATOR, TRAINER


def test_cpu_lists_parse_like_taskset():
    assert parse_cpus("0-3,8") == {0, 1, 2, 3, 8} and parse_cpus("1") == {1}


def test_children_get_their_devices_cores_and_threads():
    cfg = load_config(None, ['inference.cpus="0"', 'trainer.cpus="1-4"', "trainer.nproc=2",
                             'trainer.devices="1"'])  # fmt: skip
    assert child_env(cfg, INFERENCE)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    trainer = child_env(cfg, TRAINER)
    assert trainer["OMP_NUM_THREADS"] == "2" and trainer["CUDA_VISIBLE_DEVICES"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in child_env(cfg, ORCHESTRATOR)
    assert pinned(["python", "x"], "1-4") == ["taskset", "-c", "1-4", "python", "x"]
    assert pinned(["python", "x"], None) == ["python", "x"]


def test_a_pinned_child_runs_only_on_its_cores():
    out = subprocess.run(pinned(["python3", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], "0"),
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == "[0]"


def test_bad_cpu_lists_are_refused():
    with pytest.raises(TriadError, match="inference.cpus"):
        load_config(None, ['inference.cpus="all"'])
