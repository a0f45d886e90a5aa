"""Functions of the C library through ctypes, for the Linux-only process and file-system
calls that Python's standard library lacks (`trainer/host.py`, `shared/watch.py`,
`services/die_with_parent.py`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def libc_function(name: str, argtypes: list, restype=ctypes.c_int):
    """`name` from the C library with its C signature, or None where there is none (not Linux,
    or a C library without it)."""
    libc = _libc() if sys.platform.startswith("linux") else None
    function = getattr(libc, name, None)
    if function is None:
        return None
    function.argtypes, function.restype = argtypes, restype
    return function


PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int) -> bool:
    """Ask Linux to send `sig` to this process when the thread that started it ends (prctl
    PR_SET_PDEATHSIG; kept across exec); False where there is no prctl."""
    ulong = ctypes.c_ulong
    prctl = libc_function("prctl", [ctypes.c_int, ulong, ulong, ulong, ulong])
    return prctl is not None and prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
