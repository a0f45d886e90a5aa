"""Authenticating TCP forwarders for the broadcast group's TCPStore, which has no auth.

The store's side (`Gate`) listens on the configured address and forwards a connection to
the real store on loopback only after the peer answers a challenge: the gate sends a random
nonce, the peer replies HMAC-SHA256(secret, nonce). The peer's side (`Dialer`) listens on
loopback, answers the challenge for each local connection, then relays bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import socket
import threading

log = logging.getLogger("triad.authstore")
NONCE_BYTES = 32
HANDSHAKE_TIMEOUT_S = 5.0
CHUNK = 1 << 16


def store_secret(token: str, run_id: str) -> bytes:
    """The secret a broadcast peer proves it holds: derived from the run's admin token."""
    return hmac.new(token.encode(), run_id.encode(), hashlib.sha256).digest()


def answer(secret: bytes, nonce: bytes) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
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
    """A listening socket whose accepted connections are each handled on a thread."""

    def __init__(self, host: str, port: int, what: str) -> None:
        self.what = what
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
        threading.Thread(target=self.serve, daemon=True, name=what).start()

    def serve(self) -> None:
        while not self.closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.handle, args=(conn, peer), daemon=True).start()

    def handle(self, conn: socket.socket, peer) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class Gate(Listener):
    """Admits a peer to the store at 127.0.0.1:`target_port` once it proves it holds `secret`."""

    def __init__(self, host: str, port: int, target_port: int, secret: bytes) -> None:
        self.target_port, self.secret = target_port, secret
        self.refused: set[str] = set()
        self.lock = threading.Lock()
        super().__init__(host, port, "the broadcast store's gate")

    def handle(self, conn: socket.socket, peer) -> None:
        nonce = os.urandom(NONCE_BYTES)
        try:
            conn.settimeout(HANDSHAKE_TIMEOUT_S)
            conn.sendall(nonce)
            reply = read_exact(conn, hashlib.sha256().digest_size)
            ok = hmac.compare_digest(reply, answer(self.secret, nonce))
            why = "wrong answer to the challenge (not this run's admin token)"
        except (OSError, ConnectionError) as e:
            ok, why = False, f"no answer to the challenge within {HANDSHAKE_TIMEOUT_S:g} s ({e})"
        if not ok:
            self.refuse(conn, peer[0], why)
            return
        try:
            store = socket.create_connection(("127.0.0.1", self.target_port), timeout=HANDSHAKE_TIMEOUT_S)
        except OSError as e:
            log.error("broadcast store gate: cannot reach the store at 127.0.0.1:%d: %s", self.target_port, e)
            conn.close()
            return
        conn.settimeout(None)
        store.settimeout(None)
        relay(conn, store)

    def refuse(self, conn: socket.socket, address: str, why: str) -> None:
        conn.close()
        with self.lock:
            first = address not in self.refused
            self.refused.add(address)
        if first:
            log.warning("broadcast store: refused peer %s: %s (logged once per address)", address, why)


class Dialer(Listener):
    """A loopback port that forwards each connection to the gate at `host`:`port`,
    answering its challenge with `secret` first."""

    def __init__(self, host: str, port: int, secret: bytes) -> None:
        self.host, self.remote_port, self.secret = host, port, secret
        super().__init__("127.0.0.1", 0, f"the dialer to the broadcast store at {host}:{port}")

    def handle(self, conn: socket.socket, peer) -> None:
        try:
            remote = socket.create_connection((self.host, self.remote_port), timeout=HANDSHAKE_TIMEOUT_S)
            remote.sendall(answer(self.secret, read_exact(remote, NONCE_BYTES)))
        except (OSError, ConnectionError) as e:
            log.error("broadcast store at %s:%d: handshake failed: %s", self.host, self.remote_port, e)
            conn.close()
            return
        remote.settimeout(None)
        relay(conn, remote)
