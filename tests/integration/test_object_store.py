"""Three hosts that share no directory at all, only an S3-compatible store.

Inference, orchestrator and trainer each run in their own network namespace, with their
own cache directory; each reaches only the store (moto's standalone server, in the root
namespace, through a link of its own) and the orchestrator also reaches inference. The
run directory is `s3://bucket/run`. In the middle of the run the store stops answering
for 10 s (SIGSTOP); the run goes on afterwards. The audit reads the store alone.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from shared.batch import load_batch
from shared.faults import AUDIT_VAR
from shared.rundir import RunDir
from shared.storage import open_store
from tests.helpers import check_reads, trainer_cmd
from tests.integration.test_three_hosts import sh, stop
from tests.s3 import MotoServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS, ETA = 5, 1
BUCKET = "triad-run"
INFERENCE_IP, ORCHESTRATOR_IP = "10.231.78.1", "10.231.78.2"
ROLES = ("inf", "orc", "trn")  # each host's own link to the store: root side .1, host side .2
TOKEN = "s3-test-token"
OUTAGE_S = 10


def link(ns: str, subnet: str, tag: str) -> None:
    """A veth pair from the root namespace (the store, at subnet.1) into `ns` (subnet.2)."""
    root, inner = f"sr{tag}", f"sh{tag}"
    sh("ip", "link", "add", root, "type", "veth", "peer", "name", inner)
    sh("ip", "link", "set", inner, "netns", ns)
    sh("ip", "addr", "add", f"{subnet}.1/30", "dev", root)
    sh("ip", "link", "set", root, "up")
    sh("ip", "-n", ns, "addr", "add", f"{subnet}.2/30", "dev", inner)
    sh("ip", "-n", ns, "link", "set", inner, "up")


def free_subnets(count: int) -> list[str]:
    """`count` prefixes 10.232.N whose addresses the root namespace does not hold: another test
    session's hosts, or those a killed one left behind, keep theirs."""
    held = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    taken = {int(m) for m in re.findall(r"inet 10\.232\.(\d+)\.", held)}
    free = [n for n in range(1, 255) if n not in taken]
    return [f"10.232.{n}" for n in random.sample(free, count)]


@dataclass(frozen=True)
class Hosts:
    """Three namespaces (a role's host) and the prefix of each one's link to the store."""

    names: dict[str, str]
    subnets: dict[str, str]

    def __getitem__(self, role: str) -> str:
        return self.names[role]


@pytest.fixture(scope="module")
def hosts():
    if os.geteuid() != 0 or subprocess.run(["which", "ip"], capture_output=True).returncode != 0:
        pytest.skip("network namespaces need root and iproute2")
    tag = uuid.uuid4().hex[:5]
    names = {role: f"triad-s3-{role}-{tag}" for role in ROLES}
    subnets = dict(zip(ROLES, free_subnets(len(ROLES)), strict=True))
    try:
        for ns in names.values():
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        for i, (role, subnet) in enumerate(subnets.items()):
            link(names[role], subnet, f"{tag}{i}")
        a, b = f"vi{tag}", f"vo{tag}"
        sh("ip", "link", "add", a, "type", "veth", "peer", "name", b)
        for dev, ns, ip in ((a, names["inf"], INFERENCE_IP), (b, names["orc"], ORCHESTRATOR_IP)):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{ip}/30", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
    except subprocess.CalledProcessError as e:
        for ns in names.values():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
    yield Hosts(names, subnets)
    for ns in names.values():
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log", host="0.0.0.0")
    server.create_bucket(BUCKET)
    yield server
    server.close()


def service_env(store: MotoServer, hosts: Hosts, role: str, cache: Path) -> dict[str, str]:
    """A host's view: the store at its own link's address, a cache of its own, no shared path."""
    env = {**os.environ, **store.env(), "TRIAD_CACHE": str(cache)}
    env["AWS_ENDPOINT_URL"] = f"http://{hosts.subnets[role]}.1:{store.port}"
    return env


def start(ns: str, env: dict[str, str], *cmd: str, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )


def trained_steps(rundir: RunDir) -> list[int]:
    return [r["step"] for r in rundir.metrics.rows("trainer")]


def write_config(path: Path, url: str, model: str, steps: int) -> Path:
    path.write_text(
        f'run_dir = "{url}"\nmodel = "{model}"\nmax_steps = {steps}\nmax_async_level = {ETA}\n'
        f'[inference]\nhost = "{INFERENCE_IP}"\nport = 8000\nadmin_token = "{TOKEN}"\n'
        "heartbeat_interval_s = 1\n"
        f'[orchestrator]\nservers.urls = ["http://{INFERENCE_IP}:8000"]\nbatch_size = 4\ngroup_size = 4\n'
        f"keep_rollouts = {steps}\n[trainer.optim]\nlr = 1e-3\n[trainer.checkpoint]\nevery = 2\n"
    )
    return path


def commands(config: Path) -> dict[str, list[str]]:
    """Each host's service: inference (joining the fleet), a 2-rank trainer, the orchestrator."""
    py, cli, c = sys.executable, ["-m", "services.cli"], ["-c", str(config)]
    return {
        "inf": [py, *cli, "inference", *c, "--join"],
        "trn": trainer_cmd(*c, nproc=2, python=py),
        "orc": [py, *cli, "orchestrator", *c],
    }


def test_three_hosts_share_only_a_bucket_and_ride_out_an_outage(
    hosts, store, tiny_model, tmp_path, monkeypatch
):
    url = f"s3://{BUCKET}/run"
    cmd = commands(write_config(tmp_path / "triad.toml", url, tiny_model, STEPS))
    env = {role: service_env(store, hosts, role, tmp_path / f"cache-{role}") for role in ROLES}
    inference, trainer, orchestrator = (
        start(hosts[role], env[role], *cmd[role], log=tmp_path / f"{role}.log")
        for role in ("inf", "trn", "orc")
    )
    for key, value in store.env().items():
        monkeypatch.setenv(key, value)
    rundir = RunDir(url, open_store(url, tmp_path / "audit-cache", timeout_s=60))
    logs = lambda: "\n".join(p.name + ":\n" + p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))  # noqa: E731
    try:
        deadline = time.monotonic() + 400
        while len(trained_steps(rundir)) < 2:
            assert time.monotonic() < deadline and trainer.poll() is None, f"no progress:\n{logs()}"
            time.sleep(1)
        with store.stopped():
            time.sleep(OUTAGE_S)
        outage_after = trained_steps(rundir)[-1]
        for name, proc in (("orchestrator", orchestrator), ("trainer", trainer)):
            code = proc.wait(timeout=400)
            assert code == 0, f"{name} failed:\n{logs()}"
    finally:
        for proc in (inference, trainer, orchestrator):
            stop(proc)
    audit(rundir)
    assert outage_after < STEPS, "the outage came after the run had finished"
    # a service logs the store wait when it has a call in flight during the outage: the trainer
    # always has (it polls for the next batch or publishes), inference too (its fleet heartbeat,
    # every second; --join with its fixed URL changes nothing else); the orchestrator either
    # polls the store or waits for inference
    said = {
        n: f"waiting for object store {url}" in (tmp_path / n).read_text()
        for n in ("trn.log", "orc.log", "inf.log")
    }
    assert said["trn.log"] and said["inf.log"], said
    assert not any(p.is_file() for p in (tmp_path / "cache-orc").rglob("*.parquet"))


def audit(rundir: RunDir, steps: int = STEPS) -> None:
    """From the store alone: steps 1..N trained once each, every sample within η, one of lag 1."""
    run_id = rundir.read_run().run_id
    assert trained_steps(rundir) == list(range(1, steps + 1))
    assert rundir.rollouts.done_steps(run_id)[-1] == steps
    lags = []
    for step in range(1, steps + 1):
        rows = load_batch(rundir, step).to_pylist()
        lags += [step - 1 - r["policy_version"] for r in rows]
    assert lags and all(0 <= lag <= ETA for lag in lags) and 1 in lags, lags
    assert rundir.weights.newest(run_id) == steps
    assert rundir.checkpoints.newest(run_id) in (steps - steps % 2, steps)
    assert max(r["version"] for r in rundir.metrics.rows("inference")) == steps


# which host's service is killed once that many steps are trained
KILLS = (("trn", 3), ("orc", 5), ("inf", 7))
KILL_STEPS = 10


def test_three_hosts_each_service_killed_and_restarted(hosts, store, tiny_model, tmp_path, monkeypatch):
    """kill -9 of each host's whole service (torchrun with its ranks, vLLM with its engine) in
    turn, then the same command again on that host: steps exactly 1..N, every batch within η,
    all read from the store alone, and no reader ever opened a version or batch before its DONE."""
    url = f"s3://{BUCKET}/kills"
    cmd = commands(write_config(tmp_path / "triad.toml", url, tiny_model, KILL_STEPS))
    env = {role: service_env(store, hosts, role, tmp_path / f"cache-{role}") for role in ROLES}
    audit_file = tmp_path / "reads.jsonl"  # each open of a version or batch by trainer and inference
    for role in ("trn", "inf"):
        env[role][AUDIT_VAR] = str(audit_file)
    procs = {role: start(hosts[role], env[role], *cmd[role], log=tmp_path / f"{role}.log") for role in cmd}
    for key, value in store.env().items():
        monkeypatch.setenv(key, value)
    rundir = RunDir(url, open_store(url, tmp_path / "audit-cache", timeout_s=60))
    logs = lambda: "\n".join(p.name + ":\n" + p.read_text()[-3000:] for p in sorted(tmp_path.glob("*.log")))  # noqa: E731
    try:
        for role, after in KILLS:
            deadline = time.monotonic() + 400
            while len(trained_steps(rundir)) < after:
                assert time.monotonic() < deadline and procs["trn"].poll() is None, f"no progress:\n{logs()}"
                time.sleep(0.5)
            os.killpg(procs[role].pid, signal.SIGKILL)
            procs[role].wait()
            procs[role] = start(hosts[role], env[role], *cmd[role], log=tmp_path / f"{role}-again.log")
        for role in ("orc", "trn"):
            assert procs[role].wait(timeout=400) == 0, f"{role} failed:\n{logs()}"
    finally:
        for proc in procs.values():
            stop(proc)
    audit(rundir, KILL_STEPS)
    check_reads(audit_file)  # no reader opened a version or batch before its DONE
    assert "resumed from the checkpoint" in (tmp_path / "trn-again.log").read_text()
    assert "is back, serving version" in (tmp_path / "orc-again.log").read_text()
