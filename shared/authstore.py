"""Authenticating TCP forwarders for the broadcast group's TCPStore, which has no auth.

The store's side (`Gate`) listens on the configured address and forwards a connection to
the real store on loopback only after the peer answers a challenge: the gate sends a random
nonce, the peer replies HMAC-SHA256(secret, nonce). The peer's side (`Dialer`) listens on
loopback, answers the challenge for each local connection, then relays bytes. Each
handshake has one deadline, and only `MAX_PENDING_HANDSHAKES` run at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import socket
import threading
import time

log = logging.getLogger("triad.authstore")
NONCE_BYTES = 32
HANDSHAKE_TIMEOUT_S = 5.0  # the whole handshake, not each read
MAX_PENDING_HANDSHAKES = 32  # a broadcast group's peers each open a few store connections
CHUNK = 1 << 16


def store_secret(token: str, run_id: str) -> bytes:
    """The secret a broadcast peer proves it holds: derived from the run's admin token."""
    return hmac.new(token.encode(), run_id.encode(), hashlib.sha256).digest()


def answer(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def read_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """`n` bytes from `sock`, all of them by `deadline` (`time.monotonic()`): a peer that sends
    a byte at a time cannot stretch the handshake."""
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(data)} of {n} handshake bytes by the deadline")
        sock.settimeout(left)
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError(f"peer closed after {len(data)} of {n} handshake bytes")
        data += part
    return data


def pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                s.shutdown(how)


def relay(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both directions end, then close both sockets."""
    back = threading.Thread(target=pump, args=(b, a), daemon=True)
    back.start()
    pump(a, b)
    back.join()
    a.close()
    b.close()


class Listener:
    """A listening socket whose accepted connections each get a thread: the handshake
    (`handshake`, within `handshake_s` in all), then a relay to the socket it returns. At most
    `max_pending` handshakes run at once; a connection beyond them is closed at once, so a
    flood of silent connections costs neither unbounded threads nor the legitimate peers'
    slots for longer than `handshake_s`."""

    def __init__(self, host: str, port: int, what: str, handshake_s: float, max_pending: int) -> None:
        self.what, self.handshake_s = what, handshake_s
        self.pending = threading.BoundedSemaphore(max_pending)
        self.max_pending = max_pending
        try:
            family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            self.sock = socket.socket(family, kind)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(address)
            self.sock.listen(128)
        except OSError as e:
            raise OSError(f"cannot listen on {host}:{port} for {what}: {e}") from None
        self.port = self.sock.getsockname()[1]
        self.closed = False
        self.turned_away = 0
        threading.Thread(target=self.serve, daemon=True, name=what).start()

    def serve(self) -> None:
        while not self.closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            if not self.pending.acquire(blocking=False):
                self.turned_away += 1
                if self.turned_away == 1:
                    log.warning(
                        "%s: %d handshakes pending, turning new connections away", self.what, self.max_pending
                    )
                conn.close()
                continue
            threading.Thread(target=self.handle, args=(conn, peer), daemon=True).start()

    def handle(self, conn: socket.socket, peer) -> None:
        try:
            other = self.handshake(conn, peer, time.monotonic() + self.handshake_s)
        finally:
            self.pending.release()
        if other is None:
            conn.close()
            return
        conn.settimeout(None)
        other.settimeout(None)
        relay(conn, other)

    def handshake(self, conn: socket.socket, peer, deadline: float) -> socket.socket | None:
        """The socket to relay `conn` to once the handshake succeeded by `deadline`; None to close it."""
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Gate(Listener):
    """Admits a peer to the store at 127.0.0.1:`target_port` once it proves it holds `secret`."""

    def __init__(
        self,
        host: str,
        port: int,
        target_port: int,
        secret: bytes,
        handshake_s: float = HANDSHAKE_TIMEOUT_S,
        max_pending: int = MAX_PENDING_HANDSHAKES,
    ) -> None:
        self.target_port, self.secret = target_port, secret
        self.refused: set[str] = set()
        self.lock = threading.Lock()
        super().__init__(host, port, "the broadcast store's gate", handshake_s, max_pending)

    def handshake(self, conn: socket.socket, peer, deadline: float) -> socket.socket | None:
        nonce = os.urandom(NONCE_BYTES)
        try:
            conn.settimeout(self.handshake_s)
            conn.sendall(nonce)
            reply = read_exact(conn, hashlib.sha256().digest_size, deadline)
            ok = hmac.compare_digest(reply, answer(self.secret, nonce))
            why = "wrong answer to the challenge (not this run's admin token)"
        except (OSError, ConnectionError) as e:
            ok, why = False, f"no answer to the challenge within {self.handshake_s:g} s ({e})"
        if not ok:
            self.refuse(peer[0], why)
            return None
        try:
            return socket.create_connection(("127.0.0.1", self.target_port), timeout=self.handshake_s)
        except OSError as e:
            log.error("broadcast store gate: cannot reach the store at 127.0.0.1:%d: %s", self.target_port, e)
            return None

    def refuse(self, address: str, why: str) -> None:
        with self.lock:
            first = address not in self.refused
            self.refused.add(address)
        if first:
            log.warning("broadcast store: refused peer %s: %s (logged once per address)", address, why)


class Dialer(Listener):
    """A loopback port that forwards each connection to the gate at `host`:`port`,
    answering its challenge with `secret` first."""

    def __init__(self, host: str, port: int, secret: bytes, handshake_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        self.host, self.remote_port, self.secret = host, port, secret
        where = f"the dialer to the broadcast store at {host}:{port}"
        super().__init__("127.0.0.1", 0, where, handshake_s, MAX_PENDING_HANDSHAKES)

    def handshake(self, conn: socket.socket, peer, deadline: float) -> socket.socket | None:
        try:
            remote = socket.create_connection((self.host, self.remote_port), timeout=self.handshake_s)
            remote.sendall(answer(self.secret, read_exact(remote, NONCE_BYTES, deadline)))
        except (OSError, ConnectionError) as e:
            log.error("broadcast store at %s:%d: handshake failed: %s", self.host, self.remote_port, e)
            return None
        return remote
