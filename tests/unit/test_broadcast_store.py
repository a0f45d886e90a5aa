"""The broadcast group's TCPStore listens on `weights.broadcast.host` only (its own server
would listen on every interface)."""

import socket
from datetime import timedelta

import pytest

from shared.errors import TriadError
from shared.net import free_port
from trainer.broadcast import bound_store


def connects(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
        return True
    except OSError:
        return False


def test_the_store_answers_on_its_host_and_nowhere_else():
    from torch.distributed import TCPStore

    port = free_port()
    store = bound_store("127.0.0.1", port, timedelta(seconds=5))
    assert connects("127.0.0.1", port)
    assert not connects("127.0.0.2", port)  # another loopback address: an unbound server would answer
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))
    client.set("k", "v")
    assert store.get("k") == b"v"
    wide = TCPStore("127.0.0.1", free_port(), is_master=True, wait_for_workers=False)
    assert connects("127.0.0.2", wide.port)  # what torch does on its own: the reason for bound_store


def test_an_address_that_is_not_ours_is_named():
    with pytest.raises(TriadError, match=r"cannot listen on weights.broadcast.host:port = 192.0.2.1:\d+"):
        bound_store("192.0.2.1", free_port(), timedelta(seconds=5))


def test_with_an_admin_token_the_configured_port_admits_only_peers_holding_it():
    from torch.distributed import TCPStore

    from shared.authstore import Dialer, store_secret
    from shared.config import BroadcastConfig
    from trainer.broadcast import hosted_store

    bc = BroadcastConfig(host="127.0.0.1", port=free_port())
    store, gate = hosted_store(bc, "tok", "run-1", timedelta(seconds=5))
    with pytest.raises(RuntimeError):
        TCPStore("127.0.0.1", bc.port, is_master=False, timeout=timedelta(seconds=1))
    dialer = Dialer("127.0.0.1", bc.port, store_secret("tok", "run-1"))
    TCPStore("127.0.0.1", dialer.port, is_master=False, timeout=timedelta(seconds=5)).set("k", "v")
    assert store.get("k") == b"v"
    assert not connects("127.0.0.2", bc.port) and not connects("127.0.0.2", store.port)
    dialer.close()
    gate.close()


def test_without_a_token_the_store_is_unauthenticated_and_says_so(caplog):
    from torch.distributed import TCPStore

    from shared.config import BroadcastConfig
    from trainer.broadcast import hosted_store

    bc = BroadcastConfig(host="127.0.0.1", port=free_port())
    store, gate = hosted_store(bc, None, "run-1", timedelta(seconds=5))
    assert gate is None and "unauthenticated" in caplog.text
    TCPStore("127.0.0.1", bc.port, is_master=False, timeout=timedelta(seconds=5)).set("k", "v")
    assert store.get("k") == b"v"
