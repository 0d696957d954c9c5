"""The package's layout is its data flow: no import circle, no import upwards.

Layers, lowest first (docs/architecture.md describes each). A module may
import its own package and any lower layer; packages that share a layer
(the controllers and the webhook) may not import each other. Imports inside
functions and under TYPE_CHECKING count: they are dependencies all the same.

The graph is read from the source with `ast`, so this test imports nothing
of the operator; the expected layer of each package is written here, not
taken from the code.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "ambient_operator"
ROOT = "ambient_operator"

LAYERS: list[set[str]] = [
    {"", "api"},  # the package root holds only its docstring
    {"kube"},
    {"cluster"},
    {"render"},
    {"apply"},
    {"status"},
    {"runtime"},
    {"controllers", "webhook"},
    {"app"},
    {"cli"},
]
RANK = {pkg: rank for rank, pkgs in enumerate(LAYERS) for pkg in pkgs}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    assert len(found) > 40, found  # the walk found the package, not an empty folder
    return found


def _imports(path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """The operator's modules that `path` imports, resolved to modules (not names in them)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == ROOT:
                    yield alias.name
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            if node.module is None or node.module.split(".")[0] != ROOT:
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield full if full in modules else node.module


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set(_imports(path, modules)) - {name}
        unknown = deps - modules.keys()
        assert not unknown, f"{name} imports {unknown}, which are not modules of the package"
        graph[name] = deps
    return graph


def test_every_package_has_a_layer() -> None:
    packages = {_package(m) for m in _modules()}
    assert packages - RANK.keys() == set(), "a new package needs a layer in this test"
    assert RANK.keys() - packages == set(), "a layer names a package that is gone"


def test_no_module_imports_a_layer_above_or_beside_it() -> None:
    wrong = []
    for module, deps in sorted(_graph().items()):
        mine = _package(module)
        for dep in sorted(deps):
            theirs = _package(dep)
            if theirs == mine:
                continue
            if RANK[theirs] > RANK[mine]:
                wrong.append(f"{module} imports {dep}, a layer above ({theirs} over {mine})")
            elif RANK[theirs] == RANK[mine]:
                wrong.append(f"{module} imports {dep}, a package beside it in its layer")
    assert wrong == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports, or None. Depth-first search with colours."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        colour[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if colour.get(dep) == 1:
                return [*stack[stack.index(dep) :], dep]
            if dep not in colour:
                found = visit(dep)
                if found:
                    return found
        stack.pop()
        colour[node] = 2
        return None

    for node in sorted(graph):
        if node not in colour:
            found = visit(node)
            if found:
                return found
    return None


def test_the_import_graph_has_no_circle() -> None:
    assert _cycle(_graph()) is None


@pytest.mark.parametrize(
    ("graph", "circle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, True),
        ({"a": {"a2"}, "a2": {"b"}, "b": {"a2"}}, True),
        ({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}, False),
    ],
)
def test_the_circle_finder_finds_circles(graph: dict[str, set[str]], circle: bool) -> None:
    assert (_cycle(graph) is not None) == circle


def test_the_shipped_package_holds_no_dev_cluster() -> None:
    # The local cluster is a development tool (hack/devcluster), not part of the wheel.
    assert not (PACKAGE / "devcluster").exists()
    assert not [m for m in _modules() if "devcluster" in m]


# A controller is thin (gather facts, render, apply, status): one that outgrows
# this has grown a decision that belongs to a lower layer, or steps that want a
# module of their own.
CONTROLLER_LINES = 400


def test_no_controller_module_is_over_400_lines() -> None:
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in sorted((PACKAGE / "controllers").rglob("*.py"))
    }
    assert "controllers/dataplane.py" in sizes  # the walk found the controllers
    over = {name: lines for name, lines in sizes.items() if lines > CONTROLLER_LINES}
    assert over == {}
