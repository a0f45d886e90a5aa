"""trainer.host: the allocator keeps freed blocks; a worker dies with its launcher."""

import os
import subprocess
import sys

import pytest

# Each round mallocs four 1 MB blocks, writes them and frees them. By default glibc
# mmaps the first ones, then raises its thresholds only to 1 MB (mmap) and 2 MB
# (trim), so the 4 MB freed at the heap top is trimmed each round and faulted in again.
ROUNDS = """
import ctypes, resource, sys
from trainer.host import keep_freed_memory
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def one_round():
    blocks = [libc.malloc(1 << 20) for _ in range(4)]
    for block in blocks:
        ctypes.memset(block, 1, 1 << 20)
    for block in blocks:
        libc.free(block)
for _ in range(3):
    one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    one_round()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], check=True, capture_output=True, text=True)
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults():
    assert page_faults("default") > 10_000  # about 20 rounds x 1024 pages of 4 KB
    assert page_faults("keep") < 50


# A stand-in for torchrun: starts a worker in a session of its own (as torchrun does),
# which asks to die with it, and prints the worker's answer.
LAUNCHER = """
import subprocess, sys, time
worker = subprocess.Popen(
    [sys.executable, "-c", "import os, time; from trainer.host import die_with_launcher; "
     "print(die_with_launcher(os.getppid()), flush=True); time.sleep(60)", sys.argv[1]],
    start_new_session=True, stdout=subprocess.PIPE, text=True,
)
print(worker.stdout.readline().strip(), flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl")
def test_a_worker_dies_with_its_launcher(monkeypatch):
    from tests.helpers import processes_mentioning, wait_until_gone

    token = f"triad-test-worker-{os.getpid()}"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, token], stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout.readline().strip() == "True"
        assert len(processes_mentioning(token)) == 2  # the launcher and its worker
    finally:
        launcher.kill()  # kill -9: the launcher cannot pass anything on
        launcher.wait()
    assert wait_until_gone(token) == []


def test_outside_torchrun_the_lifetime_is_left_alone(monkeypatch):
    from trainer.host import die_with_launcher

    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert die_with_launcher(os.getppid()) is False
