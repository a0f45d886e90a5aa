"""Network helpers shared by the services and the tests (standard library only)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from shared.errors import TriadError

# Linux's range of ports for a bind to port 0 and for outgoing connections
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_PICK = 10_000
PICK_TRIES = 64


def ephemeral_range(path: Path = EPHEMERAL_RANGE) -> tuple[int, int] | None:
    try:
        low, high = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def free_port(rng: random.Random | None = None, ephemeral: tuple[int, int] | None = None) -> int:
    """A TCP port that nothing on this machine listens on right now.

    The caller binds it later, so another process may take it in between. It is drawn below the
    kernel's ephemeral range: a port that no bind to port 0 and no outgoing connection of another
    process is handed (vLLM's engine sockets, torchrun's store, any client), so only another
    explicit choice can take it. Where the range is unknown or starts too low, the OS picks one of
    its ephemeral ports, as a bind to port 0 does."""
    rng = rng or random.Random()
    ephemeral = ephemeral or ephemeral_range()
    if ephemeral is not None and ephemeral[0] - LOWEST_PICK >= PICK_TRIES:
        for _ in range(PICK_TRIES):
            port = rng.randrange(LOWEST_PICK, ephemeral[0])
            if port_is_free(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a server could listen on `port` at every IPv4 address of this machine now."""
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def check_can_listen(host: str, port: int, option: str) -> None:
    """TriadError in one line if a server cannot listen on `host`:`port` now (another process
    holds it, or `host` is no address of this machine); `option` names the setting to change.
    Like a server, it reuses an address whose old connections are only closing (TIME_WAIT)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(address)
    except OSError as e:
        reason = e.strerror or str(e)
        raise TriadError(
            f"cannot listen on {host}:{port} ({reason}): stop the process that holds the port, "
            f"or set {option} to a free one"
        ) from None
