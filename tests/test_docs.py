"""The documentation keeps up with the code.

- docs/ambientmesh-reference.md is generated from the models and must match.
- docs/troubleshooting.md explains every reason the code emits: found by
  reading the source (conditions, node verdicts, Events, webhook decisions),
  not from a list someone has to remember to update. Each reason the source
  emits is a member of the vocabulary in api/conditions.py, never a literal;
  every member is used; and the page's tables are the ones generated from it.
- The Windows matrix, the limitations and the installation guide cover what
  they promise, and every relative link resolves.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import ModuleType

import pytest

from ambient_operator.api import conditions

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "operator" / "ambient_operator"
REASON = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)*$")
# Where the reason is among a call's positional arguments: Verdict(type,
# status, reason, message), Problem(reason, message), EventRecorder.post(obj,
# type, reason, message), DataplaneController._fail(mesh, previous,
# generation, reason, message), verdicts._no(node, reason, message),
# decide._skip(reason, message), Decision(action, reason, message),
# intake.Refused(status, reason, message), server._unchanged(uid, reason,
# problem) and Webhook._malformed(uid, reason, problem).
REASON_ARGUMENT = {
    "Verdict": 2,
    "Problem": 0,
    "post": 2,
    "_no": 1,
    "_skip": 0,
    "Decision": 1,
    "inject": 0,
    "Refused": 1,
    "_unchanged": 1,
    "_malformed": 1,
}
# The condition types; every other enum of the vocabulary holds reasons.
CONDITION_TYPES: tuple[type[StrEnum], ...] = (conditions.MeshCondition, conditions.GatewayCondition)


def test_reference_is_generated_from_the_models() -> None:
    page = DOCS / "ambientmesh-reference.md"
    assert page.read_text() == generator("gen_reference").page(), (
        "docs/ambientmesh-reference.md is stale; run `.venv/bin/python hack/gen_reference.py`"
    )


def _sources() -> Iterator[tuple[Path, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if "devcluster" in path.parts:
            continue  # the test cluster, not the operator
        yield path, ast.parse(path.read_text(), str(path))


def _constants(trees: list[tuple[Path, ast.Module]]) -> dict[str, str]:
    """Module-level UPPER_CASE string constants of the whole package."""
    out: dict[str, str] = {}
    for _, tree in trees:
        for node in tree.body:
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)):
                continue
            if not isinstance(node.value.value, str):
                continue
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.isupper():
                    out[target.id] = node.value.value
    return out


def _members(trees: list[tuple[Path, ast.Module]]) -> dict[str, str]:
    """`Class.MEMBER` -> value, for the members of every StrEnum of the package."""
    out: dict[str, str] = {}
    for _, tree in trees:
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            if not any(_name(base) == "StrEnum" for base in node.bases):
                continue
            for stmt in node.body:
                if not (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)):
                    continue
                for target in stmt.targets:
                    if isinstance(target, ast.Name) and isinstance(stmt.value.value, str):
                        out[f"{node.name}.{target.id}"] = stmt.value.value
    return out


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _member_name(node: ast.expr) -> str | None:
    """`Class.MEMBER` for an attribute of a name, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return None


@dataclass(frozen=True)
class Emitted:
    """One place the source emits a reason, and how it spells it."""

    reason: str
    file: str
    line: int
    via: str  # "member" (of a StrEnum), "literal" or "constant" (a module's)


def emitted() -> list[Emitted]:
    """Every place the operator emits a reason string."""
    trees = list(_sources())
    constants = _constants(trees)
    members = _members(trees)

    # Local names given a value in the module (`reason = A if ... else B`).
    assigned: dict[str, list[ast.expr]] = {}

    def values(node: ast.expr, depth: int = 0) -> Iterator[tuple[str, str]]:
        if isinstance(node, ast.IfExp):
            yield from values(node.body, depth)
            yield from values(node.orelse, depth)
            return
        if isinstance(node, ast.Name) and node.id.islower() and depth < 3:
            for value in assigned.get(node.id, []):
                yield from values(value, depth + 1)
            return
        member = _member_name(node)
        name = _name(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text, via = node.value, "literal"
        elif member in members:
            text, via = members[member], "member"
        elif name and name.isupper() and name in constants:
            text, via = constants[name], "constant"
        else:
            return
        if REASON.match(text):
            yield text, via

    found: list[Emitted] = []

    def add(node: ast.expr, path: Path) -> None:
        for text, via in values(node):
            found.append(Emitted(text, str(path.relative_to(PACKAGE)), node.lineno, via))

    for path, tree in trees:
        assigned.clear()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id.islower():
                    assigned.setdefault(target.id, []).append(node.value)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                called = _name(node.func)
                index = REASON_ARGUMENT.get(called or "")
                if index is not None and len(node.args) > index:
                    add(node.args[index], path)
                # The same functions handed to a thread: to_thread(post, obj, type, reason, ...)
                for i, arg in enumerate(node.args):
                    passed = REASON_ARGUMENT.get(_name(arg) or "")
                    if passed is not None and len(node.args) > i + 1 + passed:
                        add(node.args[i + 1 + passed], path)
            # (reason, message) pairs: namespace problems, node verdicts, waypoint warnings.
            pairs: list[ast.expr] = []
            if isinstance(node, ast.List):
                pairs = list(node.elts)
            elif isinstance(node, ast.Call) and _name(node.func) == "append":
                pairs = list(node.args)
            elif isinstance(node, ast.Return) and node.value is not None:
                pairs = [node.value]
            for pair in pairs:
                if isinstance(pair, ast.Tuple) and len(pair.elts) == 2:
                    add(pair.elts[0], path)
    return found


def emitted_reasons() -> dict[str, set[str]]:
    """Every reason string the operator can emit, with the files it comes from."""
    found: dict[str, set[str]] = {}
    for item in emitted():
        found.setdefault(item.reason, set()).add(Path(item.file).name)
    return found


def test_the_reason_scan_sees_every_kind_of_reason() -> None:
    found = emitted_reasons()
    for reason in (
        "Reconciled",  # condition
        "UnsupportedNodes",  # Problem
        "WindowsBuildUnsupported",  # node verdict, returned as a (reason, message) pair
        "InvalidDataplaneMode",  # (reason, message) pair appended to a list
        "WaypointOnWindows",  # EventRecorder.post handed to a thread
        "RedirectionWaitMissing",  # the same, from the webhook
        "PinnedToPreWS2025Build",  # webhook decision
        "ListenersNotValid",  # Gateway condition
        "GatewayClassNotApplied",  # one branch of a conditional expression
        "NotJSON",  # a refused webhook request
        "MalformedPod",  # a webhook request answered with a warning
    ):
        assert reason in found, reason
    assert len(found) >= 60


def _vocabulary() -> dict[str, set[str]]:
    """Each value of the vocabulary, with the enums it is a member of."""
    out: dict[str, set[str]] = {}
    for enum in conditions.VOCABULARY:
        for member in enum:
            out.setdefault(member.value, set()).add(enum.__name__)
    return out


def test_the_code_emits_reasons_only_from_the_vocabulary() -> None:
    """A reason is written once, in api/conditions.py: no literal, no constant of its own."""
    vocabulary = _vocabulary()
    spelled_out = sorted(
        f"{e.file}:{e.line}: {e.reason} ({e.via})" for e in emitted() if e.via != "member"
    )
    assert not spelled_out, f"use a member of api/conditions.py instead: {spelled_out}"
    unknown = sorted({e.reason for e in emitted()} - vocabulary.keys())
    assert not unknown, unknown


def test_every_member_of_the_vocabulary_is_used() -> None:
    """A reason nobody writes is not worth explaining (nor a type nobody sets)."""
    used: set[str] = set()
    for path, tree in _sources():
        if path == PACKAGE / "api" / "conditions.py":
            continue
        used |= {name for node in ast.walk(tree) if (name := _member_name(node)) is not None}
    unused = [
        f"{enum.__name__}.{member.name}"
        for enum in conditions.VOCABULARY
        for member in enum
        if f"{enum.__name__}.{member.name}" not in used
    ]
    assert not unused, f"members no module of the operator uses: {unused}"
    assert len(used) > 60  # the walk saw the package


def test_the_vocabulary_is_every_strenum_of_the_package() -> None:
    declared = {key.split(".")[0] for key in _members(list(_sources()))}
    assert declared == {enum.__name__ for enum in conditions.VOCABULARY}


def test_every_member_of_the_vocabulary_is_explained() -> None:
    """In a table row of api/conditions.py, and on the committed page itself."""
    page = (DOCS / "troubleshooting.md").read_text()
    documented = set(re.findall(r"`([A-Z][A-Za-z0-9]+)`", page))
    rows = {
        (type(row.reason), row.reason)
        for table in conditions.TROUBLESHOOTING_TABLES
        for row in table.rows
    }
    for enum in conditions.VOCABULARY:
        for member in enum:
            if enum in CONDITION_TYPES:
                assert re.search(rf"\b{member.value}=(True|False)\b", page), member
                continue
            assert (enum, member) in rows, f"no table row explains {enum.__name__}.{member.name}"
            assert member.value in documented, member.value


def generator(name: str = "gen_troubleshooting") -> ModuleType:
    """One of the hack/gen_*.py scripts, imported."""
    path = ROOT / "hack" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"{path} cannot be imported"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_troubleshooting_tables_are_generated_from_the_vocabulary() -> None:
    page = (DOCS / "troubleshooting.md").read_text(encoding="utf-8")
    assert generator().rewrite(page) == page, (
        "the tables of docs/troubleshooting.md are stale; run `make docs` "
        "(or `.venv/bin/python hack/gen_troubleshooting.py`)"
    )
    blocks = re.findall(r"<!-- generated: reasons ([a-z-]+)", page)
    assert blocks == [t.name for t in conditions.TROUBLESHOOTING_TABLES]


def test_the_table_generator_keeps_the_hand_written_page() -> None:
    tool = generator()
    table = conditions.Table(
        "t",
        (("Reason", "reason"), ("Meaning", "meaning")),
        (conditions.Row(conditions.PodEvent.REDIRECTION_WAIT_MISSING, "m", note="n"),),
    )
    end = "<!-- end generated: reasons t -->"
    page = f"# Title\n\nby hand\n\n{tool.begin_marker('t')}\nold\n{end}\n\nend\n"
    assert tool.rewrite(page, [table]) == (
        f"# Title\n\nby hand\n\n{tool.begin_marker('t')}\n\n"
        "| Reason | Meaning |\n|---|---|\n| `RedirectionWaitMissing`, n | m |\n\n"
        f"{end}\n\nend\n"
    )
    with pytest.raises(ValueError, match="without markers"):
        tool.rewrite("# no markers\n", [table])
    with pytest.raises(ValueError, match="unknown table"):
        tool.rewrite(page, [])


def test_troubleshooting_explains_every_reason() -> None:
    page = (DOCS / "troubleshooting.md").read_text()
    documented = set(re.findall(r"`([A-Z][A-Za-z0-9]+)`", page))
    missing = {
        reason: sorted(files)
        for reason, files in emitted_reasons().items()
        if reason not in documented
    }
    assert not missing, f"add these reasons to docs/troubleshooting.md: {missing}"


FEATURES = [
    "agents",
    "hostprocess",
    "hns redirection",
    "new-pod workaround",
    "waypoints",
    "probe",
    "source ip",
    "dns proxy",
    "architectures",
]


def test_windows_support_matrix() -> None:
    text = (DOCS / "windows-support.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    assert [h.split()[0] for h in header[1:]] == ["WS2019", "WS2022", "WS2025"]
    features = [row.strip("|").split("|")[0].strip().lower() for row in rows[2:]]
    for feature in FEATURES:
        assert any(feature in f for f in features), f"no matrix row for {feature}"
    for row in rows[2:]:
        assert len(row.strip("|").split("|")) == 4, row
    waypoints = next(r for r in rows if r.lower().startswith("| waypoints"))
    assert waypoints.count("Never on Windows") == 3


def test_limitations_cover_the_known_windows_limitations() -> None:
    text = (DOCS / "limitations.md").read_text().lower()
    for limitation in ("probe exclusion", "source ip", "dns proxying", "amd64 only"):
        assert limitation in text, limitation
    assert "cannot verify" in text
    assert "kwok" in text


def test_installation_covers_helm_and_kubectl() -> None:
    text = (DOCS / "installation.md").read_text()
    assert "helm install ambient-operator charts/ambient-operator" in text
    assert "kubectl apply --server-side -f crds/" in text
    # Uninstalling has a page of its own, which installation.md links.
    assert "(uninstall.md)" in text
    uninstall = (DOCS / "uninstall.md").read_text()
    assert "kubectl delete mutatingwebhookconfiguration ambient-operator" in uninstall


def test_architecture_picture_exists() -> None:
    text = (DOCS / "architecture.md").read_text()
    assert "![" in text and "(architecture.png)" in text
    assert (DOCS / "architecture.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (ROOT / "hack" / "gen_architecture.py").exists()


def _slug(heading: str) -> str:
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    return {
        _slug(line.lstrip("#"))
        for line in path.read_text().splitlines()
        if line.startswith("#") and not line.startswith("#!")
    }


@pytest.mark.parametrize(
    "page", [*sorted(DOCS.glob("*.md")), ROOT / "README.md"], ids=lambda p: p.name
)
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: regular expressions, not links
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        assert linked.exists(), f"{page.name}: broken link {target}"
        if anchor and linked.suffix == ".md":
            assert anchor in _anchors(linked), f"{page.name}: no heading for {target}"
