"""A process vLLM starts for a triad server dies with the server (`inference/server_children.py`):
a real parent, killed with SIGKILL, and its multiprocessing child, as vLLM starts its engine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from inference.server_children import SERVER_PID_VAR
from shared import heap
from tests.helpers import REPO, running

SERVER = """
import multiprocessing, sys, time

from inference.server_children import die_with_server


def engine(ready):
    die_with_server()  # what vLLM's plugin loading calls in the process it started
    ready.send(True)
    time.sleep(120)


if __name__ == "__main__":
    context = multiprocessing.get_context("spawn")
    waiting, ready = context.Pipe(duplex=False)  # a pipe: no semaphore left behind by the kill
    process = context.Process(target=engine, args=(ready,))
    process.start()
    waiting.recv()
    print(process.pid, flush=True)
    time.sleep(120)
"""


def engine_after_server_killed(tmp_path: Path, marked: bool) -> bool:
    """Start a server that starts an engine; kill -9 the server; is the engine alive 5 s later?"""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    env = {k: v for k, v in os.environ.items() if k != SERVER_PID_VAR}
    env["PYTHONPATH"] = str(REPO)
    if marked:
        env[SERVER_PID_VAR] = "1"  # set by the server (mark_server); any value marks it
    server = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, env=env, cwd=REPO)
    engine = int(server.stdout.readline())  # once it has asked for its parent-death signal
    server.send_signal(signal.SIGKILL)
    server.wait()
    deadline = time.monotonic() + 5
    while running(engine) and time.monotonic() < deadline:
        time.sleep(0.1)
    survived = running(engine)
    if survived:
        os.kill(engine, signal.SIGKILL)
    return survived


@pytest.mark.skipif(sys.platform != "linux", reason="prctl is Linux's")
def test_the_engine_of_a_killed_server_dies_with_it_and_only_a_triad_servers(tmp_path):
    assert not engine_after_server_killed(tmp_path, marked=True)
    assert engine_after_server_killed(tmp_path, marked=False)  # vLLM used elsewhere: left alone


FREEZE = """
import gc
from importlib.metadata import entry_points

[plugin] = [e for e in entry_points(group="vllm.general_plugins") if e.name == "triad_freeze_imported_heap"]
plugin.load()()  # as vLLM's plugin loading calls it
print(gc.get_freeze_count())
"""


def test_a_triad_servers_vllm_processes_freeze_the_heap_their_imports_made_and_no_other_vllm():
    def frozen(marked: bool) -> int:
        env = {k: v for k, v in os.environ.items() if k != SERVER_PID_VAR}
        env.update({SERVER_PID_VAR: "1"} if marked else {})
        command = [sys.executable, "-c", FREEZE]
        done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return int(done.stdout)

    assert frozen(marked=True) > 1000  # the interpreter's and importlib.metadata's objects at least
    assert frozen(marked=False) == 0  # vLLM used elsewhere in this environment: left alone


SPAWNING_SERVER = """
import gc, multiprocessing, sys

import services.cli  # as the `triad` script's first import; a spawned process imports it again
from inference.server_children import freeze_imported_heap, mark_server


def engine(answer):
    deferred = gc.get_threshold()[2]  # while it imports vLLM
    freeze_imported_heap()  # what vLLM's plugin loading calls once it has imported
    answer.send((deferred, gc.get_threshold()[2], gc.get_freeze_count() > 0))


if __name__ == "__main__":
    own = gc.get_threshold()[2]
    mark_server()
    context = multiprocessing.get_context("spawn")  # as vLLM's CPU platform starts its engine
    waiting, answer = context.Pipe(duplex=False)
    process = context.Process(target=engine, args=(answer,))
    process.start()
    print(own, *waiting.recv(), flush=True)
    process.join()
"""


@pytest.mark.parametrize(
    ("plugins", "deferred"),
    [(None, True), ("triad_die_with_server,triad_freeze_imported_heap", True), ("triad_disk", False)],
)
def test_a_process_vllm_spawns_for_a_server_imports_without_full_collections_until_the_plugin(
    tmp_path, plugins, deferred
):
    script = tmp_path / "server.py"
    script.write_text(SPAWNING_SERVER)
    env = {k: v for k, v in os.environ.items() if k not in (SERVER_PID_VAR, "VLLM_PLUGINS")}
    env["PYTHONPATH"] = str(REPO)
    env.update({"VLLM_PLUGINS": plugins} if plugins is not None else {})
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    own, while_importing, after_plugin, frozen = done.stdout.split()
    assert own == "10"  # the server's own import of services.cli defers nothing (it is not spawned)
    assert int(while_importing) == (heap.DEFERRED if deferred else 10)  # 10: CPython's default
    assert after_plugin == "10" and frozen == "True"
