"""A real S3-compatible server for tests: moto's standalone server, as its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pyarrow.fs as pafs

from shared.net import free_port
from shared.waiting import wait_for

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "triad-test",
    "AWS_SECRET_ACCESS_KEY": "triad-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class MotoServer:
    """`python -m moto.server` on `host:port`, logging to `log_path`."""

    def __init__(self, log_path: Path, host: str = "127.0.0.1", port: int = 0, auth: bool = False) -> None:
        self.host, self.port = host, port or free_port()
        env = {**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {})}
        self.log = open(log_path, "wb")  # noqa: SIM115 (closed in close())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", host, "-p", str(self.port)],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        wait_for(self._up, f"moto server at {self.url}", timeout=60, poll=0.2)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.url, **CREDENTIALS}

    def _up(self) -> bool | None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"moto server exited with {self.proc.returncode}")
        try:
            return httpx.get(f"{self.url}/moto-api/", timeout=1).status_code < 500 or None
        except httpx.HTTPError:
            return None

    def create_bucket(self, name: str) -> None:
        fs = pafs.S3FileSystem(
            endpoint_override=self.url,
            allow_bucket_creation=True,
            region="us-east-1",
            access_key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            secret_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )
        fs.create_dir(name)

    @contextmanager
    def stopped(self) -> Iterator[None]:
        """The server stops answering (SIGSTOP) until the block ends (SIGCONT)."""
        self.proc.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
