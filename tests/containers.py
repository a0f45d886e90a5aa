"""Podman, its Docker-compatible API socket and docker-compose, for tests that run triad's images.

The same commands as deploy/README.md: `deploy/podman/base-image.sh`, `podman build` of
`deploy/Dockerfile.cpu`, `podman system service`, and `docker-compose` with DOCKER_HOST at
that socket. Reused by every compose project (one volume, or an object store).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from shared.errors import WaitTimeout
from shared.waiting import wait_for
from tests.helpers import REPO

BASE_IMAGE = "localhost/triad-base:bookworm"
CPU_IMAGE = "localhost/triad:cpu"
MOTO_DOCKERFILE = REPO / "deploy" / "podman" / "moto.Dockerfile"
PIP_CERT_IN_BUILD = "/run/triad-pip-cert.pem"


def missing_tools() -> str | None:
    """Why the container tests cannot run here, or None."""
    for tool in ("podman", "docker-compose", "debootstrap"):
        if not shutil.which(tool):
            return f"{tool} is not installed (.ci/run installs it with apt-get as root)"
    if os.geteuid() != 0:
        return "the container tests run podman as root (rootless podman needs subuid ranges)"
    return None


def write_containers_conf(path: Path) -> Path:
    """A containers.conf whose default ulimits stay within this process's hard limits: podman's
    defaults (1048576 open files) exceed them on some hosts and runc then cannot start."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 65536 if nofile == resource.RLIM_INFINITY else min(nofile, 65536)
    nproc = 4096 if nproc == resource.RLIM_INFINITY else min(nproc, 4096)
    path.write_text(
        f'[containers]\ndefault_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
    )
    return path


def pip_settings() -> dict[str, str]:
    """This machine's pip find-links, extra-index-url and cert (environment over config files)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
    ).stdout
    found = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        found[key.rsplit(".", 1)[-1]] = value.strip("'\"")
    for key in ("find-links", "extra-index-url", "cert"):
        env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            found[key] = env
    return {k: found[k] for k in ("find-links", "extra-index-url", "cert") if found.get(k)}


def build_args_for_local_pip(settings: dict[str, str]) -> list[str]:
    """`podman build` flags that hand this machine's pip sources to the image build: local
    directories are mounted at the same path, the cert at PIP_CERT_IN_BUILD."""
    flags, mounts = [], set()
    for key in ("find-links", "extra-index-url"):
        if key in settings:
            flags.append(f"--build-arg=PIP_{key.upper().replace('-', '_')}={settings[key]}")
            for item in settings[key].split():
                local = item.removeprefix("file://")
                if local.startswith("/"):
                    mounts.add(str(Path(local).parent if local.endswith("/simple") else Path(local)))
    if "cert" in settings:
        flags += [
            f"--build-arg=PIP_CERT={PIP_CERT_IN_BUILD}",
            f"--volume={settings['cert']}:{PIP_CERT_IN_BUILD}:ro",
        ]
    return flags + [f"--volume={m}:{m}:ro" for m in sorted(mounts)]


def moto_version() -> str:
    """The `moto[server]` pin of pyproject.toml's dev extra (the tests' S3 server)."""
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    return next(r.split("==")[1] for r in dev if r.startswith("moto[server]=="))


def moto_image() -> str:
    return f"localhost/triad-moto:{moto_version()}"


def _run_logged(commands: list[list[str]], env: dict[str, str], log: Path) -> None:
    with log.open("ab") as out:
        for cmd in commands:
            code = subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=3600)
            if code.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
                raise RuntimeError(f"{cmd[0]} {cmd[1]} failed ({code.returncode}), end of {log}:\n{tail}")


def build_cpu_image(env: dict[str, str], log: Path) -> float:
    """Make the base image if missing, build CPU_IMAGE (cached layers are reused); seconds taken."""
    start = time.monotonic()
    build = [
        "podman",
        "build",
        "--file=deploy/Dockerfile.cpu",
        f"--tag={CPU_IMAGE}",
        f"--build-arg=BASE={BASE_IMAGE}",
        *build_args_for_local_pip(pip_settings()),
        ".",
    ]
    _run_logged([[str(REPO / "deploy" / "podman" / "base-image.sh"), BASE_IMAGE], build], env, log)
    return time.monotonic() - start


def build_moto_image(env: dict[str, str], log: Path) -> float:
    """moto_image() from MOTO_DOCKERFILE on top of CPU_IMAGE (which must exist); seconds taken."""
    start = time.monotonic()
    build = [
        "podman",
        "build",
        f"--file={MOTO_DOCKERFILE}",
        f"--tag={moto_image()}",
        f"--build-arg=BASE={CPU_IMAGE}",
        f"--build-arg=MOTO_VERSION={moto_version()}",
        *build_args_for_local_pip(pip_settings()),
        str(MOTO_DOCKERFILE.parent),
    ]
    _run_logged([build], env, log)
    return time.monotonic() - start


class PodmanService:
    """`podman system service` on a private socket: the Docker API that docker-compose talks to."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.socket = root / "podman.sock"
        self.docker_host = f"unix://{self.socket}"
        self.log = (root / "podman-service.log").open("ab")
        self.proc = subprocess.Popen(
            ["podman", "system", "service", "--time=0", self.docker_host],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            wait_for(self._answers, f"podman's API socket {self.socket}", timeout=30, poll=0.2)
        except WaitTimeout:
            self.stop()
            raise

    def _answers(self) -> bool | None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"podman system service exited ({self.proc.returncode}), log: {self.log.name}")
        if not self.socket.exists():
            return None
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), timeout=5) as client:
                return client.get("http://podman/_ping").status_code == 200 or None
        except httpx.HTTPError:
            return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class HealthChecks:
    """deploy/podman/healthchecks.sh for one project: podman runs health checks from systemd
    timers, and without systemd as init compose would wait on them forever."""

    def __init__(self, project: str, env: dict[str, str], log: Path, interval: float = 2) -> None:
        script = REPO / "deploy" / "podman" / "healthchecks.sh"
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            [str(script), project, str(interval)],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=15)
        self.log.close()


TAIL_LINES = 40


class Compose:
    """docker-compose for one project name against a podman socket."""

    def __init__(self, project: str, files: list[Path], env: dict[str, str], log: Path) -> None:
        self.project, self.files, self.env, self.log = project, files, env, log

    def run(self, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ["docker-compose", "-p", self.project, *[f"--file={f}" for f in self.files], *args]
        with self.log.open("a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
        r = subprocess.run(cmd, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=timeout)
        with self.log.open("a") as out:
            out.write(r.stdout + r.stderr)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
        return r

    def podman(self, *args: str, timeout: float = 60) -> str:
        r = subprocess.run(["podman", *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
        return r.stdout

    def container(self, service: str) -> dict:
        """podman's inspection of the service's (one) container."""
        label = f"label=com.docker.compose.project={self.project}"
        ids = self.podman(
            "ps", "-a", "-q", "--filter", label, "--filter", f"label=com.docker.compose.service={service}"
        ).split()
        assert len(ids) == 1, f"{service}: containers {ids}"
        return json.loads(self.podman("inspect", ids[0]))[0]

    def logs(self, service: str) -> str:
        return self.run("logs", "--no-color", service, check=False).stdout

    def volume_path(self, name: str) -> Path:
        return Path(
            self.podman("volume", "inspect", f"{self.project}_{name}", "--format", "{{.Mountpoint}}").strip()
        )

    def exit_code(self, service: str, timeout: float) -> int:
        """Wait for the service's container to exit; its exit code."""

        def exited() -> int | None:
            state = self.container(service)["State"]
            return None if state["Running"] else state["ExitCode"]

        try:
            return wait_for(exited, f"the {service} container to exit", timeout, poll=1, log_every=60)
        except WaitTimeout as e:  # every service's last lines: the one waited on may wait on another
            self.run("logs", "--no-color", "--timestamps", check=False)  # whole, into the project's log file
            tails = self.run("logs", "--no-color", f"--tail={TAIL_LINES}", check=False).stdout
            raise AssertionError(f"{e}; the services' last {TAIL_LINES} lines each:\n{tails}") from None

    def leftovers(self) -> dict[str, list[str]]:
        """Containers, networks and volumes podman still holds for this project."""
        label = f"label=com.docker.compose.project={self.project}"
        return {
            "containers": self.podman("ps", "-a", "--filter", label, "--format", "{{.Names}}").split(),
            "networks": [
                n
                for n in self.podman("network", "ls", "--format", "{{.Name}}").split()
                if n.startswith(f"{self.project}_")
            ],
            "volumes": [
                v
                for v in self.podman("volume", "ls", "--format", "{{.Name}}").split()
                if v.startswith(f"{self.project}_")
            ],
        }


@contextmanager
def compose_project(project: str, files: list[Path], env: dict[str, str], root: Path) -> Iterator[Compose]:
    """A compose project with its health checks run (HealthChecks); brought down with its
    volumes on the way out, whatever happened."""
    compose = Compose(project, files, env, root / f"{project}.log")
    health = HealthChecks(project, env, root / f"{project}-healthchecks.log")
    try:
        yield compose
    finally:
        compose.run("down", "--volumes", "--timeout=5", check=False)
        health.stop()
