"""The one layer under every file a run directory holds.

Services never open run-directory files themselves: `shared/rundir.py` names
them and goes through a `Storage`, which speaks in keys (posix paths relative
to the run directory). `LocalStore` keeps them in a local (or mounted)
directory; an object store can stand in its place without touching a service.

Writes are atomic: a file is written under a temporary name beside its key and
renamed into place, so a reader sees the old file, the new one, or none.
Writers that need a real path (safetensors, Parquet, torch.distributed.checkpoint,
`save_pretrained`) get one from `writing` or `writing_dir`; readers that need a directory
`fetch` it (and `drop_local` it when done). `shared/objectstore.py` has the object store
(`shared/storecall.py` its requests, `shared/objectcache.py` its local copies).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

from shared.diskspace import RUN_DIR_ADVICE, full_disk_is_one_line
from shared.errors import TriadError
from shared.tmpname import TMP_PREFIX
from shared.watch import DirWatch, open_watch

__all__ = ["TMP_PREFIX", "LocalStore", "Storage", "open_store"]
FILE_MODE = 0o644  # mkstemp's 0600 would hide published files from services running as other users


class Storage(Protocol):
    """What the run directory needs from where its files live. `poll_floor_s`: the first
    interval of a wait on a marker (`shared/waiting.py` `Backoff`), what one look costs here."""

    poll_floor_s: float

    def read_bytes(self, key: str) -> bytes | None: ...

    def write_bytes(self, key: str, data: bytes) -> None: ...

    def create_once(self, key: str, data: bytes) -> bool: ...

    def writing(self, key: str) -> AbstractContextManager[Path]: ...

    def writing_dir(self, key: str) -> AbstractContextManager[Path]: ...

    def local_path(self, key: str) -> Path: ...

    def exists(self, key: str) -> bool: ...

    def children(self, key: str, dirs: bool = True) -> list[str]: ...

    def size(self, key: str) -> int: ...

    def remove(self, key: str) -> None: ...

    def flush(self, key: str) -> None: ...

    def check_writable(self) -> None: ...

    def watch(self, key: str) -> DirWatch | None: ...

    def describe(self, key: str) -> str: ...

    def append(self, key: str, data: bytes) -> None: ...

    def copy(self, source: str, key: str) -> bool: ...

    def fetch(self, key: str, last: str | None = None) -> Path: ...

    def drop_local(self, key: str) -> None: ...

    def sweep(self) -> list[Path]: ...


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_path(path: Path, advice: str = RUN_DIR_ADVICE) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it into place on success. A full disk is
    a one-line `DiskFull` (with `advice`), raised once the temporary file is gone."""
    with full_disk_is_one_line(path.parent, path.name, advice):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX + path.name, dir=path.parent)
        os.fchmod(fd, FILE_MODE)
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            yield tmp_path
            with open(tmp_path, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp_path, path)
        finally:
            tmp_path.unlink(missing_ok=True)


def raise_unless_gone(function, path: str, exc_info) -> None:
    """`shutil.rmtree`'s error handler: what is gone already is fine, anything else raises."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def atomic_write_bytes(path: Path, data: bytes, advice: str = RUN_DIR_ADVICE) -> None:
    with atomic_path(path, advice) as tmp:
        tmp.write_bytes(data)


class LocalStore:
    """A run directory on a local or mounted POSIX filesystem."""

    poll_floor_s = 0.002  # a look at a marker is a stat or a small read: ~0.1 ms

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def local_path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def describe(self, key: str) -> str:
        return str(self.local_path(key))

    def fetch(self, key: str, last: str | None = None) -> Path:
        """The directory itself: it is local already."""
        return self.local_path(key)

    def drop_local(self, key: str) -> None:
        """Nothing to drop: `fetch` made no copy."""

    def copy(self, source: str, key: str) -> bool:
        """`key` becomes a hard link to `source` (files are only ever replaced whole, never
        changed in place, so sharing the inode is safe); a copy where the filesystem has no
        hard links. False if `source` does not exist."""
        src, dst = self.local_path(source), self.local_path(key)
        if not src.is_file():
            return False
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.unlink(missing_ok=True)
        try:
            os.link(src, dst)
        except FileNotFoundError:
            return False  # removed meanwhile (pruned)
        except OSError:  # EPERM, EXDEV, ENOTSUP: a filesystem without hard links here
            with atomic_path(dst) as tmp:
                shutil.copyfile(src, tmp)
        return True

    def sweep(self) -> list[Path]:
        """Nothing to sweep: there is no cache (temporary files beside their keys are not owned
        by one process, and readers skip them)."""
        return []

    def append(self, key: str, data: bytes) -> None:
        """Append in place; a row torn by a writer killed mid-write is ended with a newline
        first, so the appended data starts a line of its own."""
        path = self.local_path(key)
        with full_disk_is_one_line(path.parent, path.name):
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab+") as f:
                size = f.seek(0, os.SEEK_END)
                if size:
                    f.seek(size - 1)
                    torn = f.read(1) != b"\n"
                    f.seek(0, os.SEEK_END)
                    data = b"\n" + data if torn else data
                f.write(data)

    def read_bytes(self, key: str) -> bytes | None:
        """The file's bytes; None if it does not exist."""
        try:
            return self.local_path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def write_bytes(self, key: str, data: bytes) -> None:
        atomic_write_bytes(self.local_path(key), data)

    def create_once(self, key: str, data: bytes) -> bool:
        """Write `key` only if it does not exist yet; whether this call created it."""
        path = self.local_path(key)
        with full_disk_is_one_line(path.parent, path.name):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    os.fchmod(f.fileno(), FILE_MODE)
                    f.write(data)
                os.link(tmp, path)  # fails if another writer created it first
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)

    @contextmanager
    def writing(self, key: str) -> Iterator[Path]:
        """A local path to write `key` to; it appears under `key` (atomically) on success."""
        with atomic_path(self.local_path(key)) as tmp:
            yield tmp

    @contextmanager
    def writing_dir(self, key: str) -> Iterator[Path]:
        """A local directory whose files end up under `key`: here, the directory itself."""
        path = self.local_path(key)
        with full_disk_is_one_line(path, key):
            path.mkdir(parents=True, exist_ok=True)
            yield path

    def exists(self, key: str) -> bool:
        return self.local_path(key).exists()

    def children(self, key: str, dirs: bool = True) -> list[str]:
        """Names of the directories (or with `dirs=False`, the files) directly under `key`."""
        try:
            entries = list(os.scandir(self.local_path(key)))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(e.name for e in entries if e.is_dir() == dirs and not e.name.startswith(TMP_PREFIX))

    def size(self, key: str) -> int:
        path = self.local_path(key)
        if path.is_file():
            return path.stat().st_size
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())

    def remove(self, key: str) -> None:
        """Gone afterwards; a key already missing, or removed by another process meanwhile, is
        no error, but anything that stays (a failed prune) is."""
        path = self.local_path(key)
        if path.is_dir():
            shutil.rmtree(path, onerror=raise_unless_gone)
        else:
            path.unlink(missing_ok=True)

    def flush(self, key: str) -> None:
        """Make everything under `key` durable (fsync files, then directories)."""
        for dirpath, _, filenames in os.walk(self.local_path(key)):
            for name in filenames:
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(Path(dirpath))

    def check_writable(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f"{TMP_PREFIX}probe-{uuid.uuid4().hex}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise TriadError(f"run directory {self.root} is not writable: {e.strerror or e}") from None

    def watch(self, key: str) -> DirWatch | None:
        """Wakes a wait when something is written into `key` or a directory in it."""
        return open_watch(self.local_path(key))


def machine_cache() -> Path:
    """This machine's cache of triad (`$TRIAD_CACHE`, default ~/.cache/triad)."""
    return Path(os.environ.get("TRIAD_CACHE", Path.home() / ".cache" / "triad"))


def open_store(root: str | os.PathLike, cache_dir: Path | None = None, timeout_s: float = 300.0) -> Storage:
    """The store of a run directory: an object store for `s3://bucket/prefix`, else local.
    The object store keeps its local copies under `cache_dir` (default `$TRIAD_CACHE/store`)."""
    from shared.objectstore import ObjectStore, is_object_url

    if not is_object_url(root):
        return LocalStore(Path(root))
    cache = cache_dir or machine_cache() / "store"
    return ObjectStore(str(root), cache, timeout_s)
