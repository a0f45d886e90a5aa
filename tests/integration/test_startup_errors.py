"""A service's one-line start-up error reaches the user of `triad up` as that line."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.config import TIED_LM_HEAD
from tests.helpers import free_port, processes_mentioning, run_triad

pytestmark = pytest.mark.integration


def test_the_orchestrator_s_error_line_is_what_up_prints(tmp_path: Path, tiny_model: str) -> None:
    run_dir = tmp_path / "run"
    sets = [f"run_dir={run_dir}", f"inference.port={free_port()}", "orchestrator.env=nosuch"]
    out = run_triad("up", *[f"--set={s}" for s in sets], timeout=300)
    assert out.returncode == 2, out.stderr
    error = out.stderr.strip().splitlines()
    assert error[-1].startswith("triad up: error: orchestrator: unknown environment 'nosuch': not a built-in")
    assert error[-1].endswith(f"(exit code 2; log: {run_dir}/logs/orchestrator.log)")
    assert "Traceback" not in out.stderr + out.stdout
    assert processes_mentioning(str(run_dir)) == [], "a service outlived triad up"


def test_an_adapter_on_the_tied_default_s_lm_head_is_refused_before_launch(tmp_path: Path, tiny_model: str):
    run_dir = tmp_path / "run"
    sets = [f"run_dir={run_dir}", "trainer.lora.rank=8", 'trainer.lora.target_modules=["lm_head"]']
    out = run_triad("up", *[f"--set={s}" for s in sets])
    assert out.returncode == 2 and out.stderr == f"triad up: error: {TIED_LM_HEAD}\n"
    assert not (run_dir / "logs").exists(), "a service was started"
