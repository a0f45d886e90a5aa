"""vLLM's processes die with the server that started them, and start without sweeping the heap
their imports left.

`triad inference` (and the stock `vllm serve` it runs in its place) puts its own pid in
`SERVER_PID_VAR` before vLLM starts its engine process (and, with several workers, the worker
processes). vLLM calls its general plugins in every process it starts (pyproject's
`vllm.general_plugins`); there `die_with_server` asks Linux to SIGKILL the process when its
parent ends (`prctl(PR_SET_PDEATHSIG)`, which fires when the parent's thread that started it
ends: vLLM starts them from its main thread). A `kill -9` of the server then leaves no engine
behind holding the cores, memory or GPU of the next server. vLLM's processes elsewhere in this
environment, and the server's own process, are left alone.

In the same processes, and the server's own, `freeze_imported_heap` takes the objects their imports
made (torch's, transformers', vLLM's: about 635,000) out of the garbage collector's sweeps, as
vLLM itself does once its engine has started (`freeze_gc_heap`): before that it sweeps them whole
twice while it loads the model and three times more to freeze them, 1.1-1.3 s of each start on
this project's 2-core machine. And while a process vLLM spawned imports vLLM, no full collection
sweeps them at all (`defer_in_a_spawned_process`): about nine, 1.3-3.5 s of the engine core's
import of vLLM here.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing
import os
import signal
from collections.abc import MutableMapping

from shared import heap
from shared.libc import set_parent_death_signal

SERVER_PID_VAR = "TRIAD_INFERENCE_PID"
FREEZE_PLUGIN = "triad_freeze_imported_heap"  # pyproject's name of `freeze_imported_heap`
log = logging.getLogger("triad.inference")


def mark_server(env: MutableMapping[str, str] = os.environ) -> None:
    """Name this process as the server whose vLLM processes are to die with it."""
    env[SERVER_PID_VAR] = str(os.getpid())


def die_with_server() -> None:
    """In a process vLLM started for a triad server: SIGKILL when its parent ends."""
    parent = multiprocessing.parent_process()
    if not os.environ.get(SERVER_PID_VAR) or parent is None:
        return
    if not set_parent_death_signal(signal.SIGKILL):
        log.warning("no prctl here: this vLLM process would outlive a killed server")
        return
    if os.getppid() != parent.pid:  # the parent ended before the signal was asked for
        os.kill(os.getpid(), signal.SIGKILL)


def started_for_server() -> bool:
    """A process started by a triad server (vLLM's engine core or a worker), not the server's."""
    marker = os.environ.get(SERVER_PID_VAR)
    return bool(marker) and marker != str(os.getpid())


def defer_in_a_spawned_process() -> None:
    """Where a process vLLM spawns for a triad server first runs triad's code: the spawn imports
    the server's main module (`services.cli`) before vLLM's. No full collection there until
    `freeze_imported_heap`, which vLLM calls once it has imported, restores them; none deferred
    where `VLLM_PLUGINS` leaves that plugin out, since nothing would restore them."""
    plugins = os.environ.get("VLLM_PLUGINS")
    if started_for_server() and (plugins is None or FREEZE_PLUGIN in plugins.split(",")):
        heap.defer_full_collections()


def freeze_imported_heap() -> None:
    """In a triad server's process or one vLLM started for it: what exists now is kept as it is
    by the garbage collector (`gc.freeze`); only what is made later is swept. In a started
    process, full collections deferred while it imported are restored too (`shared/heap.py`;
    the server restores its own once it serves)."""
    if started_for_server():
        heap.started()
    elif os.environ.get(SERVER_PID_VAR):
        gc.freeze()
