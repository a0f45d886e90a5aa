"""Rules of the code base, measured on the source with `ast`.

- Run-directory file names are defined in `shared/rundir.py` alone: no other code (tests and
  benchmarks included) spells one in a string; documentation (docstrings, comments) may.
- No function longer than 60 lines and no class longer than 200, outside tests and `bench/`.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO

OWNER = "shared/rundir.py"
THIS = "tests/unit/test_code_rules.py"  # names the names it looks for
# run-directory names: file names matched anywhere in a string, directory names as whole strings
NAMES_IN = ("DONE", "batch.parquet", "model.safetensors", "run.json", "plot.png", "SEND_READY")
WHOLE_NAMES = ("rollouts", "weights", "checkpoints", "logs", "tensorboard", "RECEIVING", "FALLBACK", "fleet")
ALLOWED = {
    ("services/exporters.py", "tensorboard"),  # the package's name, not a directory
    ("tests/containers.py", "logs"),  # docker-compose's subcommand
}
STEP_DIR = re.compile(r"(^|/)step_(\d|$)")
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 60, 200


def python_files() -> list[Path]:
    """The repository's tracked and untracked-but-not-ignored Python files."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [REPO / line for line in out.splitlines() if (REPO / line).is_file()]


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def literal_pieces(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every string literal and literal part of an f-string, docstrings aside.
    An f-string's literal parts are joined with a marker where a value goes, so that
    `f"step_{n:06d}"` reads as `step_{}`."""
    skip = docstrings(tree)
    pieces = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
            pieces.append((node.lineno, "".join(str(p) for p in parts)))
            skip.update(id(v) for v in node.values)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            pieces.append((node.lineno, node.value))
    return pieces


def names_in(text: str) -> list[str]:
    found = [n for n in NAMES_IN if n in text]
    found += [n for n in WHOLE_NAMES if text == n or text.startswith(n + "/")]
    if STEP_DIR.search(text.replace("{}", "0")):
        found.append("step_")
    return found


def test_run_directory_names_live_in_rundir_only():
    offences = []
    for path in python_files():
        rel = path.relative_to(REPO).as_posix()
        if rel in (OWNER, THIS):
            continue
        for line, text in literal_pieces(ast.parse(path.read_text(), rel)):
            if (rel, text) not in ALLOWED:
                offences += [f"{rel}:{line}: {name!r} in {text!r}" for name in names_in(text)]
    assert not offences, "run-directory names outside shared/rundir.py:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    "text, found",
    [
        ("DONE", ["DONE"]), ("x/batch.parquet", ["batch.parquet"]), ("step_{}", ["step_"]),
        ("weights/step_000003", ["weights", "step_"]), ("rollouts", ["rollouts"]),
        ("step_time_s", []), ("reward_mean", []), ("the weights are loaded", []), ("logs are here", []),
    ],
)  # fmt: skip
def test_the_name_rule_finds_names_not_words(text, found):
    assert sorted(names_in(text)) == sorted(found)


def sizes(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(kind, qualified name, lines) of every function and class."""
    out = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                name = prefix + child.name
                out.append((kind, name, child.end_lineno - child.lineno + 1))
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def test_no_long_functions_or_classes():
    limits = {"function": MAX_FUNCTION_LINES, "class": MAX_CLASS_LINES}
    offences = []
    for path in python_files():
        rel = path.relative_to(REPO).as_posix()
        if rel.startswith(("tests/", "bench/")):
            continue
        for kind, name, lines in sizes(ast.parse(path.read_text(), rel)):
            if lines > limits[kind]:
                offences.append(f"{rel}: {kind} {name} has {lines} lines (at most {limits[kind]})")
    assert not offences, "\n".join(offences)


def test_the_size_rule_measures_nested_definitions():
    tree = ast.parse("class A:\n    def f(self):\n        x = 1\n        return x\n")
    assert sizes(tree) == [("class", "A", 4), ("function", "A.f", 3)]
