"""Moving whole directories between an object store and this machine's cache.

Writers that need a real path write into a private scratch directory that is uploaded on
success; readers that need one `fetch` a copy into the cache. Both move a directory's files
in one `pyarrow.fs.copy_files` call with `use_threads=True`, so its objects travel
concurrently (pyarrow's I/O thread pool). A step's marker is never among them: `write_marker`
writes it after the upload, and `fetch` reads it first and writes it into the copy last.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import TypeVar

import pyarrow.fs as pafs

from shared.diskspace import CACHE_ADVICE, full_disk_is_one_line
from shared.errors import TriadError
from shared.tmpname import TMP_PREFIX, owner_of, owner_tag, this_host

T = TypeVar("T")
# what one read of an object asks for: pyarrow's default (1 MiB) is a ranged GET per MiB, 1,200 for
# a 0.6B model's weights; each costs a round trip, and an S3 server that reads the whole object for
# every range (moto) turns the download quadratic (one 1.2 GB version took 873 s; 128 MiB: 15.7 s
# at 1 MiB, 2.0 s at 16). AWS suggests 8-16 MB per ranged GET; one buffer per file in flight.
COPY_CHUNK = 16 << 20
log = logging.getLogger("triad.store")
LEASE_INFIX = "-lease-"  # a lease's name: TMP_PREFIX, its owner's tag, this, the copy's name


def sweep_dead_tmp(cache: Path) -> list[Path]:
    """Remove the `.tmp-<pid>@<host>-...` directories under `cache` whose process (on this
    machine) is gone: a writer or fetcher killed mid-way leaves them behind, and a reader its
    lease. Those of live processes stay. Returns what was removed."""
    swept = sweep_dead_dirs(cache.rglob(f"{TMP_PREFIX}*") if cache.is_dir() else [], TMP_PREFIX)
    if swept:
        log.info("swept %d directories of dead processes from the cache %s", len(swept), cache)
    return swept


Owner = Callable[[str], tuple[str, int] | None]  # a name's (host, pid), None for nobody's


def sweep_dead_dirs(candidates: Iterable[Path], prefix: str, owner: Owner | None = None) -> list[Path]:
    """Remove the directories among `candidates` named `<prefix><pid>@<host>-...` (`owner_tag`)
    whose process, on this machine, is gone; those of live processes, of other machines, and
    anything else, stay (`owner`: a name's (host, pid), where names say it otherwise).
    Returns what was removed."""
    swept = []
    for path in sorted(candidates):
        whose = owner(path.name) if owner else owner_of(path.name, prefix)
        if whose is not None and path.is_dir() and not owner_alive(*whose):
            shutil.rmtree(path, ignore_errors=True)
            swept.append(path)
    return swept


def owner_alive(host: str, pid: int) -> bool:
    """Another machine's process is taken as alive: its pid cannot be judged here."""
    return host != this_host() or pid_alive(pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def check_inside(url: str, root: str, infos: list[pafs.FileInfo]) -> None:
    """Every listed object must lie under `root`: a key with `..` would leave it."""
    for info in infos:
        relative = PurePosixPath(info.path.removeprefix(root + "/"))
        if relative.is_absolute() or ".." in relative.parts:
            raise TriadError(f"object store {url}: refusing key {info.path!r} (it leaves {root})")


class CacheTransfers:
    """The cache half of `ObjectStore`: what it needs from the store is declared here."""

    url: str
    base: str
    cache: Path
    fs: pafs.FileSystem
    local: pafs.LocalFileSystem
    call: Callable[[str, Callable[[], T]], T]

    def path(self, key: str) -> str:
        return f"{self.base}/{key}" if key else self.base

    def local_path(self, key: str) -> Path:
        """Where this machine keeps its copy of `key` (see `fetch`); for local-only outputs too."""
        return self.cache / key if key else self.cache

    def read_bytes(self, key: str) -> bytes | None:
        raise NotImplementedError

    def _infos(self, key: str, recursive: bool) -> list[pafs.FileInfo]:
        raise NotImplementedError

    @contextmanager
    def writing(self, key: str) -> Iterator[Path]:
        with self._scratch() as scratch:
            tmp = scratch / PurePosixPath(key).name
            yield tmp
            self._copy(f"uploading {key}", str(tmp), self.path(key), self.local, self.fs)

    @contextmanager
    def writing_dir(self, key: str) -> Iterator[Path]:
        """A private local directory; every file in it is uploaded under `key` on success,
        concurrently."""
        with self._scratch() as scratch:
            yield scratch
            if any(p.is_file() for p in scratch.rglob("*")):
                self._copy(f"uploading {key}/", str(scratch), self.path(key), self.local, self.fs)

    @contextmanager
    def _scratch(self) -> Iterator[Path]:
        """A private directory in this machine's cache, gone afterwards; a full disk while
        writing into it is one line naming the cache."""
        with full_disk_is_one_line(self.cache, "a file to upload", CACHE_ADVICE):
            self.cache.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{owner_tag()}-write-", dir=self.cache))
            try:
                yield scratch
            finally:
                shutil.rmtree(scratch, ignore_errors=True)

    def _copy(self, what: str, source: str, dest: str, source_fs, dest_fs) -> None:
        self.call(
            what,
            lambda: pafs.copy_files(
                source,
                dest,
                source_filesystem=source_fs,
                destination_filesystem=dest_fs,
                use_threads=True,
                chunk_size=COPY_CHUNK,
            ),
        )

    def fetch(self, key: str, last: str | None = None) -> Path:
        """A local copy of everything under `key` (a directory), in the cache, its objects
        downloaded concurrently. `last` (a marker) is read first and written last, so a copy
        that has it is whole and matches it. The copy is leased to this process until its
        `drop_local`: other processes of the cache read the same copy (see `drop_local`)."""
        target = self.local_path(key)
        marker = self.read_bytes(f"{key}/{last}") if last else None
        with self._cache_lock():
            if marker is not None and (target / last).is_file() and (target / last).read_bytes() == marker:
                self._lease(target).mkdir(exist_ok=True)
                return target  # whole already (its marker came last): another process fetched it
        infos = self._infos(key, recursive=True)
        check_inside(self.url, self.path(key), infos)
        with full_disk_is_one_line(target.parent, f"a copy of {key}", CACHE_ADVICE):
            self._fetch_into(key, target, last, marker, infos)
        return target

    def _fetch_into(
        self, key: str, target: Path, last: str | None, marker: bytes | None, infos: list[pafs.FileInfo]
    ) -> None:
        """Download `key` into a staging directory beside `target`, then rename it into place;
        the staging directory is gone afterwards, whatever happened."""
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f"{TMP_PREFIX}{owner_tag()}-fetch-{uuid.uuid4().hex}"
        try:
            staging.mkdir()
            if any(i.type == pafs.FileType.File for i in infos):
                self._copy(f"downloading {key}/", self.path(key), str(staging), self.fs, self.local)
            for stray in [staging / last] if last else []:
                stray.unlink(missing_ok=True)  # maybe newer than the marker read first
            for tmp in list(staging.rglob(f"{TMP_PREFIX}*")):
                shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()
            if marker is not None:
                (staging / last).write_bytes(marker)
            with self._cache_lock():
                shutil.rmtree(target, ignore_errors=True)
                try:
                    os.replace(staging, target)
                except OSError:  # another process on this machine fetched the same copy first
                    if not target.is_dir():
                        raise
                self._lease(target).mkdir(exist_ok=True)
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def drop_local(self, key: str) -> None:
        """Forget this process's copy of `key` (keeps the cache bounded): the copy itself goes
        once no live process holds a lease on it, so one server never deletes a version that
        another server of the same cache is loading."""
        target = self.local_path(key)
        with self._cache_lock():
            shutil.rmtree(self._lease(target), ignore_errors=True)
            if not self._leased(target):
                shutil.rmtree(target, ignore_errors=True)

    @staticmethod
    def _lease(target: Path) -> Path:
        """This process's lease on the copy `target`: an empty directory beside it, which
        `sweep_dead_tmp` removes once its process is gone."""
        return target.parent / f"{TMP_PREFIX}{owner_tag()}{LEASE_INFIX}{target.name}"

    @staticmethod
    def _leased(target: Path) -> bool:
        """Whether a live process (of any machine sharing the cache) holds a lease on `target`."""
        suffix = f"{LEASE_INFIX}{target.name}"
        siblings = target.parent.iterdir() if target.parent.is_dir() else []
        owners = [owner_of(p.name, TMP_PREFIX) for p in siblings if p.name.endswith(suffix)]
        return any(owner is not None and owner_alive(*owner) for owner in owners)

    @contextmanager
    def _cache_lock(self) -> Iterator[None]:
        """Leases and the copies they guard change under one lock of the cache (`flock`, which
        Linux's NFS client takes as a lock of the server)."""
        self.cache.mkdir(parents=True, exist_ok=True)
        with open(self.cache / f"{TMP_PREFIX}lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def sweep(self) -> list[Path]:
        """At start: remove the cache's scratch and staging directories of dead processes, and
        the copies their leases alone held (a killed server's served version: no `drop_local`
        came for it)."""
        with self._cache_lock():
            swept = sweep_dead_tmp(self.cache)
            for lease in [p for p in swept if LEASE_INFIX in p.name]:
                target = lease.parent / lease.name.split(LEASE_INFIX, 1)[1]
                if target.is_dir() and not self._leased(target):
                    shutil.rmtree(target, ignore_errors=True)
                    swept.append(target)
        return swept
