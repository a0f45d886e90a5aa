"""`triad up`'s placement of its children: GPUs, CPU cores and thread counts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from services.placement import pinned
from services.up import child_env
from shared.config import load_config
from shared.cpus import parse_cpus
from shared.errors import TriadError
from shared.rundir import INFERENCE, ORCHESTRATOR, TRAINER, RunDir


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
    from services.placement import placement
    from shared.cpus import format_cpus

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


# the end of a trainer's log when its rank failed with a one-line error under torchrun (shape of
# torch.distributed.elastic's report, abridged)
TORCHRUN_FAILURE = """\
triad trainer: error: trainer.lora.target_modules: lm_head shares its weight with the input embeddings \
in this model (tie_word_embeddings), so an adapter on it cannot be merged into what was trained; drop \
lm_head from the targets or use a model with its own lm_head
E1126 12:00:00.000000 1234 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 2) \
local_rank: 0 (pid: 1235) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
services.cli FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  exitcode  : 2 (pid: 1235)
============================================================
"""


def child_printing(tmp_path, name: str, text: str, code: int):
    from services.up import Child

    log = tmp_path / f"{name}.log"
    script = f"import sys; sys.stdout.write({text!r}); sys.exit({code})"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["python3", "-c", script], stdout=out, stderr=subprocess.STDOUT)
    proc.wait()
    return Child(name, proc, log)


class NoProgress:
    def poll(self) -> None:
        pass


@pytest.mark.parametrize(
    "name, text, line",
    [
        (TRAINER, TORCHRUN_FAILURE, "trainer.lora.target_modules: lm_head shares its weight"),
        (
            ORCHESTRATOR,
            "triad orchestrator: error: unknown environment 'nosuch'; built-ins: [...]\n",
            "unknown environment 'nosuch'; built-ins: [...]",
        ),
        (
            INFERENCE,
            "INFO loading\n[rank0]: triad inference: error: refusing to expose the admin routes "
            "without a token\n",
            "refusing to expose the admin routes without a token",
        ),
    ],
)
def test_a_child_s_one_line_error_is_what_up_reports(tmp_path, name, text, line):
    from services.up import supervise

    others = {n: child_printing(tmp_path, n, "", 0) for n in (ORCHESTRATOR, TRAINER) if n != name}
    with pytest.raises(TriadError) as e:
        supervise({name: child_printing(tmp_path, name, text, 2), **others}, NoProgress())
    message = str(e.value)
    assert message.startswith(f"{name}: {line}") and "\n" not in message
    assert f"(exit code 2; log: {tmp_path / name}.log)" in message and "ChildFailedError" not in message


def test_a_child_without_an_error_line_shows_its_last_lines(tmp_path):
    from services.up import supervise

    text = "".join(f"line {i}\n" for i in range(40)) + "Segmentation fault\n"
    with pytest.raises(TriadError) as e:
        supervise({TRAINER: child_printing(tmp_path, TRAINER, text, 139)}, NoProgress())
    lines = str(e.value).splitlines()
    assert lines[0] == f"trainer exited with code 139; last lines of {tmp_path / TRAINER}.log:"
    assert lines[1] == "line 16" and lines[-1] == "Segmentation fault" and len(lines) == 26


def test_a_second_start_reports_its_own_error_not_the_first_s(tmp_path):
    """The log of a run's orchestrator keeps every start's output; the error of this start is
    the one reported."""
    from services.up import start, supervise

    rundir = RunDir(tmp_path / "run")
    rundir.logs_dir.mkdir(parents=True)
    first = "triad orchestrator: error: unknown environment 'nosuch'; built-ins: [...]\n"
    rundir.log_file(ORCHESTRATOR).write_text(first)
    second = "import sys; print(\"triad orchestrator: error: unknown environment 'other'\"); sys.exit(2)"
    child = start(ORCHESTRATOR, [sys.executable, "-c", second], rundir, dict(os.environ))
    child.proc.wait()
    with pytest.raises(TriadError) as e:
        supervise({ORCHESTRATOR: child, TRAINER: child_printing(tmp_path, TRAINER, "", 0)}, NoProgress())
    assert str(e.value).startswith("orchestrator: unknown environment 'other' (exit code 2")


LM_HEAD_LORA = ["trainer.lora.rank=8", 'trainer.lora.target_modules=["lm_head"]']


@pytest.mark.parametrize(
    "model_config, overrides, refused",
    [
        ({"tie_word_embeddings": True}, LM_HEAD_LORA, True),
        ({"tie_word_embeddings": False}, LM_HEAD_LORA, False),
        ({"tie_word_embeddings": True}, ["trainer.lora.rank=8"], False),
        ({"tie_word_embeddings": True}, LM_HEAD_LORA[1:], False),  # rank 0: no LoRA
    ],
)
def test_an_adapter_on_a_tied_lm_head_is_refused_before_launch(tmp_path, model_config, overrides, refused):
    import json

    from services.up import check_model_config
    from shared.config import TIED_LM_HEAD

    (tmp_path / "config.json").write_text(json.dumps(model_config))
    cfg = load_config(None, overrides)
    if refused:
        with pytest.raises(TriadError, match="lm_head shares its weight") as e:
            check_model_config(cfg, str(tmp_path))
        assert str(e.value) == TIED_LM_HEAD
    else:
        check_model_config(cfg, str(tmp_path))
    check_model_config(cfg, "Qwen/Qwen3-0.6B")  # a hub id: left to the services


def test_an_unreadable_model_config_is_one_line(tmp_path):
    from services.up import check_model_config

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(TriadError, match=f"cannot read the model's config {tmp_path}/config.json"):
        check_model_config(load_config(None, []), str(tmp_path))


@pytest.mark.parametrize(
    "sets, gpu, refused",
    [
        (
            ['trainer.cpus="0-3"'],
            False,
            "trainer.cpus = '0-3': cores 2-3 are not among the cores this process may",
        ),
        (
            ['inference.cpus="1,5"'],
            False,
            "inference.cpus = '1,5': core 5 is not among the cores this process may use here (0-1)",
        ),
        (['trainer.cpus="1-0"'], False, "trainer.cpus = '1-0': the range 1-0 runs backwards; write 0-1"),
        (
            ['trainer.borrow_cpus="0,3"'],
            False,
            "trainer.borrow_cpus = '0,3': core 3 is not among the cores this process may use here (0-1)",
        ),
        (
            ["trainer.nproc=2", 'trainer.devices="0"'],
            True,
            "trainer.nproc = 2 ranks, one a GPU, but trainer.devices = '0' has 1",
        ),
        (["trainer.nproc=2", 'trainer.devices="0"'], False, None),  # ranks on CPU
        (['inference.cpus="0"', 'trainer.cpus="1"', "trainer.nproc=2"], False, None),
    ],
)
def test_cores_and_gpus_the_machine_lacks_are_refused_before_launch(sets, gpu, refused):
    from services.placement import check_placement

    cfg = load_config(None, sets)
    if refused is None:
        check_placement(cfg, cores={0, 1}, gpu=gpu)
        return
    with pytest.raises(TriadError) as e:
        check_placement(cfg, cores={0, 1}, gpu=gpu)
    assert str(e.value).startswith(refused), str(e.value)


def test_auto_cores_let_the_trainer_borrow_inference_s_and_only_then():
    from services.placement import borrowed_cores, placement
    from services.up import child_commands

    auto = load_config(None, ['inference.cpus="auto"', "trainer.nproc=1"])
    split = placement(auto, cores=[0, 1, 2, 3], gpu=False)
    assert borrowed_cores(auto, split) == "0-1"
    commands = child_commands(auto, None, [], "/models/m", None, borrowed_cores(auto, split))
    assert commands[TRAINER][-1] == "--set=trainer.borrow_cpus=0-1"
    assert not any("borrow_cpus" in arg for arg in commands[INFERENCE] + commands["orchestrator"])
    assert borrowed_cores(auto, placement(auto, cores=[0, 1], gpu=True)) is None  # nothing split
    given = load_config(None, ['inference.cpus="auto"', 'trainer.cpus="1"'])  # the user chose the trainer's
    assert borrowed_cores(given, placement(given, cores=[0, 1], gpu=False)) is None
    named = load_config(None, ['inference.cpus="auto"', 'trainer.borrow_cpus="0"'])  # the trainer reads it
    assert borrowed_cores(named, placement(named, cores=[0, 1], gpu=False)) is None
    assert borrowed_cores(load_config(None, []), placement(load_config(None, []), cores=[0, 1])) is None


def test_auto_cores_put_vllm_s_api_server_beside_the_trainer():
    from services.placement import frontend_cores, placement
    from services.up import child_commands

    auto = load_config(None, ['inference.cpus="auto"', "trainer.nproc=1"])
    split = placement(auto, cores=[0, 1, 2, 3], gpu=False)
    assert frontend_cores(auto, split) == "2-3"
    commands = child_commands(auto, None, [], "/models/m", frontend_cores(auto, split))
    assert commands[INFERENCE][-1] == "--set=inference.frontend_cpus=2-3"
    assert not any("frontend_cpus" in arg for arg in commands[TRAINER] + commands["orchestrator"])
    assert frontend_cores(auto, placement(auto, cores=[0, 1], gpu=True)) is None  # nothing split
    frozen = load_config(None, ['inference.cpus="auto"', 'inference.backend="none"'])  # triad's launcher
    assert frontend_cores(frozen, placement(frozen, cores=[0, 1], gpu=False)) == "1"
    shared = load_config(None, ['inference.cpus="auto"', 'trainer.cpus="0-1"'])  # the hint's setting
    assert frontend_cores(shared, placement(shared, cores=[0, 1], gpu=False)) == "0-1"
    stock = load_config(None, ['inference.cpus="auto"', 'inference.backend="vllm"'])
    assert frontend_cores(stock, placement(stock, cores=[0, 1], gpu=False)) is None  # not triad's launcher
    given = load_config(None, ['inference.cpus="auto"', 'inference.frontend_cpus="0"'])
    assert frontend_cores(given, placement(given, cores=[0, 1], gpu=False)) is None  # inference reads it
    pinned_by_hand = load_config(None, ['inference.cpus="0"', 'trainer.cpus="1"'])
    assert frontend_cores(pinned_by_hand, placement(pinned_by_hand, cores=[0, 1], gpu=False)) is None


def test_frontend_cores_need_triad_s_launcher_and_cores_this_machine_has():
    from services.placement import check_placement

    with pytest.raises(TriadError, match="inference.frontend_cpus needs triad's launcher"):
        load_config(None, ['inference.backend="vllm"', 'inference.frontend_cpus="1"'])
    with pytest.raises(TriadError, match="inference.frontend_cpus"):
        load_config(None, ['inference.frontend_cpus="all"'])
    cfg = load_config(None, ['inference.frontend_cpus="5"'])
    with pytest.raises(TriadError, match=r"^inference.frontend_cpus = '5': core 5 is not among"):
        check_placement(cfg, cores={0, 1}, gpu=False)
