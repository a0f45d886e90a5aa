"""Optional libraries behind environments: a missing one is a one-line error naming its extra."""

from __future__ import annotations

import importlib
from types import ModuleType

from shared.errors import TriadError


def require(module: str, package: str, extra: str, needed_by: str) -> ModuleType:
    """`module` imported, or a TriadError saying which extra of triad installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TriadError(
            f"{needed_by} needs the package {package!r}, which is not importable ({e}): "
            f"pip install 'triad[{extra}]'"
        ) from None
