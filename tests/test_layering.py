"""The package's layering: no import cycle inside edgetune, and dependencies point one way
(cli -> search / runtime -> predictors, power, workloads; power knows nothing of tuning)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "edgetune"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """edgetune modules imported by ``path`` at run time (imports under ``if TYPE_CHECKING:`` excluded)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("edgetune"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgetune"):
            found.add(node.module)
    return found


GRAPH = {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str:
    """A module imported by name, or the package holding a re-exported name."""
    while name not in GRAPH and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


def _top_level_edges() -> dict[str, set[str]]:
    """Module -> modules imported at import time, module-level only (function-local imports are lazy)."""
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        found: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("edgetune"):
                found.add(_resolve(node.module))
            elif isinstance(node, ast.Import):
                found.update(_resolve(a.name) for a in node.names if a.name.startswith("edgetune"))
        edges[_module_name(path)] = found
    return edges


def test_no_import_cycle_between_modules():
    edges = _top_level_edges()
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            # a package importing its own submodules (re-exports) is not a cycle
            if m != "edgetune" and (n.startswith(m + ".") or m.startswith(n + ".") and n != "edgetune"):
                continue
            if n == "edgetune":
                continue
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)


# (layer, layers it may import besides itself, edgetune.log and the registry of knobs)
RULES = {
    # power/trace.py replays a measurement table: tables is data only and imports just the knob registry
    "edgetune.power": ("edgetune.power", "edgetune.tables"),
    "edgetune.predictors": ("edgetune.predictors", "edgetune.tables"),
    "edgetune.tables": ("edgetune.tables", "edgetune.power.knobs", "edgetune.power.base"),
    "edgetune.workloads": ("edgetune.workloads", "edgetune.power.base", "edgetune.power.knobs"),
    "edgetune.config": ("edgetune.config", "edgetune.power.knobs", "edgetune.power.base"),
    "edgetune.runtime": ("edgetune.runtime", "edgetune.power", "edgetune.predictors", "edgetune.workloads",
                         "edgetune.tables"),
    "edgetune.search": ("edgetune.search", "edgetune.power", "edgetune.predictors", "edgetune.workloads",
                        "edgetune.tables"),
}


@pytest.mark.parametrize("layer", sorted(RULES))
def test_dependencies_point_one_way(layer):
    allowed = RULES[layer] + ("edgetune.log",)
    wrong = {
        f"{module} imports {imported}"
        for module, imports in GRAPH.items()
        if module == layer or module.startswith(layer + ".")
        for imported in imports
        if not any(imported == a or imported.startswith(a + ".") for a in allowed)
    }
    assert not wrong, sorted(wrong)


def test_nothing_imports_cli():
    assert not [m for m, imports in GRAPH.items() if not m.startswith("edgetune.cli")
                and any(i.startswith("edgetune.cli") for i in imports) and m != "edgetune.__main__"]
