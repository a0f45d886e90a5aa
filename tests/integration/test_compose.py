"""`docker compose up`, really up: the CPU image built with podman, the three services in three
containers, driven by docker-compose through podman's Docker API socket.

compose.yaml (one shared volume), one run of the embedded default shortened to STEPS: the
trainer's container is killed after its first checkpoint, the orchestrator waits for weights
and says so, `up` again resumes the trainer from that checkpoint, the run finishes and is
audited from the volume, and `down -v` leaves nothing of the project behind.

deploy/compose/compose.s3.yaml (no shared volume, moto's S3 server as a fourth service, its
image built here on top of the CPU image): S3_STEPS steps, audited from the bucket alone
through moto's port published on loopback, and `down -v` leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from shared.batch import load_batch
from shared.rundir import RunDir
from shared.storage import open_store
from shared.waiting import wait_for
from tests.containers import (
    Compose,
    PodmanService,
    build_cpu_image,
    build_moto_image,
    compose_project,
    missing_tools,
    moto_image,
    write_containers_conf,
)
from tests.helpers import REPO, free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 30
CHECKPOINT_EVERY = 10
KILL_AFTER = 12  # trainer updates seen on the volume before its container is killed
ASYNC = 1  # the embedded default's max_async_level
SETTINGS = {
    "TRIAD_MAX_STEPS": STEPS,
    "TRIAD_TRAINER__CHECKPOINT__EVERY": CHECKPOINT_EVERY,
    "TRIAD_ORCHESTRATOR__WEIGHTS_STALL_S": 180,
    "TRIAD_ORCHESTRATOR__KEEP_ROLLOUTS": STEPS,
    "TRIAD_WEIGHTS__KEEP": STEPS,
}

S3_STEPS = 10
S3_SETTINGS = {
    "TRIAD_MAX_STEPS": S3_STEPS,
    "TRIAD_ORCHESTRATOR__KEEP_ROLLOUTS": S3_STEPS,
    "TRIAD_WEIGHTS__KEEP": S3_STEPS,
}
S3_COMPOSE = REPO / "deploy" / "compose" / "compose.s3.yaml"
SERVICES = ("inference", "orchestrator", "trainer")


def override_file(root: Path, settings: dict, extra: dict | None = None) -> Path:
    """A compose override: a shorter run that keeps every batch and weight version for the
    audit, and the admin token from a file outside the checkout."""
    root.mkdir(exist_ok=True)
    token = root / "admin_token"
    token.write_text(secrets.token_hex(16))
    env = {k: str(v) for k, v in settings.items()}
    override = {
        "version": "3.9",
        "services": {name: {"environment": env} for name in SERVICES} | (extra or {}),
        "secrets": {"admin_token": {"file": str(token)}},
    }
    path = root / "compose.test.yaml"
    path.write_text(json.dumps(override, indent=1))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory) -> dict[str, str]:
    reason = missing_tools()
    if reason:
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("podman")
    return {**os.environ, "CONTAINERS_CONF": str(write_containers_conf(root / "containers.conf"))}


@pytest.fixture(scope="module")
def engine(tmp_path_factory, podman_env) -> Iterator[tuple[dict[str, str], Path]]:
    """The CPU image built and podman's API socket up: docker-compose's environment, a directory."""
    root = tmp_path_factory.mktemp("compose")
    seconds = build_cpu_image(podman_env, root / "build.log")
    print(f"image build (base image and layers cached when present): {seconds:.0f} s")
    service = PodmanService(root, podman_env)
    try:
        yield {**podman_env, "DOCKER_HOST": service.docker_host}, root
    finally:
        service.stop()


@pytest.fixture(scope="module")
def compose(engine) -> Iterator[Compose]:
    env, root = engine
    files = [REPO / "compose.yaml", override_file(root / "cpu", SETTINGS)]
    with compose_project(f"triadit{os.getpid()}", files, {**env, "COMPOSE_PROFILES": "cpu"}, root) as project:
        yield project


@pytest.fixture(scope="module")
def s3_compose(engine) -> Iterator[tuple[Compose, int]]:
    """compose.s3.yaml with moto's image built here and its port published on loopback."""
    env, root = engine
    print(f"moto image build: {build_moto_image(env, root / 'build-moto.log'):.0f} s")
    port = free_port()
    published = {"s3": {"ports": [f"127.0.0.1:{port}:9000"]}}
    files = [S3_COMPOSE, override_file(root / "s3", S3_SETTINGS, published)]
    env = {**env, "TRIAD_S3_IMAGE": moto_image()}
    with compose_project(f"triadits3{os.getpid()}", files, env, root) as project:
        yield project, port


def trained_steps(rundir: RunDir) -> list[int]:
    return [r["step"] for r in rundir.metrics.rows("trainer")]


def check_run(rundir: RunDir, steps: int) -> None:
    """Every update 1..steps once, every batch within max_async_level, every version published
    and inference serving the last; through the run directory's store (a volume or a bucket)."""
    run_id = rundir.read_run().run_id
    assert trained_steps(rundir) == list(range(1, steps + 1))
    assert rundir.rollouts.done_steps(run_id) == list(range(1, steps + 1))
    for step in range(1, steps + 1):
        versions = load_batch(rundir, step).column("policy_version").to_pylist()
        assert all(0 <= step - 1 - v <= ASYNC for v in versions), (step, versions)
    assert rundir.weights.done_steps(run_id) == list(range(1, steps + 1))
    served = [r["version"] for r in rundir.metrics.rows("inference")]
    assert served[-1] == steps, served


def kill_trainer_after_checkpoint(compose: Compose, rundir: RunDir) -> None:
    def progressed() -> bool | None:
        return len(trained_steps(rundir)) >= KILL_AFTER or None if rundir.root.exists() else None

    wait_for(progressed, f"{KILL_AFTER} trainer updates in {rundir}", timeout=420, poll=0.2, log_every=60)
    compose.run("kill", "trainer")
    assert compose.exit_code("trainer", timeout=30) == 137  # SIGKILL
    assert len(trained_steps(rundir)) < STEPS, "the run finished before the trainer could be killed"


def test_compose_up_trains_survives_a_killed_trainer_and_comes_down_clean(compose: Compose) -> None:
    start = time.monotonic()
    compose.run("up", "--detach", "--no-build", timeout=600)  # returns once inference is healthy
    rundir = RunDir(compose.volume_path("runs") / "default")
    kill_trainer_after_checkpoint(compose, rundir)
    killed_at = trained_steps(rundir)[-1]
    wait_for(
        lambda: re.search(r"still waiting for \S+ from the trainer \(", compose.logs("orchestrator")) or None,
        "the orchestrator to say it waits for the trainer",
        timeout=120,
        poll=2,
    )
    assert compose.container("orchestrator")["State"]["Running"]
    assert compose.container("inference")["State"]["Running"]

    compose.run("up", "--detach", "--no-build", timeout=600)  # starts the killed trainer again
    # the orchestrator first: a trainer outlives a failed orchestrator by its batch timeout
    assert compose.exit_code("orchestrator", timeout=600) == 0, compose.logs("orchestrator")[-4000:]
    assert compose.exit_code("trainer", timeout=120) == 0, compose.logs("trainer")[-4000:]
    resumed = re.search(r"resumed from the checkpoint after update (\d+)", compose.logs("trainer"))
    assert resumed, compose.logs("trainer")[-4000:]
    checkpoint = int(resumed.group(1))
    assert checkpoint % CHECKPOINT_EVERY == 0 and CHECKPOINT_EVERY <= checkpoint <= killed_at, killed_at
    assert re.search(
        r"went back from version \d+ to \d+|version \d+ was published again", compose.logs("orchestrator")
    )
    check_run(rundir, STEPS)
    print(f"compose run of {STEPS} steps with a killed trainer: {time.monotonic() - start:.0f} s")

    compose.run("down", "--volumes", "--timeout=5")
    assert compose.leftovers() == {"containers": [], "networks": [], "volumes": []}


def test_compose_s3_trains_with_no_shared_volume_audited_from_the_bucket_alone(
    s3_compose: tuple[Compose, int], tmp_path, monkeypatch
) -> None:
    compose, port = s3_compose
    start = time.monotonic()
    compose.run("up", "--detach", "--no-build", timeout=600)  # returns once inference is healthy
    assert compose.container("bucket")["State"]["ExitCode"] == 0, compose.logs("bucket")
    for name in SERVICES:  # each keeps only its container's own files: no volume, no bind but the token
        mounts = compose.container(name)["Mounts"]
        assert all(m["Type"] == "bind" and m["Destination"] == "/run/secrets/admin_token" for m in mounts), (
            name,
            mounts,
        )
    assert compose.leftovers()["volumes"] == []
    for name in ("trainer", "orchestrator"):
        assert compose.exit_code(name, timeout=600) == 0, compose.logs(name)[-4000:]
    print(f"compose.s3.yaml run of {S3_STEPS} steps: {time.monotonic() - start:.0f} s")

    store = yaml.safe_load(S3_COMPOSE.read_text())["x-store"]  # the services' bucket, keys and run_dir
    host = {**store, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "TRIAD_CACHE": str(tmp_path / "cache")}
    for key, value in host.items():
        monkeypatch.setenv(key, value)
    url = store["TRIAD_RUN_DIR"]
    check_run(RunDir(url, open_store(url, tmp_path / "audit-cache", timeout_s=60)), S3_STEPS)
    status = subprocess.run(
        [sys.executable, "-m", "services.cli", "status", url], capture_output=True, text=True, timeout=120
    )
    assert re.search(rf"trainer\s+step\s+{S3_STEPS}\b", status.stdout), status.stdout + status.stderr
    assert compose.container("inference")["State"]["Running"]

    compose.run("down", "--volumes", "--timeout=5")
    assert compose.leftovers() == {"containers": [], "networks": [], "volumes": []}
