"""pyproject.toml declares every third-party package edgetune imports."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 only
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_every_imported_package_is_declared():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = _names(project["dependencies"])
    optional = set().union(*(_names(v) for v in project["optional-dependencies"].values()))
    imported: dict[str, set[str]] = {}  # top-level module -> files importing it
    for path in (REPO / "edgetune").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                       [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for module in modules:
                imported.setdefault(module.split(".")[0], set()).add(path.name)
    owners = packages_distributions()
    missing = []
    for module, files in sorted(imported.items()):
        if module in sys.stdlib_module_names or module == "edgetune" or module not in owners:
            continue  # the standard library, edgetune itself, or not installed here (an optional extra)
        dists = {d.lower().replace("_", "-") for d in owners[module]}
        if not dists & (required | optional):
            missing.append(f"{module} ({', '.join(sorted(dists))}; imported by {', '.join(sorted(files))})")
    assert not missing
