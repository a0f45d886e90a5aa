"""Each server's vLLM sockets in a directory of its own (`inference/socket_dir.py`): made and named
for vLLM, and those of servers that are gone swept by the next start, on real processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from inference.socket_dir import PREFIX, VAR, own_socket_dir


@pytest.fixture
def tmp_base(monkeypatch):
    """A temporary directory as short as /tmp's children (pytest's own are too long for sockets)."""
    base = Path(tempfile.mkdtemp(prefix="sd-"))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    shutil.rmtree(base)


def dead_pid() -> int:
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    return int(ended.stdout)


def test_a_server_gets_a_directory_of_its_own_named_for_vllm(tmp_base):
    env: dict[str, str] = {}
    path = own_socket_dir(env)
    assert path is not None and path.is_dir() and path.parent == tmp_base
    assert path.name.startswith(f"{PREFIX}{os.getpid()}-")
    assert env == {VAR: str(path)}
    assert len(f"/tmp/{path.name}/{'0' * 36}") < 108  # a socket's path in /tmp, with vLLM's uuid4 name
    again = own_socket_dir({})
    assert again != path and path.is_dir()  # a second server of this process: both kept


def test_the_directories_of_dead_servers_are_swept_and_nothing_else(tmp_base):
    dead = tmp_base / f"{PREFIX}{dead_pid()}-abc"
    (dead / "sub").mkdir(parents=True)
    (dead / "0f1e2d3c-socket").touch()
    alive = tmp_base / f"{PREFIX}{os.getppid()}-def"
    alive.mkdir()
    not_ours = [tmp_base / f"{PREFIX}notapid-x", tmp_base / "pytest-of-root"]
    for path in not_ours:
        path.mkdir()
    a_file = tmp_base / f"{PREFIX}{dead_pid()}"  # a dead pid's name, but a file, not a directory
    a_file.touch()
    path = own_socket_dir({})
    assert not dead.exists()
    assert alive.is_dir() and path.is_dir()
    assert all(p.is_dir() for p in not_ours) and a_file.is_file()


def test_a_users_own_directory_is_kept(tmp_base):
    dead = tmp_base / f"{PREFIX}{dead_pid()}-abc"
    dead.mkdir()
    env = {VAR: "/srv/sockets"}
    assert own_socket_dir(env) is None
    assert env == {VAR: "/srv/sockets"}
    assert dead.is_dir() and list(tmp_base.iterdir()) == [dead]  # nothing made, nothing swept


def test_a_temporary_directory_too_long_for_a_directory_of_sockets_is_used_as_it_is(tmp_base, caplog):
    base = tmp_base / ("t" * (107 - 36 - len(str(tmp_base)) - 2))  # vLLM's sockets alone fit in it
    base.mkdir()
    tempfile.tempdir = str(base)  # restored by tmp_base's monkeypatch
    assert len(f"{base}/{'0' * 36}") <= 107
    env: dict[str, str] = {}
    assert own_socket_dir(env) is None
    assert env == {} and list(base.iterdir()) == []
    assert "too long a path for vLLM's sockets" in caplog.text and "TMPDIR" in caplog.text
