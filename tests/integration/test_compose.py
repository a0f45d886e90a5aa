"""`docker compose up`, really up: the CPU image built with podman, the three services in three
containers sharing one volume, driven by docker-compose through podman's Docker API socket.

One run of the embedded default (shortened to STEPS): the trainer's container is killed after
its first checkpoint, the orchestrator waits for weights and says so, `up` again resumes the
trainer from that checkpoint, the run finishes and is audited from the volume, and `down -v`
leaves nothing of the project behind.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from shared.metrics import read_metrics
from shared.rundir import RunDir
from shared.waiting import wait_for
from tests.containers import (
    Compose,
    HealthChecks,
    PodmanService,
    build_cpu_image,
    missing_tools,
    write_containers_conf,
)
from tests.helpers import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 60
CHECKPOINT_EVERY = 10
KILL_AFTER = 12  # trainer updates seen on the volume before its container is killed
ASYNC = 1  # the embedded default's max_async_level
SETTINGS = {
    "TRIAD_MAX_STEPS": STEPS,
    "TRIAD_TRAINER__CHECKPOINT__EVERY": CHECKPOINT_EVERY,
    "TRIAD_ORCHESTRATOR__WEIGHTS_TIMEOUT_S": 180,
    "TRIAD_ORCHESTRATOR__KEEP_ROLLOUTS": STEPS,
    "TRIAD_WEIGHTS__KEEP": STEPS,
}


def override_file(root: Path) -> Path:
    """A compose override: a shorter run that keeps every batch and weight version for the
    audit, and the admin token from a file outside the checkout."""
    token = root / "admin_token"
    token.write_text(secrets.token_hex(16))
    env = {k: str(v) for k, v in SETTINGS.items()}
    override = {
        "version": "3.9",
        "services": {name: {"environment": env} for name in ("inference", "orchestrator", "trainer")},
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
def compose(tmp_path_factory, podman_env):
    root = tmp_path_factory.mktemp("compose")
    seconds = build_cpu_image(podman_env, root / "build.log")
    print(f"image build (base image and layers cached when present): {seconds:.0f} s")
    service = PodmanService(root, podman_env)
    env = {**podman_env, "DOCKER_HOST": service.docker_host, "COMPOSE_PROFILES": "cpu"}
    project = Compose(
        f"triadit{os.getpid()}", [REPO / "compose.yaml", override_file(root)], env, root / "compose.log"
    )
    health = HealthChecks(project.project, env, root / "healthchecks.log")
    try:
        yield project
    finally:
        project.run("down", "--volumes", "--timeout=5", check=False)
        health.stop()
        service.stop()


def trained_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in read_metrics(RunDir(run_dir).metrics_file("trainer"))]


def check_run(run_dir: Path) -> None:
    """Every update 1..STEPS once, every batch within max_async_level, every version published."""
    rundir = RunDir(run_dir)
    run_id = rundir.read_run().run_id
    assert trained_steps(run_dir) == list(range(1, STEPS + 1))
    assert rundir.rollouts.done_steps(run_id) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        versions = pq.read_table(rundir.batch_file(step), columns=["policy_version"]).column(0).to_pylist()
        assert all(0 <= step - 1 - v <= ASYNC for v in versions), (step, versions)
    assert rundir.weights.done_steps(run_id) == list(range(1, STEPS + 1))
    served = [r["version"] for r in read_metrics(rundir.metrics_file("inference"))]
    assert served[-1] == STEPS, served


def kill_trainer_after_checkpoint(compose: Compose, run_dir: Path) -> None:
    def progressed() -> bool | None:
        return len(trained_steps(run_dir)) >= KILL_AFTER or None if run_dir.exists() else None

    wait_for(progressed, f"{KILL_AFTER} trainer updates in {run_dir}", timeout=420, poll=0.2, log_every=60)
    compose.run("kill", "trainer")
    assert compose.exit_code("trainer", timeout=30) == 137  # SIGKILL
    assert len(trained_steps(run_dir)) < STEPS, "the run finished before the trainer could be killed"


def test_compose_up_trains_survives_a_killed_trainer_and_comes_down_clean(compose: Compose) -> None:
    start = time.monotonic()
    compose.run("up", "--detach", "--no-build", timeout=600)  # returns once inference is healthy
    run_dir = compose.volume_path("runs") / "default"
    kill_trainer_after_checkpoint(compose, run_dir)
    killed_at = trained_steps(run_dir)[-1]
    wait_for(
        lambda: "waiting for the trainer to publish weights" in compose.logs("orchestrator") or None,
        "the orchestrator to say it waits for the trainer", timeout=120, poll=2,
    )  # fmt: skip
    assert compose.container("orchestrator")["State"]["Running"]
    assert compose.container("inference")["State"]["Running"]

    compose.run("up", "--detach", "--no-build", timeout=600)  # starts the killed trainer again
    assert compose.exit_code("trainer", timeout=600) == 0, compose.logs("trainer")[-4000:]
    assert compose.exit_code("orchestrator", timeout=120) == 0, compose.logs("orchestrator")[-4000:]
    resumed = re.search(r"resumed from the checkpoint after update (\d+)", compose.logs("trainer"))
    assert resumed, compose.logs("trainer")[-4000:]
    checkpoint = int(resumed.group(1))
    assert checkpoint % CHECKPOINT_EVERY == 0 and CHECKPOINT_EVERY <= checkpoint <= killed_at, killed_at
    assert re.search(
        r"went back from version \d+ to \d+|version \d+ was published again", compose.logs("orchestrator")
    )
    check_run(run_dir)
    print(f"compose run of {STEPS} steps with a killed trainer: {time.monotonic() - start:.0f} s")

    compose.run("down", "--volumes", "--timeout=5")
    assert compose.leftovers() == {"containers": [], "networks": [], "volumes": []}
