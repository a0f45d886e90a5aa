"""The elastic fleet with real parts: a server joins a running run, serves it, and dies.

One fixed vLLM server, the orchestrator and a 1-rank torchrun trainer run on a local
run directory. While the trainer is paused (SIGSTOP: a slow trainer, so that the run
is certainly mid-way), a second server starts with `triad inference --join`; the
orchestrator must admit it at the trainer's newest version. The trainer continues,
the joiner's samples appear in the batches; the trainer is paused again, the joiner
is killed with -9 (rollouts may be in flight), and once the orchestrator has removed
it the run finishes on the first server: trainer steps exactly 1..N, every batch
within max_async_level, and the last batches all from the first server.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from shared.errors import WaitTimeout
from shared.fleet import parse_records
from shared.rundir import RunDir
from shared.waiting import wait_for
from tests.helpers import REPO, Server, trainer_cmd, triad_cmd

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STEPS = 12
ASYNC = 1


class Run:
    def __init__(self, root: Path, model: str) -> None:
        self.root, self.model, self.run_dir = root, model, root / "run"
        self.rundir = RunDir(self.run_dir)
        self.first = Server(self.run_dir, model, root / "first.log", *self.shared_sets())
        self.joiner: Server | None = None
        self.procs: dict[str, subprocess.Popen] = {}

    def shared_sets(self) -> list[str]:
        return [
            f"max_steps={STEPS}",
            f"max_async_level={ASYNC}",
            "inference.heartbeat_interval_s=0.5",
            "orchestrator.servers.heartbeat_timeout_s=3",
            "orchestrator.servers.fleet_poll_s=0.5",
        ]

    def sets(self) -> list[str]:
        return [
            f"run_dir={self.run_dir}",
            f"model={self.model}",
            *self.shared_sets(),
            f'orchestrator.servers.urls=["{self.first.url}"]',
            "orchestrator.batch_size=4",
            "orchestrator.group_size=4",
            "orchestrator.sampling.max_tokens=6",
            "orchestrator.servers.health_interval_s=1",
            "orchestrator.servers.retry_backoff_s=0.2",
            "orchestrator.servers.ready_timeout_s=240",
            "orchestrator.keep_rollouts=100",
            "weights.keep=100",
            "trainer.checkpoint.every=0",
        ]

    def start(self, service: str) -> None:
        flags = [f"--set={s}" for s in self.sets()]
        cmd = triad_cmd(service, *flags)
        if service == "trainer":
            cmd = trainer_cmd(*flags)
        log = open(self.root / f"{service}.log", "ab")  # noqa: SIM115 (the child keeps it)
        self.procs[service] = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def signal_trainer(self, sig: signal.Signals) -> None:
        """torchrun and its ranks (each in a session of its own)."""
        launcher = psutil.Process(self.procs["trainer"].pid)
        for proc in [launcher, *launcher.children(recursive=True)]:
            proc.send_signal(sig)

    def newest_weights(self) -> int:
        if not self.rundir.run_file.exists():  # the orchestrator has not created the run yet
            return 0
        return self.rundir.weights.newest(self.rundir.read_run().run_id)

    def pause_trainer(self) -> int:
        """SIGSTOP the trainer; the newest version it had published, which stays the newest."""
        self.signal_trainer(signal.SIGSTOP)
        time.sleep(0.5)
        return self.newest_weights()

    def log(self, service: str) -> str:
        return (self.root / f"{service}.log").read_text(errors="replace")

    def wait_until(self, check, what: str, timeout: float = 240) -> object:
        try:
            return wait_for(check, what, timeout, poll=0.1)
        except WaitTimeout as e:
            raise AssertionError(f"{e}:\n{self.log('orchestrator')[-4000:]}") from None

    def finish(self) -> None:
        for service in ("orchestrator", "trainer"):
            try:
                code = self.procs[service].wait(timeout=240)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{service} did not finish:\n{self.log(service)[-4000:]}") from None
            assert code == 0, f"{service} exited {code}:\n{self.log(service)[-4000:]}"

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for server in (self.first, self.joiner):
            if server is not None:
                server.stop()

    def trained(self) -> list[int]:
        return [r["step"] for r in self.rundir.metrics.rows("trainer")]

    def servers_of(self, step: int) -> list[str]:
        return pq.read_table(self.rundir.batch_file(step), columns=["server"]).column(0).to_pylist()

    def batch_with(self, url: str) -> int | None:
        done = [s for s in self.rundir.rollouts.steps() if self.rundir.rollouts.has_marker(s)]
        return next((s for s in done if url in self.servers_of(s)), None)


@pytest.fixture
def run(tmp_path, tiny_model):
    r = Run(tmp_path, tiny_model)
    try:
        r.first.wait_healthy()
        yield r
    finally:
        r.stop()


def test_a_server_joins_mid_run_serves_at_the_current_version_and_dies(run):
    run.start("orchestrator")
    run.start("trainer")
    run.wait_until(lambda: run.newest_weights() or None, "the trainer's first weights")
    current = run.pause_trainer()

    run.joiner = Server(run.run_dir, run.model, run.root / "joiner.log", *run.shared_sets(), join=True)
    joiner = run.joiner.url
    admitted = re.compile(rf"inference server {re.escape(joiner)} admitted, serving version (\d+)")
    version = int(run.wait_until(lambda: admitted.search(run.log("orchestrator")), "the joiner").group(1))
    assert version == current  # brought to the trainer's newest version before any request
    records = parse_records(run.rundir.fleet.read_all(), "the registry")
    assert [r.url for r in records] == [joiner]

    run.signal_trainer(signal.SIGCONT)
    run.wait_until(lambda: run.batch_with(joiner), "a batch with the joiner's samples")
    paused_at = run.pause_trainer()
    run.joiner.kill()  # rollouts of the batches ahead of the trainer may be in flight
    removed = f"removing inference server {joiner} from the pool: its heartbeat"
    run.wait_until(lambda: removed in run.log("orchestrator") or None, "the joiner's removal", timeout=60)
    assert [r.url for r in parse_records(run.rundir.fleet.read_all(), "")] == [joiner]  # left behind
    run.signal_trainer(signal.SIGCONT)
    run.finish()

    assert run.trained() == list(range(1, STEPS + 1))
    rows = {s: pq.read_table(run.rundir.batch_file(s)).to_pylist() for s in range(1, STEPS + 1)}
    for step, batch in rows.items():
        assert all(0 <= step - 1 - r["policy_version"] <= ASYNC for r in batch), step
    from_joiner = [r for batch in rows.values() for r in batch if r["server"] == joiner]
    assert from_joiner and all(r["policy_version"] >= version for r in from_joiner)
    later = range(paused_at + ASYNC + 2, STEPS + 1)  # their versions came after the trainer went on
    assert later, f"the run ended too early to show it finishes without the joiner ({paused_at=})"
    assert all(r["server"] == run.first.url for s in later for r in rows[s])
    # each server logged its loads to a metrics file of its own, named by its fleet record's id
    loads = run.rundir.metrics.rows("inference")
    first_ids = {r["server"] for r in loads} - {records[0].server_id}
    assert len(first_ids) == 1, loads
    assert [r["version"] for r in loads if r["server"] == records[0].server_id][:2] == [0, version]
    assert [r["version"] for r in loads if r["server"] in first_ids][-1] == STEPS
