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
