"""triad's log lines survive a library that silences the root logger (`shared/logs.py`)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from shared.logs import restore_root_levels, root_levels, setup_logging
from tests.helpers import REPO

# What the inference process does: set up logging, then vLLM imports (while building its app)
# a dependency that sets the root logger and its handlers to ERROR.
INFERENCE_LIKE = """
import logging
from shared.logs import restore_root_levels, root_levels, setup_logging
setup_logging()
saved = root_levels()
import model_hosting_container_standards.logging_config
print("root level after the import:", logging.getLevelName(logging.getLogger().level), flush=True)
logging.getLogger("triad.store").warning("waiting for object store s3://b/run (reading x)")
logging.getLogger("triad.inference").info("serving weights version 3")
logging.getLogger("other").warning("hidden while the root is at ERROR")
restore_root_levels(saved)
logging.getLogger("other").warning("a library's warning, shown again")
"""


def test_triad_lines_survive_the_dependency_that_silences_the_root_logger():
    pytest.importorskip("model_hosting_container_standards")
    out = subprocess.run(
        [sys.executable, "-c", INFERENCE_LIKE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr
    assert "root level after the import: ERROR" in out.stdout  # the problem is real
    assert "triad.store WARNING: waiting for object store s3://b/run (reading x)" in out.stderr
    assert "triad.inference INFO: serving weights version 3" in out.stderr
    assert "hidden while the root is at ERROR" not in out.stderr
    assert "triad.logs INFO: restoring the root log level INFO (a library set it to ERROR)" in out.stderr
    assert "other WARNING: a library's warning, shown again" in out.stderr


def test_triad_lines_are_written_once(capsys):
    root, triad = logging.getLogger(), logging.getLogger("triad")
    saved, handlers, propagate = root_levels(), list(triad.handlers), triad.propagate
    try:
        setup_logging()
        setup_logging()  # again: still one handler
        root.setLevel(logging.ERROR)
        logging.getLogger("triad.orchestrator").info("waiting for batch 4")
        err = capsys.readouterr().err
        assert err.count("triad.orchestrator INFO: waiting for batch 4") == 1, err
    finally:
        restore_root_levels(saved)
        triad.handlers[:], triad.propagate = handlers, propagate  # caplog listens at the root
        triad.setLevel(logging.NOTSET)
