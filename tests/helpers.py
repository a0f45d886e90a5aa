"""Helpers for tests that start real services as subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from inference.socket_dir import PREFIX as SOCKET_DIR_PREFIX
from inference.socket_dir import own_socket_dir
from services.cli import EMBEDDED_DEFAULT
from shared.config import load_config
from shared.errors import WaitTimeout
from shared.net import free_port  # tests import it from here too
from shared.waiting import wait_for

REPO = Path(__file__).resolve().parent.parent


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains `text` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):  # not a process, or gone meanwhile
            continue
        if state != "Z" and text.encode() in cmdline:
            found.append(int(entry.name))
    return found


def wait_until_gone(text: str, timeout: float = 10) -> list[int]:
    """Wait for every process mentioning `text` to exit; the pids still alive at the timeout."""
    try:
        wait_for(
            lambda: None if processes_mentioning(text) else True,
            f"the processes mentioning {text!r} to exit",
            timeout,
        )
    except WaitTimeout:
        return processes_mentioning(text)
    return []


def triad_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "services.cli", *args]


def descendants(root: int) -> set[int]:
    """Every live process below `root` (Linux /proc), at any depth."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (ValueError, OSError, IndexError):
            continue
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def run_triad(
    *args: str, timeout: float = 60, env: dict | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    return subprocess.run(
        triad_cmd(*args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def hub_cache_of(model_dir: str | Path, cache: Path, repo_id: str, commit: str = "5" * 40) -> Path:
    """`model_dir` as `repo_id` in a Hugging Face cache at `cache` (huggingface_hub's layout:
    `refs/main` naming `snapshots/<commit>`, whose files link to the model's); the snapshot."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = storage / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in Path(model_dir).iterdir():
        (snapshot / f.name).symlink_to(f.resolve())
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text(commit)
    return snapshot


def short_up_sets(run_dir: Path, steps: int, checkpoint_every: int) -> list[str]:
    """`triad up` on the embedded tiny model, as small as a step gets: 4 prompts x 4 samples of
    4 tokens, no evaluation, a checkpoint every `checkpoint_every` steps."""
    return [
        f"run_dir={run_dir}",
        f"max_steps={steps}",
        f"inference.port={free_port()}",
        "orchestrator.batch_size=4",
        "orchestrator.group_size=4",
        "orchestrator.sampling.max_tokens=4",
        "orchestrator.eval.every=0",
        f"trainer.checkpoint.every={checkpoint_every}",
    ]


@contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's syntax: "64k", "24m") mounted at `path` for the block: a disk
    that really fills. Skips the test where this process cannot mount (not root)."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root can): {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=True)


def resize_disk(path: Path, size: str) -> None:
    """Give the tmpfs `small_disk` mounted at `path` a new size."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(path)], check=True)


# what a user of the embedded chat model (a tiny Qwen3 on Qwen3's own template) adds to `vllm serve`
# for triad's chat rollouts: the parsers `auto` picks for that template
CHAT_VLLM_ARGS = (
    "--enable-scale-out",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "hermes",
    "--reasoning-parser",
    "qwen3",
)


def trainer_cmd(
    *args: str, nproc: int = 1, python: str = sys.executable, launch: tuple[str, ...] = ("--standalone",)
) -> list[str]:
    """`triad trainer ARGS` under torchrun with `nproc` ranks, as the tests and benches start it."""
    cli = ["-m", "services.cli", "trainer", *args]
    return [python, "-m", "torch.distributed.run", *launch, f"--nproc-per-node={nproc}", *cli]


# vLLM's own server as triad's launcher runs it on a CPU build (`inference/server.py` cpu_env):
# its one worker inside the engine's process, not in a third that imports vLLM and torch again
# (about 9 s of a core each start; its HTTP API is the same either way)
PLAIN_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# the tests' models are tiny (2 KiB of KV a token): the embedded default's KV cache, 65,536 tokens,
# not the 1 GiB that vLLM zeroes for 3-4 s at every start (a test that needs more sets its own)
TINY_KV_CACHE_GIB = load_config(EMBEDDED_DEFAULT).inference.kv_cache_gib


def plain_vllm_cmd(model: str, port: int, max_model_len: int = 256, extra: tuple[str, ...] = ()) -> list[str]:
    """vLLM's own OpenAI server, without triad's admin routes."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--seed",
        "0",
        "--max-model-len",
        str(max_model_len),
        "--disable-uvicorn-access-log",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(int(TINY_KV_CACHE_GIB * 2**30)),
        *extra,
    ]


def server_tracebacks(log: str) -> list[str]:
    """The tracebacks in an inference server's log, each as its last line, less the one vLLM 0.32
    itself may log on a graceful stop: its client's shutdown ends the output task with
    EngineDeadError while AsyncLLM's output handler still waits on it, and the handler logs
    "AsyncLLM output_handler failed." (vllm-project/vllm#48745, a race: seen once in CI, and
    every time when the server alone gets the SIGTERM). A stop has begun once vLLM logged a
    `[shutdown]` line (the engine's "trigger received signal", the server's "shutdown triggered")."""
    lines = log.splitlines()
    found = []
    for i, line in enumerate(lines):
        if "Traceback (most recent call last)" not in line:
            continue
        prefix = line[: line.index("Traceback")]
        end = i + 1  # past the frames (indented) to the exception's line
        while end < len(lines) - 1 and lines[end][len(prefix) :].startswith(" "):
            end += 1
        last = lines[end][len(prefix) :] if end < len(lines) else ""
        shutting_down = any("[shutdown] " in x for x in lines[:i])  # vLLM's stop had begun
        vllm_race = (
            shutting_down
            and i > 0
            and lines[i - 1].endswith("AsyncLLM output_handler failed.")
            and last.startswith("vllm.v1.engine.exceptions.EngineDeadError")
        )
        if not vllm_race:
            found.append(last)
    return found


class Server:
    """`triad inference` (or with `plain`, vLLM's own server; with `join`, `triad inference --join`)
    in a subprocess, logging to a file."""

    def __init__(
        self,
        run_dir: Path,
        model: str,
        log_path: Path,
        *extra: str,
        plain: bool = False,
        port: int = 0,
        max_model_len: int = 256,
        join: bool = False,
        vllm_args: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        kv_cache = f"inference.kv_cache_gib={TINY_KV_CACHE_GIB}"
        sets = [f"run_dir={run_dir}", f"model={model}", f"inference.port={self.port}", kv_cache, *extra]
        cmd = triad_cmd("inference", *[f"--set={s}" for s in sets], *(["--join"] if join else []))
        if plain:
            cmd = plain_vllm_cmd(model, self.port, max_model_len, vllm_args)
        self.log = open(log_path, "ab")  # noqa: SIM115 (closed in stop())
        env = {**os.environ, **(PLAIN_ENV if plain else {})}
        # vLLM's own server would leave its sockets in /tmp: a directory of this process's, removed
        # when the server stops (`inference/socket_dir.py`); triad's servers make their own
        self.sockets = own_socket_dir(env) if plain else None
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_healthy(self, timeout: float = 240) -> None:
        """Wait for /health to answer 200; RuntimeError if the server exits first, TimeoutError
        (naming what it waited for) at the timeout, each with the end of the server's log."""
        try:
            wait_for(self.healthy, f"inference at {self.url} to be healthy", timeout, poll=1)
        except WaitTimeout as e:
            raise TimeoutError(f"{e}:\n{self.tail()}") from None

    def healthy(self) -> bool | None:
        """True once /health answers 200; None while not yet; RuntimeError if the server exited."""
        if self.proc.poll() is not None:
            raise RuntimeError(f"inference exited ({self.proc.returncode}):\n{self.tail()}")
        try:
            return httpx.get(self.url + "/health", timeout=2).status_code == 200 or None
        except httpx.HTTPError:
            return None

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def socket_dirs(self) -> list[Path]:
        """The directories this server's vLLM sockets are in (`inference/socket_dir.py`)."""
        return list(Path(tempfile.gettempdir()).glob(f"{SOCKET_DIR_PREFIX}{self.proc.pid}-*"))

    def kill(self) -> None:
        """kill -9 the server and every process it started (vLLM's engine core)."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self.release()

    def kill_server_alone(self, within_s: float = 10) -> None:
        """kill -9 the server's own process, as `kill -9 PID` does; AssertionError unless the
        processes vLLM started for it end within `within_s` (inference/server_children.py)."""
        started = descendants(self.proc.pid)
        assert started, "the server started no process (vLLM's engine)"
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()
        deadline = time.monotonic() + within_s
        while any(running(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in started if running(pid)]
        for pid in left:  # nothing may outlive the test
            os.kill(pid, signal.SIGKILL)
        assert not left, f"{len(left)} of the {len(started)} processes vLLM started outlived the server"

    def stop(self) -> None:
        if self.log.closed:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.release()

    def release(self) -> None:
        """Its log closed, and the directory of a plain server's sockets removed."""
        self.log.close()
        if self.sockets is not None:
            shutil.rmtree(self.sockets, ignore_errors=True)


def write_env_plugin(root: Path, package: str, entry_name: str) -> None:
    """An installed distribution under `root` (put it on sys.path / PYTHONPATH): a package with an
    environment class `Echo` and a dist-info whose entry point in `triad.environments` names it."""
    (root / package).mkdir()
    (root / package / "__init__.py").write_text(
        textwrap.dedent(
            """
            import asyncio
            from orchestrator.environments import Prompt

            class Echo:
                \"\"\"Say a digit back: '3+0=' -> '3'.\"\"\"

                def __init__(self, word="hi"):
                    self.name, self.word = "echo", word

                def sample(self, rng):
                    digit = rng.randint(0, 9)
                    return Prompt(text=f"{digit}+0=", answer=str(digit))

                async def reward(self, prompt, completion):
                    await asyncio.sleep(0)  # rewards may be coroutines
                    return float(completion.strip() == prompt.answer)
            """
        )
    )
    info = root / f"{package}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[triad.environments]\n{entry_name} = {package}:Echo\n")


VERIFIERS_ENV = '''
"""A small verifiers environment: two model turns per rollout, a rubric of two functions."""

import verifiers as vf
from datasets import Dataset


def rows(n):
    return [{"question": f"{a}*{b}+{c}=?", "answer": str(a * b + c)}
            for a, b, c in ((2 + i % 7, 3 + i % 5, i % 11) for i in range(n))]


def last_reply(completion):
    replies = [m for m in completion if m["role"] == "assistant"]
    return (replies[-1]["content"] or "") if replies else ""


def contains_answer(completion, answer):
    return 1.0 if answer in last_reply(completion) else 0.0


def brevity(completion):
    return max(0.0, 1.0 - len(last_reply(completion)) / 64)


class TwoTurns(vf.MultiTurnEnv):
    async def env_response(self, messages, state, **kwargs):
        return [vf.UserMessage(content="Again, the number only.")]


def load_environment(num_examples=12, max_turns=2):
    rubric = vf.Rubric(funcs=[contains_answer, brevity], weights=[1.0, 0.5])
    data = Dataset.from_list(rows(num_examples))
    return TwoTurns(dataset=data, eval_dataset=Dataset.from_list(rows(num_examples + 4)[-4:]),
                    rubric=rubric, max_turns=max_turns)
'''


def write_verifiers_env(root: Path, module: str) -> Path:
    """The environment above as the module `module` under `root` (put `root` on the path)."""
    path = root / f"{module}.py"
    path.write_text(VERIFIERS_ENV)
    return path


def check_reads(audit: Path) -> None:
    """Both readers (trainer, inference) opened steps, and none before its `DONE`."""
    reads = [json.loads(line) for line in audit.read_text().splitlines()]
    readers = {r["reader"] for r in reads}
    assert readers == {"trainer", "inference"}, readers
    assert all(r["done"] for r in reads), [r for r in reads if not r["done"]]
