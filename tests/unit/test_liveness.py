"""Leases (one writer per role) and waits bounded by the peer's progress (`shared/liveness.py`)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from shared.batch import wait_for_batch_marker
from shared.config import load_config
from shared.errors import TriadError, WaitTimeout
from shared.liveness import LEASE_S, Lease, PeerWatch, Progress, check_free
from shared.rundir import ORCHESTRATOR, TRAINER, RunDir

PEER = """
import sys, time
from shared.liveness import Lease, Progress
from shared.rundir import RunDir
progress = Progress(phase="rolling out")
lease = Lease(RunDir(sys.argv[1]).live, sys.argv[2], progress, renew_s=0.05).start()
print("ready", flush=True)
while True:
    progress.add("samples_finished")
    time.sleep(0.05)
"""


@contextlib.contextmanager
def peer_process(run_dir: Path, role: str) -> Iterator[subprocess.Popen]:
    """A real process that holds `role` and makes progress until it is killed."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", PEER, str(run_dir), role], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait()


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_second_holder_is_refused_in_one_line_naming_the_first(tmp_path):
    live = RunDir(tmp_path).live
    first = Lease(live, TRAINER, Progress())
    first.acquire()
    with pytest.raises(TriadError) as refused:
        Lease(live, TRAINER, Progress()).acquire()
    message = str(refused.value)
    assert "\n" not in message
    assert f"another trainer holds this run directory ({live.describe(TRAINER)}: " in message
    assert f"pid {os.getpid()}" in message and "renewed 0 s ago" in message
    with pytest.raises(TriadError, match="another trainer holds"):
        check_free(live, TRAINER)
    check_free(live, ORCHESTRATOR)  # another role is free
    first.close()
    check_free(live, TRAINER)
    Lease(live, TRAINER, Progress()).acquire()  # given up: the next one takes it


def test_a_lease_not_renewed_for_lease_s_is_taken_over_and_its_holder_learns_it(tmp_path):
    live, clock = RunDir(tmp_path).live, Clock()
    first = Lease(live, TRAINER, Progress(), clock=clock)
    first.acquire()
    clock.now += LEASE_S - 1
    with pytest.raises(TriadError):
        Lease(live, TRAINER, Progress(), clock=clock).acquire()
    assert first.renew()
    clock.now += LEASE_S + 1
    second = Lease(live, TRAINER, Progress(), clock=clock)
    second.acquire()
    assert not first.renew()  # it must stop
    assert second.renew()
    first.close()  # leaves the record of the new holder
    with pytest.raises(TriadError, match="another trainer holds"):
        check_free(live, TRAINER, clock=clock)


def test_a_holder_whose_pid_is_gone_on_this_host_is_taken_over_at_once(tmp_path):
    with peer_process(tmp_path, ORCHESTRATOR) as peer:
        with pytest.raises(TriadError, match=f"pid {peer.pid}"):
            Lease(RunDir(tmp_path).live, ORCHESTRATOR, Progress()).acquire()
        peer.send_signal(signal.SIGKILL)
        peer.wait()
        Lease(RunDir(tmp_path).live, ORCHESTRATOR, Progress()).acquire()


def test_a_record_whose_pid_now_runs_another_process_is_taken_over(tmp_path):
    """As after a container restart: the pid exists, but it is not the process that held the role."""
    live = RunDir(tmp_path).live
    old = Lease(live, TRAINER, Progress())
    old.record = old.record.model_copy(update={"pid_start": old.record.pid_start - 1})
    old.acquire()
    Lease(live, TRAINER, Progress()).acquire()
    assert not old.renew()


def test_the_heartbeat_thread_renews_and_publishes_progress_and_stops_when_taken_over(tmp_path):
    live, lost = RunDir(tmp_path).live, threading.Event()
    progress = Progress(phase="training")
    lease = Lease(live, TRAINER, progress, on_lost=lost.set, renew_s=0.02).start()
    progress.add("micro_steps", 3)
    watch = PeerWatch(live, TRAINER, 60, "k")
    deadline = time.monotonic() + 5
    while (watch.seen_record is None or watch.seen_record.progress.get("micro_steps") != 3) and (
        time.monotonic() < deadline
    ):
        watch.read_at = -1e9
        watch.observe()
    assert watch.seen_record.progress == {"phase": "training", "micro_steps": 3}
    live.remove(TRAINER)
    Lease(live, TRAINER, Progress()).acquire()  # another process takes the role
    assert lost.wait(5)
    lease.close()


def test_a_peer_that_makes_progress_keeps_the_wait_going_one_that_stops_is_named(tmp_path):
    live, clock, wall = RunDir(tmp_path).live, Clock(0.0), Clock(1_000_000.0)
    progress = Progress()
    lease = Lease(live, ORCHESTRATOR, progress, clock=wall)
    lease.acquire()
    watch = PeerWatch(live, ORCHESTRATOR, 10, "trainer.batch_stall_s", clock=clock, wall=wall)
    for _ in range(30):  # 60 s of waiting, progress every 2 s
        clock.now += 2
        wall.now += 2
        progress.add("samples_finished", 4)
        lease.renew()
        watch.check("batch 1")
    for _ in range(5):  # alive (renewed) but no progress
        clock.now += 2
        wall.now += 2
        lease.renew()
        watch.check("batch 1")
    clock.now += 2
    wall.now += 2
    with pytest.raises(WaitTimeout) as stalled:
        watch.check("batch 1")
    message = str(stalled.value)
    assert message.startswith(
        f"the orchestrator (host {lease.record.host}, pid {os.getpid()}, renewed 2 s ago)"
    )
    assert "made no progress for 10 s; its last: samples_finished 120 at " in message
    assert "(12 s ago) (trainer.batch_stall_s); waited for batch 1" in message


def test_a_peer_without_any_heartbeat_is_named_after_the_stall_bound(tmp_path):
    clock = Clock(0.0)
    watch = PeerWatch(RunDir(tmp_path).live, TRAINER, 5, "orchestrator.weights_stall_s", clock=clock)
    clock.now = 5
    watch.check("new weights")
    clock.now = 5.1
    where = re.escape(RunDir(tmp_path).live.describe(TRAINER))
    with pytest.raises(
        WaitTimeout, match=rf"^no heartbeat from the trainer in {where} for 5 s: is it running\?"
    ):
        watch.check("new weights")


def test_the_trainer_waits_on_a_slow_orchestrator_and_names_a_killed_one_within_the_bound(tmp_path):
    """A batch that takes longer than the stall bound comes while the orchestrator makes
    progress; after a kill -9 of the orchestrator the wait ends within the bound, naming it."""
    rundir = RunDir(tmp_path)
    run_id = rundir.ensure_run({}).run_id
    stall = 1.0
    with peer_process(tmp_path, ORCHESTRATOR) as orchestrator:
        watch = PeerWatch(rundir.live, ORCHESTRATOR, stall, "trainer.batch_stall_s")
        timer = threading.Timer(3 * stall, lambda: rundir.rollouts.write_marker(1, run_id))
        timer.start()
        marker = wait_for_batch_marker(rundir, 1, run_id, None, peer=watch)
        timer.join()
        assert marker.run_id == run_id
        orchestrator.send_signal(signal.SIGKILL)
        orchestrator.wait()
        killed = time.monotonic()
        with pytest.raises(WaitTimeout) as stalled:
            wait_for_batch_marker(rundir, 2, run_id, None, peer=watch)
    waited = time.monotonic() - killed
    assert stall < waited < stall + 1.5
    assert f"the orchestrator (host {os.uname().nodename}, pid {orchestrator.pid}, " in str(stalled.value)
    assert "made no progress for 1 s; its last: phase rolling out, samples_finished " in str(stalled.value)
    assert rundir.rollouts.describe_marker(2) in str(stalled.value)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("trainer.batch_timeout_s", "trainer.batch_stall_s"),
        ("orchestrator.weights_timeout_s", "orchestrator.weights_stall_s"),
    ],
)
def test_the_old_fixed_bounds_name_their_new_place(tmp_path, old, new):
    with pytest.raises(TriadError) as caught:
        load_config(None, [f"run_dir={tmp_path}", f"{old}=300"])
    assert str(caught.value) == f"config key {old!r} is now {new!r} (from TRIAD_* variables or --set)"


def test_status_shows_each_sides_holder_and_last_progress(tmp_path):
    from services.report import status_lines

    rundir = RunDir(tmp_path)
    rundir.ensure_run({"max_steps": 5})
    progress = Progress(step=3, micro_steps=12)
    Lease(rundir.live, TRAINER, progress, clock=Clock(1000.0)).acquire()
    lines = status_lines(rundir, now=1005.0)
    holder = f"host {os.uname().nodename}, pid {os.getpid()}, renewed 5 s ago"
    assert (
        f"  trainer      {holder}; last progress: step 3, micro_steps 12 at 00:16:40 UTC (5 s ago)" in lines
    )
    assert "  orchestrator no process holds it" in lines
    later = status_lines(rundir, now=1000.0 + LEASE_S + 1)
    assert any(line.startswith("  trainer ") and "(gone: the lease is free)" in line for line in later)
