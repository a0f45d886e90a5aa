"""Network helpers shared by the services and the tests (standard library only)."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, chosen by the OS.

    Another process may still take it before the caller binds it: use it at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
