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
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from shared.libc import set_parent_death_signal

GRACE_S = 5.0


class ParentDied(Exception):
    pass


def _parent_died(*_) -> None:
    raise ParentDied


def end_group(child: subprocess.Popen | None) -> None:
    """SIGTERM to this process group, `GRACE_S` for the command to end, then SIGKILL to the group."""
    os.killpg(0, signal.SIGTERM)  # this process's own SIGTERM handler does nothing
    try:
        if child is not None:
            child.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m services.die_with_parent CMD [ARGS...]", file=sys.stderr)
        return 2
    parent, child = os.getppid(), None
    signal.signal(signal.SIGTERM, lambda *_: None)  # the group's SIGTERM ends the command; we follow it
    signal.signal(signal.SIGHUP, _parent_died)
    try:
        if not set_parent_death_signal(signal.SIGHUP):
            print("die_with_parent: no prctl here; the command would outlive its parent", file=sys.stderr)
        if os.getppid() != parent:  # the parent died before the signal was set
            raise ParentDied
        child = subprocess.Popen(argv)  # in this process group; exec resets the handlers above
        code = child.wait()
    except ParentDied:
        end_group(child)
        return 1
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
