"""`triad up`: the three services as child processes on this node.

Each child runs the same entry point as its stand-alone command, in its own
process group that ends when `triad up` dies (even by `kill -9`), with its output in
`run_dir/logs/<service>.log`. A run directory that a live trainer or orchestrator holds
(`shared/liveness.py`) is refused before anything in it changes. The run ends
when the orchestrator and the trainer have both finished; if any child fails
the others are stopped and the failing child's own one-line error is shown (or,
without one, its last log lines).
Ctrl-C stops all three.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from services.disk_plan import room_warning
from services.exporters import make_exporters
from services.models import is_hub_id, resolve_model
from services.placement import borrowed_cores, check_placement, frontend_cores, has_gpu, pinned, placement
from services.progress import ProgressPrinter, StartTimes, log_text
from services.report import plot_run
from services.timeline import bound
from services.tiny_model import cache_root
from shared.config import TriadConfig
from shared.cpus import parse_cpus
from shared.errors import TriadError
from shared.liveness import check_free
from shared.net import check_can_listen
from shared.resume import discard_after_checkpoint, newest_checkpoint
from shared.rundir import INFERENCE, ORCHESTRATOR, TRAINER, RunDir

STOP_GRACE_S = 8.0
TAIL_LINES = 25
START_TIMES = "start_times.json"  # in the model cache: the last start's times on this machine
BOUND_STEPS = 20  # the steps the end-of-run line on which side bounds the step looks at
# what a service's CLI prints for a TriadError (services/cli.py), maybe behind a launcher's prefix
SERVICE_ERROR = re.compile(r"triad (?:inference|orchestrator|trainer): error: (.+)")


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    log_offset: int = 0  # where this start's output begins: a run's logs keep every start's

    def lines(self) -> list[str]:
        return log_text(self.log_path, self.log_offset).splitlines()

    def failure(self, code: int) -> str:
        """Why the child stopped, for the user: its own one-line error if it printed one (the
        first: under torchrun every rank prints it), else the last lines of its log."""
        lines = self.lines()
        line = error_line(lines)
        if line is not None:
            return f"{self.name}: {line} (exit code {code}; log: {self.log_path})"
        tail = "\n".join(lines[-TAIL_LINES:]) or "(no log)"
        return f"{self.name} exited with code {code}; last lines of {self.log_path}:\n{tail}"


def error_line(lines: list[str]) -> str | None:
    """The first one-line error a triad service printed in these log lines, without its prefix."""
    for line in lines:
        match = SERVICE_ERROR.search(line)
        if match:
            return match.group(1).strip()
    return None


def check_before_launch(cfg: TriadConfig, model: str) -> None:
    """What the config, a local model's config.json and this machine settle before any service
    starts (a child would find it too, but after its start-up and among a launcher's lines)."""
    check_model_config(cfg, model)
    check_placement(cfg)
    check_can_listen(cfg.inference.host, cfg.inference.port, "inference.port")


def check_model_config(cfg: TriadConfig, model: str) -> None:
    config_json = Path(model) / "config.json"
    if not config_json.is_file():
        return  # a hub id: the services read it themselves
    try:
        model_config = json.loads(config_json.read_text())
    except (OSError, ValueError) as e:
        raise TriadError(f"cannot read the model's config {config_json}: {e}") from None
    if not isinstance(model_config, dict):
        raise TriadError(f"cannot read the model's config {config_json}: not a JSON object")
    cfg.trainer.lora.check_model_config(model_config)


def model_sets(cfg: TriadConfig, model: str) -> list[str]:
    """The model the children are given: a hub id stays the id (vLLM serves it under that name) at
    the commit this launch resolved, `model`'s snapshot (`child_env` keeps them off the Hub);
    a built-in or local model its directory."""
    if not is_hub_id(cfg.model):
        return [f"model={model}"]
    return [f"model={cfg.model}", f'model_revision="{Path(model).name}"']


def child_commands(
    cfg: TriadConfig,
    config_path: Path | None,
    overrides: list[str],
    model: str,
    frontend: str | None = None,
    borrowed: str | None = None,
) -> dict:
    """Each child's command line (`frontend`: `frontend_cores`, given to inference; `borrowed`:
    `borrowed_cores`, given to the trainer)."""
    args = (["-c", str(config_path)] if config_path else []) + [
        f"--set={o}" for o in [*overrides, *model_sets(cfg, model)]
    ]
    inference_args = [*args, f"--set=inference.frontend_cpus={frontend}"] if frontend else args
    trainer_args = [*args, f"--set=trainer.borrow_cpus={borrowed}"] if borrowed else args
    py = [sys.executable, "-m"]
    torchrun = [*py, "torch.distributed.run", "--standalone", f"--nproc-per-node={cfg.trainer.nproc}"]
    return {
        INFERENCE: [*py, "services.cli", INFERENCE, *inference_args],
        ORCHESTRATOR: [*py, "services.cli", ORCHESTRATOR, *args],
        TRAINER: [*torchrun, "-m", "services.cli", TRAINER, *trainer_args],
    }


def child_env(cfg: TriadConfig, name: str, cpus: dict | None = None) -> dict[str, str]:
    """The child's environment: ours, plus its GPUs and CPU threads when the config pins them
    (`cpus`: `placement(cfg)`)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if is_hub_id(cfg.model):  # resolved (and downloaded) by the launch: each child reads that snapshot
        env["HF_HUB_OFFLINE"] = "1"
    cpus = placement(cfg) if cpus is None else cpus
    devices = {INFERENCE: cfg.inference.devices, TRAINER: cfg.trainer.devices}.get(name)
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = devices
    if name == INFERENCE and cpus[INFERENCE]:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpus[INFERENCE]  # vLLM binds its threads itself
    if name == TRAINER and cpus[TRAINER]:
        per_rank = max(1, len(parse_cpus(cpus[TRAINER])) // cfg.trainer.nproc)
        env["OMP_NUM_THREADS"] = str(per_rank)
    return env


def start(name: str, cmd: list[str], rundir: RunDir, env: dict[str, str]) -> Child:
    """The child in a process group of its own, which ends when this process dies, even by
    `kill -9` (`services/die_with_parent.py`)."""
    log_path = rundir.log_file(name)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as out:
        offset = out.seek(0, os.SEEK_END)
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.die_with_parent", *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    return Child(name, proc, log_path, offset)


def stop_all(children: list[Child]) -> None:
    """SIGTERM every child's process group, then SIGKILL what is left after a grace period."""
    for child in children:
        if child.proc.poll() is None:
            _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
        _signal_group(child, signal.SIGKILL)  # also reaps grandchildren left behind
        child.proc.wait()


def _signal_group(child: Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.proc.pid, sig)


def supervise(children: dict[str, Child], progress: ProgressPrinter) -> None:
    finishers = {ORCHESTRATOR, TRAINER}
    while True:
        progress.poll()
        for name, child in children.items():
            code = child.proc.poll()
            if code is None or (code == 0 and name in finishers):
                continue
            raise TriadError(child.failure(code))
        if all(children[n].proc.poll() == 0 for n in finishers):
            return
        time.sleep(0.5)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run_up(cfg: TriadConfig, config_path: Path | None, overrides: list[str]) -> None:
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops the children too, like Ctrl-C
    # explicitly: a process started with SIGINT ignored (nohup, a script's background job) keeps it
    # ignored, and Ctrl-C would then leave the run going
    signal.signal(signal.SIGINT, _interrupt)
    rundir = RunDir.of(cfg)
    rundir.check_writable()
    for role in (TRAINER, ORCHESTRATOR):  # before anything of the run is discarded
        check_free(rundir.live, role)
    model = resolve_model(cfg.model, cfg.model_revision)
    check_before_launch(cfg, model)
    run = rundir.ensure_run(cfg.public_dict())
    print(f"triad up: run {run.run_id} in {cfg.run_dir} (model {model}); logs in {rundir.logs_dir}")
    resume_from = newest_checkpoint(rundir, run.run_id)
    if resume_from or rundir.rollouts.steps():
        print(f"triad up: resuming after update {resume_from} (the newest checkpoint)")
        discard_after_checkpoint(rundir, run.run_id, resume_from)
    if warning := room_warning(cfg, Path(model), rundir):
        print(f"triad up: warning: {warning}", file=sys.stderr)
    cpus = placement(cfg)
    frontend, borrowed = frontend_cores(cfg, cpus), borrowed_cores(cfg, cpus)
    commands = child_commands(cfg, config_path, overrides, model, frontend, borrowed)
    if cfg.inference.cpus == "auto" and cpus[INFERENCE]:
        api_server = f" (vLLM's API server on {frontend} once started)" if frontend else ""
        borrowing = f", and on {borrowed} too while it bounds the step" if borrowed else ""
        print(
            f"triad up: inference on cores {cpus[INFERENCE]}{api_server}, the trainer on "
            f"{cpus[TRAINER]}{borrowing} (cpus auto)"
        )
    start_times = StartTimes(cache_root() / START_TIMES, f"{cfg.model} on {'GPU' if has_gpu() else 'CPU'}")
    # before the children: an exporter that cannot start stops nothing, and what the logs and
    # metrics hold by now is a previous start's
    progress = ProgressPrinter(
        rundir, cfg.max_steps, make_exporters(cfg, rundir, run.run_id), sys.stdout.isatty(), start_times
    )
    children: dict[str, Child] = {}
    try:
        for name, cmd in commands.items():
            children[name] = start(name, pinned(cmd, cpus.get(name)), rundir, child_env(cfg, name, cpus))
        supervise(children, progress)
        progress.poll()
    except KeyboardInterrupt:
        print("\ntriad up: interrupted, stopping all services", file=sys.stderr)
        raise
    finally:
        progress.close()
        stop_all(list(children.values()))
    progress.summary()
    if found := bound(rundir, BOUND_STEPS):
        print(f"triad up: {found.line} (its last {found.steps} steps)")
    print(f"plot: {plot_run(rundir)}")
