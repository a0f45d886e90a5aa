"""`services/die_with_parent.py`: what `triad up` starts ends with it, even after a `kill -9`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# a service that starts a process of its own (as vLLM starts its engine), then writes both pids
SERVICE = """
import subprocess, sys, time, os
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1000)"])
open(sys.argv[1], "w").write(f"{os.getpid()} {helper.pid}")
time.sleep(1000)
"""
# `triad up`'s part: start the service through the wrapper, in a group of its own, and wait
SUPERVISOR = """
import subprocess, sys, time
wrapper = [sys.executable, "-m", "services.die_with_parent"]
subprocess.Popen([*wrapper, sys.executable, "-c", *sys.argv[1:]], start_new_session=True)
time.sleep(1000)
"""


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_kill_9_of_the_supervisor_ends_the_service_and_what_it_started(tmp_path):
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR, SERVICE, str(pids_file)], env=env, cwd=ROOT
    )
    deadline = time.monotonic() + 30
    while not (pids_file.exists() and pids_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    service, helper = map(int, pids_file.read_text().split())
    assert alive(service) and alive(helper)
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait()
    killed = time.monotonic()
    while (alive(service) or alive(helper)) and time.monotonic() - killed < 10:
        time.sleep(0.05)
    assert not alive(service) and not alive(helper)
    assert time.monotonic() - killed < 3  # the service ends on SIGTERM at once: no grace period needed


def test_the_wrapper_exits_with_the_commands_status():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    wrapped = [sys.executable, "-m", "services.die_with_parent"]
    assert subprocess.run([*wrapped, "sh", "-c", "exit 3"], env=env, cwd=ROOT).returncode == 3
    assert subprocess.run([*wrapped, "sh", "-c", "kill -9 $$"], env=env, cwd=ROOT).returncode == 128 + 9
