"""Only the applier (apply/writer.py) and the status writer (status/writer.py) write.

Every request that changes the cluster leaves the operator through
`Kube`'s write methods, or `Kube.request` with a method other than GET.
This test reads every module's source and fails on any use of them outside
the two writers: a call, or a method handed on (to `asyncio.to_thread`, say).
kube/client.py, which defines them, is the only other place they appear.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "ambient_operator"
WRITERS = {"apply/writer.py", "status/writer.py"}
DEFINES = "kube/client.py"
# Kube's methods that send a write request.
WRITE_METHODS = {"create", "apply", "apply_status", "merge_patch", "delete"}
READ_METHOD = "GET"


def _is_kube(node: ast.expr) -> bool:
    """`kube`, `self.kube`, `self._kube`: how every module names its Kube."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.lstrip("_") == "kube"


def write_uses(source: str) -> list[str]:
    """Each use of a write method of a Kube in `source`, as `line: code`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in WRITE_METHODS and _is_kube(node.value):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "request"
            and _is_kube(node.func.value)
        ):
            method = node.args[0] if node.args else None
            if not (isinstance(method, ast.Constant) and method.value == READ_METHOD):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize(
    ("source", "uses"),
    [
        ("self.kube.apply(obj)", 1),
        ("await asyncio.to_thread(self.kube.apply_status, body)", 1),
        ("kube.delete(kind, name, uid=uid)", 1),
        ("self._kube.merge_patch(kind, name, None, {})", 1),
        ('self.kube.request("PUT", path, body=lease)', 1),
        ("self.kube.request(method, path)", 1),
        ('self.kube.request("GET", path)', 0),
        ("self.kube.get(kind, name)", 0),
        ("asyncio.create_task(loop())", 0),
        ("cache.delete(key)", 0),
    ],
)
def test_the_scan_sees_writes(source: str, uses: int) -> None:
    assert len(write_uses(source)) == uses


def test_no_module_but_the_two_writers_writes() -> None:
    modules = sorted(PACKAGE.rglob("*.py"))
    assert len(modules) > 40
    wrong = {}
    seen_in_writers = 0
    for path in modules:
        where = path.relative_to(PACKAGE).as_posix()
        uses = write_uses(path.read_text())
        if where in WRITERS:
            seen_in_writers += len(uses)
        elif where != DEFINES and uses:
            wrong[where] = uses
    assert wrong == {}
    # The writers are where the writes went, not a scan that sees nothing.
    assert seen_in_writers >= 5
