"""Ports: a test's or a launcher's pick stays clear of the ports the kernel hands out, and a port
that a server cannot listen on is one line before anything starts."""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from shared.errors import TriadError
from shared.net import LOWEST_PICK, check_can_listen, ephemeral_range, free_port, port_is_free


@contextmanager
def listener(host: str = "127.0.0.1", port: int = 0) -> Iterator[int]:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen()
        yield s.getsockname()[1]


def test_a_pick_is_free_and_below_the_kernels_ephemeral_range():
    ephemeral = ephemeral_range()
    if ephemeral is None:
        pytest.skip("this kernel does not say its ephemeral range")
    picks = {free_port() for _ in range(20)}
    assert all(LOWEST_PICK <= p < ephemeral[0] for p in picks), picks
    assert len(picks) > 1, "every pick was the same port"
    for port in picks:
        with listener(port=port):  # each can really be listened on
            assert not port_is_free(port)


def test_a_pick_skips_a_port_that_is_held():
    draws = random.Random(0)
    first, second = (draws.randrange(LOWEST_PICK, 30_000) for _ in range(2))
    with listener(port=first):
        assert free_port(random.Random(0), (30_000, 60_999)) == second


def test_where_the_range_starts_too_low_the_os_picks_from_it():
    port = free_port(random.Random(0), (LOWEST_PICK + 10, 60_999))
    ephemeral = ephemeral_range()
    assert ephemeral is None or ephemeral[0] <= port <= ephemeral[1]
    assert port_is_free(port)


def test_the_range_is_read_as_linux_writes_it(tmp_path):
    (tmp_path / "range").write_text("32768\t60999\n")
    assert ephemeral_range(tmp_path / "range") == (32768, 60999)
    (tmp_path / "range").write_text("garbled")
    assert ephemeral_range(tmp_path / "range") is None
    assert ephemeral_range(tmp_path / "absent") is None


@pytest.mark.parametrize(
    "held_on, asked", [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "127.0.0.1"), ("127.0.0.1", "0.0.0.0")]
)
def test_a_held_port_is_one_line_naming_it_and_the_option(held_on, asked):
    with listener(held_on) as port, pytest.raises(TriadError) as e:
        check_can_listen(asked, port, "inference.port")
    assert str(e.value) == (
        f"cannot listen on {asked}:{port} (Address already in use): stop the process that holds the "
        "port, or set inference.port to a free one"
    )
    check_can_listen(asked, port, "inference.port")  # free again once the holder is gone


def test_an_address_of_no_interface_here_is_one_line():
    with pytest.raises(
        TriadError, match=r"^cannot listen on 192\.0\.2\.1:\d+ \(Cannot assign requested address\)"
    ):
        check_can_listen("192.0.2.1", free_port(), "inference.port")


def test_a_port_whose_connections_are_closing_can_be_listened_on():
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server's side closes first: its end waits in TIME_WAIT
    client.close()
    assert not port_is_free(port), "no connection of the port's was left closing"
    check_can_listen("127.0.0.1", port, "inference.port")
