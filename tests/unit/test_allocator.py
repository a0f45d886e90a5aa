"""keep_freed_memory: freed blocks stay in the process, so reusing them costs no page faults."""

import subprocess
import sys

import pytest

# Each round mallocs four 1 MB blocks, writes them and frees them. By default glibc
# mmaps the first ones, then raises its thresholds only to 1 MB (mmap) and 2 MB
# (trim), so the 4 MB freed at the heap top is trimmed each round and faulted in again.
ROUNDS = """
import ctypes, resource, sys
from trainer.allocator import keep_freed_memory
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
