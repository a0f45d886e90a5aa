"""Every bench script imports: a refactor that moves a function a bench uses breaks the bench
where nobody runs it until the next measurement (bench/floor.py imported a function that had moved
to tests/reference.py, and `bench/quick.py` stopped at its first round)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCH.glob("*.py") if p.stem != "__init__"))
def test_bench_script_imports(name: str):
    module = importlib.import_module(f"bench.{name}")
    assert module.__doc__, f"bench/{name}.py says what it measures in its docstring"
