"""Only peers that prove they hold the run's secret reach the broadcast group's TCPStore:
real sockets, a real torch TCPStore behind the gate."""

import logging
import socket
import threading
import time
from datetime import timedelta

import pytest

from shared.authstore import NONCE_BYTES, Dialer, Gate, answer, store_secret
from shared.net import free_port

SECRET = store_secret("tok", "run-1")
T = timedelta(seconds=3)


@pytest.fixture
def gated():
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=T)
    gate = Gate("127.0.0.1", free_port(), store.port, SECRET)
    yield store, gate
    gate.close()


def client(port: int, timeout: timedelta = T):
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)


def test_the_secret_is_bound_to_token_and_run():
    assert store_secret("tok", "run-1") == SECRET
    assert store_secret("tok", "run-2") != SECRET
    assert store_secret("other", "run-1") != SECRET


def test_a_peer_with_the_secret_sets_and_gets_keys(gated):
    store, gate = gated
    dialer = Dialer("127.0.0.1", gate.port, SECRET)
    c = client(dialer.port)
    c.set("k", "v")
    assert store.get("k") == b"v"
    store.set("back", "w")
    assert c.get("back") == b"w"
    dialer.close()


def test_a_peer_without_the_secret_is_refused_logged_once_and_the_store_keeps_working(gated, caplog):
    store, gate = gated
    caplog.set_level(logging.WARNING, logger="triad.authstore")
    with pytest.raises(RuntimeError):  # a raw TCPStore client cannot answer the challenge
        client(gate.port, timedelta(seconds=1)).set("evil", "x")
    wrong = Dialer("127.0.0.1", gate.port, store_secret("guess", "run-1"))
    with pytest.raises(RuntimeError):
        client(wrong.port, timedelta(seconds=1)).set("evil", "x")
    with socket.create_connection(("127.0.0.1", gate.port), timeout=3) as raw:
        nonce = raw.recv(NONCE_BYTES)
        raw.sendall(answer(b"wrong", nonce))
        assert raw.recv(1) == b""  # closed, nothing forwarded
    assert not store.check(["evil"])
    refusals = [r.getMessage() for r in caplog.records if "refused peer 127.0.0.1" in r.getMessage()]
    assert len(refusals) == 1 and "challenge" in refusals[0]  # three refusals, one line
    assert gate.refused == {"127.0.0.1"}
    good = Dialer("127.0.0.1", gate.port, SECRET)
    c = client(good.port)
    c.set("k", "v")
    assert store.get("k") == b"v"
    wrong.close()
    good.close()


def test_the_handshake_has_one_deadline_not_one_per_read(gated):
    """A peer that answers one byte at a time, each well within the deadline, is cut off when the
    whole handshake's time is up (a per-read timeout would wait for all 32 bytes)."""
    store, _ = gated
    gate = Gate("127.0.0.1", free_port(), store.port, SECRET, handshake_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", gate.port), timeout=3) as raw:
            nonce = raw.recv(NONCE_BYTES)
            reply = answer(SECRET, nonce)
            sent = 0
            with pytest.raises(OSError):  # reset by the gate, or the EOF below
                for byte in reply:
                    raw.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.1)
                assert raw.recv(1) != b"", "the gate admitted a handshake that took 3.2 s"
            assert sent < 12  # cut off after about 0.5 s
    finally:
        gate.close()


def test_pending_handshakes_are_bounded_and_a_peer_gets_in_once_they_go(gated):
    store, _ = gated
    gate = Gate("127.0.0.1", free_port(), store.port, SECRET, handshake_s=30.0, max_pending=3)
    silent = [socket.create_connection(("127.0.0.1", gate.port), timeout=3) for _ in range(3)]
    try:
        for s in silent:
            assert len(s.recv(NONCE_BYTES)) == NONCE_BYTES  # each one's handshake started
        threads = threading.active_count()
        for _ in range(5):
            with socket.create_connection(("127.0.0.1", gate.port), timeout=3) as extra:
                assert extra.recv(NONCE_BYTES) == b""  # turned away: no nonce, no thread
        assert threading.active_count() == threads and gate.turned_away == 5
    finally:
        for s in silent:
            s.close()
    dialer = Dialer("127.0.0.1", gate.port, SECRET)
    try:
        c = client(dialer.port)  # the silent peers' slots are free again
        c.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        dialer.close()
        gate.close()
