"""The prefix of temporary names: files being written beside their key, and the scratch and
staging directories of an object store's cache. Listings skip them.

A process's scratch names carry `owner_tag()`, `<pid>@<host>`: a sweep of the directories of dead
processes judges only the pids of its own machine, since a cache (~/.cache/triad) is often on NFS
and shared by machines whose pids mean nothing here."""

from __future__ import annotations

import os
import re
import socket

TMP_PREFIX = ".tmp-"


def this_host() -> str:
    """This machine's name as scratch names carry it: no `-` (it separates a name's parts)."""
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "_"


def owner_tag() -> str:
    return f"{os.getpid()}@{this_host()}"


def owner_of(name: str, prefix: str) -> tuple[str, int] | None:
    """(host, pid) of a name `<prefix><pid>@<host>-...`; None for a name without an owner (older
    triads wrote the pid alone: whose machine it was is unknown, so it is nobody's to sweep)."""
    if not name.startswith(prefix):
        return None
    pid, at, host = name[len(prefix) :].split("-")[0].partition("@")
    return (host, int(pid)) if at and host and pid.isdigit() else None
