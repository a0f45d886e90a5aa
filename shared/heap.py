"""A service's start without Python's full collections, and what it made frozen once started.

Importing torch, transformers and vLLM makes some 600,000 objects that live as long as the
process. While they are made, CPython sweeps every one of them again whenever the oldest
generation has grown by a quarter: about ten full collections, 2.4 s of the inference server's
start and 1.3 s of the trainer's on a 2-core machine, each finding a few hundred objects of
garbage at most (bench/results/gc_pauses.md). Young generations are still collected meanwhile,
so cycles among short-lived objects go as before.

Once started, `started()` freezes the heap (full collections skip it from then on, as vLLM does
with its own start-up heap) and collects fully again on the interpreter's own schedule. Where an
interpreter's collector ignores the third threshold, deferring changes nothing.
"""

from __future__ import annotations

import gc

DEFERRED = 1 << 30  # young collections between full ones: none while starting
_before: int | None = None


def defer_full_collections() -> None:
    """Until `started()`, no full collection (once per process; a second call changes nothing)."""
    global _before
    if _before is None:
        *young, _before = gc.get_threshold()
        gc.set_threshold(*young, DEFERRED)


def started() -> None:
    """Freeze the start-up heap and restore full collections (deferred or not)."""
    global _before
    gc.freeze()
    if _before is not None:
        young = gc.get_threshold()[:2]
        gc.set_threshold(*young, _before)
        _before = None
