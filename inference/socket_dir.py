"""A directory of its own for the sockets of each server's vLLM processes.

vLLM's API server and engine core talk over ZMQ `ipc://` sockets, files it names under
`VLLM_RPC_BASE_PATH` (the system's temporary directory unless set). A stopped server leaves them
there, three a start (seen after `triad up` ended normally as much as after a `kill -9`), so a
machine that starts servers for days, or a test suite, fills `/tmp` with them. Each server
gets `<tmp>/triad-vllm-<pid>-XXXXXXXX` instead: removed when it ends, and, where a `kill -9` left
it, by the next server started on this machine. A user's own `VLLM_RPC_BASE_PATH` is kept.

The name carries the pid alone, not `shared/tmpname.py`'s `<pid>@<host>`: a socket's path is at
most 107 bytes, and the temporary directory is this machine's own.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import MutableMapping
from pathlib import Path

from shared.objectcache import sweep_dead_dirs
from shared.tmpname import this_host

VAR = "VLLM_RPC_BASE_PATH"
PREFIX = "triad-vllm-"
SOCKET_PATH_MAX = 107  # bytes of a socket's path (sockaddr_un.sun_path), as ZMQ checks it
SOCKET_NAME = 36  # vLLM names each socket by a uuid4
log = logging.getLogger("triad.inference")


def owner(name: str) -> tuple[str, int] | None:
    """(this machine, pid) of a name `<PREFIX><pid>-...`: the temporary directory is its own."""
    pid = name.removeprefix(PREFIX).split("-")[0]
    return (this_host(), int(pid)) if name.startswith(PREFIX) and pid.isdigit() else None


def sweep_dead(base: Path) -> list[Path]:
    """Remove the socket directories under `base` of servers that are gone."""
    swept = sweep_dead_dirs(base.glob(f"{PREFIX}*"), PREFIX, owner)
    if swept:
        log.info("removed %d socket directories of stopped servers from %s", len(swept), base)
    return swept


def own_socket_dir(env: MutableMapping[str, str] = os.environ) -> Path | None:
    """A new socket directory of this process's, named in `env` for vLLM, after the dead servers'
    are swept; None (and `env` as it was) where `env` names one already, or where a directory's
    name would make the sockets' paths longer than a socket's path can be."""
    if VAR in env:
        return None
    base = Path(tempfile.gettempdir())
    sweep_dead(base)
    prefix = f"{PREFIX}{os.getpid()}-"
    if len(f"{base}/{prefix}XXXXXXXX/") + SOCKET_NAME > SOCKET_PATH_MAX:
        log.warning(
            "the temporary directory %s is too long a path for vLLM's sockets in a directory of their "
            "own: they go in it, and stay there when the server stops (set TMPDIR or %s to a shorter path)",
            base,
            VAR,
        )
        return None
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
    env[VAR] = str(path)
    return path
