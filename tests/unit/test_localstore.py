"""`LocalStore`: removal says when something stays."""

from __future__ import annotations

import errno
import os

import pytest

from shared.storage import LocalStore


def test_a_directory_that_cannot_be_removed_is_an_error_not_silence(tmp_path, monkeypatch):
    store = LocalStore(tmp_path)
    store.write_bytes("w/step/a.bin", b"a")
    real_rmdir = os.rmdir

    def busy(path, *args, **kw):
        if os.fspath(path) in ("step", str(tmp_path / "w" / "step")):
            raise OSError(errno.EBUSY, "Device or resource busy", os.fspath(path))
        return real_rmdir(path, *args, **kw)

    monkeypatch.setattr(os, "rmdir", busy)
    with pytest.raises(OSError, match="busy"):
        store.remove("w/step")
    assert store.exists("w/step")


def test_a_key_already_gone_is_no_error(tmp_path):
    store = LocalStore(tmp_path)
    store.remove("never/was")
    store.write_bytes("w/x", b"1")
    store.remove("w")
    assert not store.exists("w")
