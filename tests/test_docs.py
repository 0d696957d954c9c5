"""The documentation keeps up with the code.

- docs/ambientmesh-reference.md is generated from the models and must match.
- docs/troubleshooting.md explains every reason the code emits: found by
  reading the source (conditions, node verdicts, Events, webhook decisions),
  not from a list someone has to remember to update.
- The Windows matrix, the limitations and the installation guide cover what
  they promise, and every relative link resolves.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambient_operator.api.reference import reference_markdown

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PACKAGE = ROOT / "operator" / "ambient_operator"
REASON = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)*$")
# Where the reason is among a call's positional arguments: Verdict(type,
# status, reason, message), Problem(reason, message), EventRecorder.post(obj,
# type, reason, message), DataplaneController._fail(mesh, previous,
# generation, reason, message), verdicts._no(node, reason, message),
# decide._skip(reason, message), Decision(action, reason, message).
REASON_ARGUMENT = {
    "Verdict": 2,
    "Problem": 0,
    "post": 2,
    "_fail": 3,
    "_no": 1,
    "_skip": 0,
    "Decision": 1,
}


def test_reference_is_generated_from_the_models() -> None:
    page = DOCS / "ambientmesh-reference.md"
    assert page.read_text() == reference_markdown(), (
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


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def emitted_reasons() -> dict[str, set[str]]:
    """Every reason string the operator can emit, with the files it comes from."""
    trees = list(_sources())
    constants = _constants(trees)

    def value(node: ast.expr) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            name = _name(node)
            text = constants.get(name or "") if name and name.isupper() else None
        return text if text and REASON.match(text) else None

    found: dict[str, set[str]] = {}

    def add(node: ast.expr, path: Path) -> None:
        text = value(node)
        if text:
            found.setdefault(text, set()).add(path.name)

    for path, tree in trees:
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


def test_the_reason_scan_sees_every_kind_of_reason() -> None:
    found = emitted_reasons()
    for reason in (
        "Reconciled",  # condition, literal
        "UnsupportedNodes",  # Problem
        "WindowsBuildUnsupported",  # node verdict, through a constant
        "InvalidDataplaneMode",  # (reason, message) pair
        "WaypointOnWindows",  # EventRecorder.post handed to a thread
        "RedirectionWaitMissing",  # module constant handed to a thread
        "PinnedToPreWS2025Build",  # webhook decision
        "ListenersNotValid",  # Gateway condition
    ):
        assert reason in found, reason
    assert len(found) >= 45


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
    assert "kubectl delete mutatingwebhookconfiguration ambient-operator" in text


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
