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
    cfg = load_config(
        None, ['inference.cpus="0"', 'trainer.cpus="1-4"', "trainer.nproc=2", 'trainer.devices="1"']
    )
    assert child_env(cfg, INFERENCE)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    trainer = child_env(cfg, TRAINER)
    assert trainer["OMP_NUM_THREADS"] == "2" and trainer["CUDA_VISIBLE_DEVICES"] == "1"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in child_env(cfg, ORCHESTRATOR)
    assert pinned(["python", "x"], "1-4") == ["taskset", "-c", "1-4", "python", "x"]
    assert pinned(["python", "x"], None) == ["python", "x"]


def test_a_pinned_child_runs_only_on_its_cores():
    out = subprocess.run(
        pinned(["python3", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"], "0"),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[0]"


def test_bad_cpu_lists_are_refused():
    with pytest.raises(TriadError, match="inference.cpus"):
        load_config(None, ['inference.cpus="all"'])


def test_auto_cpus_split_the_cores_between_inference_and_the_trainer():
    from services.up import format_cpus, placement

    auto = load_config(None, ['inference.cpus="auto"', "trainer.nproc=1"])
    assert placement(auto, cores=[0, 1], gpu=False) == {INFERENCE: "0", TRAINER: "1"}
    assert placement(auto, cores=[0, 1, 2, 3, 4, 5], gpu=False) == {INFERENCE: "0-2", TRAINER: "3-5"}
    assert placement(auto, cores=[0, 1], gpu=True) == {INFERENCE: None, TRAINER: None}  # GPUs: no pinning
    assert placement(auto, cores=[3], gpu=False) == {INFERENCE: None, TRAINER: None}  # one core
    given = load_config(None, ['inference.cpus="auto"', 'trainer.cpus="3"'])
    assert placement(given, cores=[0, 1, 2, 3], gpu=False) == {INFERENCE: "0-1", TRAINER: "3"}
    env = child_env(auto, INFERENCE, placement(auto, cores=[0, 1], gpu=False))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert child_env(auto, TRAINER, placement(auto, cores=[0, 1], gpu=False))["OMP_NUM_THREADS"] == "1"
    assert format_cpus([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"


def test_the_embedded_default_runs_one_rank_with_cores_placed_automatically():
    from services.cli import EMBEDDED_DEFAULT

    cfg = load_config(EMBEDDED_DEFAULT, [])
    assert cfg.trainer.nproc == 1 and cfg.inference.cpus == "auto"
    assert load_config(EMBEDDED_DEFAULT, ["inference.cpus=0"]).inference.cpus == "0"  # a bare number
