"""Rules of the code base, measured on the source with `ast`.

- Run-directory file names are defined in the `shared/rundir/` package alone: no other code (tests and
  benchmarks included) spells one in a string; documentation (docstrings, comments) may.
- No function longer than 60 lines and no class longer than 200, outside tests and `bench/`.
- No import circles among the project's modules (imports at module level or inside functions,
  `TYPE_CHECKING` aside; importing `a.b.c` imports the packages `a` and `a.b` too).
- Each service reads its own table: no module under `inference/` or `trainer/` reads
  `.orchestrator`, and none under `orchestrator/` or `trainer/` reads a launcher option of
  `[inference]` (every key but the server's address, its token and what describes the server the
  orchestrator talks to: `SERVER_KEYS`), directly or through a name bound to `.inference`.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

from shared.config import InferenceConfig
from tests.helpers import REPO

OWNER = "shared/rundir/"  # the package (its names.py spells them; the rest builds paths)
THIS = "tests/unit/test_code_rules.py"  # names the names it looks for
# run-directory names: file names matched anywhere in a string, directory names as whole strings
NAMES_IN = ("DONE", "batch.parquet", "model.safetensors", "run.json", "plot.png", "SEND_READY")
WHOLE_NAMES = ("rollouts", "weights", "checkpoints", "logs", "tensorboard", "RECEIVING", "FALLBACK", "fleet")
WHOLE_NAMES += ("live",)
ALLOWED = {
    ("services/exporters.py", "tensorboard"),  # the package's name, not a directory
    ("tests/containers.py", "logs"),  # docker-compose's subcommand
    ("tests/fake_openai.py", "data: [DONE]\n\n"),  # the end of an OpenAI event stream
}
STEP_DIR = re.compile(r"(^|/)step_(\d|$)")
MAX_FUNCTION_LINES, MAX_CLASS_LINES = 60, 200
PACKAGES = ("shared", "inference", "orchestrator", "trainer", "services", "simulate")


def python_files() -> list[Path]:
    """The repository's tracked and untracked-but-not-ignored Python files."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
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
        if rel.startswith(OWNER) or rel == THIS:
            continue
        for line, text in literal_pieces(ast.parse(path.read_text(), rel)):
            if (rel, text) not in ALLOWED:
                offences += [f"{rel}:{line}: {name!r} in {text!r}" for name in names_in(text)]
    assert not offences, "run-directory names outside shared/rundir/:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    "text, found",
    [
        ("DONE", ["DONE"]),
        ("x/batch.parquet", ["batch.parquet"]),
        ("step_{}", ["step_"]),
        ("weights/step_000003", ["weights", "step_"]),
        ("rollouts", ["rollouts"]),
        ("step_time_s", []),
        ("reward_mean", []),
        ("the weights are loaded", []),
        ("logs are here", []),
    ],
)
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


def module_name(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the statements under `if TYPE_CHECKING:`, which never run."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            found.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return found


def module_imports(tree: ast.Module, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The project modules `name` imports, at module level or inside a function (a deferred
    import is still a dependency: deferring it only hides a circle), each with the packages
    above it; imports under `if TYPE_CHECKING:` aside."""
    package = name if is_package else name.rpartition(".")[0]
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    skipped = type_checking_only(tree)
    found: set[str] = set()

    def add(target: str) -> None:
        """`target` and the packages above it, but not this module's own packages: they are
        imported (or being imported) before it runs."""
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in known and prefix not in ancestors:
                found.add(prefix)

    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            add(base)
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    add(f"{base}.{alias.name}")  # `from package import module`
                elif base in ancestors:
                    found.add(base)  # a name from its own package's __init__: needs it done
    found.discard(name)
    return found


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, from {relative path: source}."""
    names = {module_name(rel): rel for rel in sources}
    known = set(names)
    return {
        name: module_imports(ast.parse(sources[rel], rel), name, rel.endswith("__init__.py"), known)
        for name, rel in names.items()
    }


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_no_import_circles():
    sources = {}
    for path in python_files():
        rel = path.relative_to(REPO).as_posix()
        if rel.split("/")[0] in PACKAGES:
            sources[rel] = path.read_text()
    found = circles(import_graph(sources))
    assert not found, "import circles (module-level imports):\n" + "\n".join(
        " <-> ".join(sorted(c)) for c in found
    )


def test_the_circle_rule_finds_a_circle_in_a_small_package():
    sources = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import thing\n",
        "pkg/b.py": "from typing import TYPE_CHECKING\nimport pkg.sub.c\n"
        "if TYPE_CHECKING:\n    import pkg.d\n",
        "pkg/sub/__init__.py": "from . import c\n",
        "pkg/sub/c.py": "from .. import a\n",
        "pkg/d.py": "import pkg.b\n",
    }
    graph = import_graph(sources)
    assert graph["pkg.b"] == {"pkg.sub", "pkg.sub.c"}  # not pkg.d: only for type checking
    assert graph["pkg.sub.c"] == {"pkg.a"}
    assert circles(graph) == [{"pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"}]
    sources["pkg/sub/c.py"] = "from pkg.sub import helper\n"  # its own package: already importing
    assert import_graph(sources)["pkg.sub.c"] == {"pkg.sub"} and circles(import_graph(sources)) == [
        {"pkg.sub", "pkg.sub.c"}  # the package's name `helper` may not exist yet: a real circle
    ]
    sources["pkg/sub/c.py"] = "import pkg.sub.e\nfrom pkg.sub.e import f\n"  # a sibling, by its full name
    sources["pkg/sub/e.py"] = "f = 1\n"
    assert import_graph(sources)["pkg.sub.c"] == {"pkg.sub.e"} and circles(import_graph(sources)) == []
    sources["pkg/sub/e.py"] = "def late():\n    from pkg.b import thing\n"  # deferred: still a circle
    assert circles(import_graph(sources)) == [{"pkg.b", "pkg.sub", "pkg.sub.c", "pkg.sub.e"}]


SERVER_KEYS = {  # what describes the server others talk to: its address, token, weights and parsers
    "host",
    "port",
    "admin_token",
    "admin_token_file",
    "token",
    "backend",
    "tool_parser",
    "reasoning_parser",
    "dtype",  # the dtype it serves: the trainer publishes in it (`weights.dtype = "auto"`)
}
LAUNCHER_KEYS = set(InferenceConfig.model_fields) - SERVER_KEYS  # how `triad inference` starts vLLM


def foreign_reads(tree: ast.AST, rel: str) -> list[str]:
    """Where a module reads a table that is not its service's: `.orchestrator` under inference/ and
    trainer/, a launcher option of `[inference]` under orchestrator/ and trainer/."""
    service = rel.split("/")[0]
    found = []
    if service in ("inference", "trainer"):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "orchestrator":
                found.append(f"{rel}:{node.lineno}: reads .orchestrator")
    if service in ("orchestrator", "trainer"):
        aliases = {  # `ic = cfg.inference`
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "inference"
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr in LAUNCHER_KEYS):
                continue
            table = node.value
            if (isinstance(table, ast.Attribute) and table.attr == "inference") or (
                isinstance(table, ast.Name) and table.id in aliases
            ):
                found.append(f"{rel}:{node.lineno}: reads inference.{node.attr}")
    return found


def test_each_service_reads_its_own_table():
    offences = []
    for path in python_files():
        rel = path.relative_to(REPO).as_posix()
        if rel.split("/")[0] in ("inference", "orchestrator", "trainer"):
            offences += foreign_reads(ast.parse(path.read_text(), rel), rel)
    assert not offences, "a service reads another's config:\n" + "\n".join(offences)


def test_the_table_rule_finds_planted_reads():
    assert {
        "kv_cache_gib",
        "gpu_memory_utilization",
        "devices",
        "cpus",
        "enforce_eager",
        "vllm_args",
    } < LAUNCHER_KEYS
    assert {"max_model_len", "kv_cache_gib", "adapter_idle_s", "advertise_url"} < LAUNCHER_KEYS
    planted = {
        "inference/a.py": "def f(cfg):\n    return cfg.orchestrator.environment, cfg.inference.vllm_args\n",
        "trainer/b.py": "def g(self):\n    ic = self.cfg.inference\n    return ic.kv_cache_gib, ic.port\n",
        "orchestrator/c.py": "def h(cfg, c):\n    x = cfg.inference.devices\n"
        "    return cfg.inference.token(), cfg.inference.backend, c.max_model_len, cfg.trainer.cpus\n",
        "services/d.py": "def k(cfg):\n    return cfg.orchestrator, cfg.inference.cpus\n",  # the top floor
    }
    found = [line for rel, source in planted.items() for line in foreign_reads(ast.parse(source), rel)]
    assert found == [
        "inference/a.py:2: reads .orchestrator",
        "trainer/b.py:3: reads inference.kv_cache_gib",
        "orchestrator/c.py:2: reads inference.devices",
    ]
