"""Functions of the C library through ctypes, for the Linux-only process and file-system
calls that Python's standard library lacks (`trainer/host.py`, `shared/watch.py`)."""

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
