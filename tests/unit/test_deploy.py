"""Deployment files are valid and start the same entry points as the README's commands."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from services.cli import COMMANDS

REPO = Path(__file__).resolve().parents[2]


def compose_command() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    return None


def test_compose_services_run_triad_entry_points():
    spec = yaml.safe_load((REPO / "compose.yaml").read_text())
    services = spec["services"]
    assert set(services) == {"inference", "orchestrator", "trainer"}
    for name, service in services.items():
        command = service["command"]
        assert command[0] == name and name in COMMANDS
        assert service["volumes"] == ["runs:/runs"], name  # one shared volume
    assert services["trainer"]["entrypoint"][:3] == ["python", "-m", "torch.distributed.run"]
    assert services["trainer"]["entrypoint"][-2:] == ["-m", "services.cli"]


def test_compose_file_validates_with_docker_compose():
    cmd = compose_command()
    if cmd is None:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed")
    r = subprocess.run(
        [*cmd, "-f", str(REPO / "compose.yaml"), "config", "-q"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("dockerfile", sorted((REPO / "deploy").glob("Dockerfile*")), ids=lambda p: p.name)
def test_dockerfiles_copy_every_package(dockerfile):
    text = dockerfile.read_text()
    for package in ("shared", "inference", "orchestrator", "trainer", "services"):
        assert f"COPY {package} ./{package}" in text
    assert 'ENTRYPOINT ["triad"]' in text
