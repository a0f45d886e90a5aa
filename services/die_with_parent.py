"""`python -m services.die_with_parent CMD...`: run CMD; when the process that started this one
dies, end CMD and every process of this process group.

`triad up` starts each service through it, each in a process group of its own, so that a
`kill -9` of `triad up` leaves nothing behind: Linux sends this process a parent-death signal
(`prctl(PR_SET_PDEATHSIG)`, which fires when the thread that started it ends: `triad up` starts
its children from its main thread), and it then sends SIGTERM to its group (vLLM's engine and
worker processes are in it; torchrun stops its ranks, which run in sessions of their own, on
SIGTERM), waits `GRACE_S` for CMD to end, and SIGKILLs the group (itself included).
A SIGTERM that `triad up` sends to the group when it stops the run ends CMD as before: this
process then exits with CMD's status.

The signal's handler ends the group itself and never returns: an exception raised from a
handler is lost when the signal lands where Python ignores exceptions (a finalizer: "Exception
ignored ... ParentDied", seen once in the suite, after which the trainer went on training).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import NoReturn

from shared.libc import set_parent_death_signal

GRACE_S = 5.0


_child_pid: int | None = None  # the command, once started


def end_group(pid: int | None) -> NoReturn:
    """SIGTERM to this process group, `GRACE_S` for the command `pid` to end, then SIGKILL to the
    group, this process included."""
    os.killpg(0, signal.SIGTERM)  # this process's own SIGTERM handler does nothing
    deadline = time.monotonic() + GRACE_S
    while pid is not None and time.monotonic() < deadline:
        try:
            ended, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped already
            break
        if ended:
            break
        time.sleep(0.05)
    os.killpg(0, signal.SIGKILL)
    os._exit(1)  # not reached: the SIGKILL ends this process too


def _parent_died(*_) -> NoReturn:
    end_group(_child_pid)


def main(argv: list[str]) -> int:
    global _child_pid
    if not argv:
        print("usage: python -m services.die_with_parent CMD [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    signal.signal(signal.SIGTERM, lambda *_: None)  # the group's SIGTERM ends the command; we follow it
    signal.signal(signal.SIGHUP, _parent_died)
    if not set_parent_death_signal(signal.SIGHUP):
        print("die_with_parent: no prctl here; the command would outlive its parent", file=sys.stderr)
    if os.getppid() != parent:  # the parent died before the signal was set
        end_group(None)
    child = subprocess.Popen(argv)  # in this process group; exec resets the handlers above
    _child_pid = child.pid
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
