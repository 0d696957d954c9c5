"""Istio's chart values, value by value, judged by Istio's own charts through the real `helm`.

Every value of the pinned `ztunnel` and `istio-cni` charts (each leaf of
their values.yaml, and each `.Values` path their templates read) must be an
entry of operator/ambient_operator/api/helm_values.py: carried to an
AmbientMesh field, or fixed with a reason. A value that a pin bump brings in
fails here by name.

For each carried value, a literal values file (tests/data/helm-values/
examples.yaml) is rendered by upstream's chart (`helm template --set
profile=ambient -f FILE`) and by `import-values` then our render of the
sample inventory. The baseline of each side is the same with an empty file.
What the values change upstream must change alike in ours: the differences
of the two sides with the values are those of the baselines, less the
fields the values touch, plus the example's literal `differs` rows.
"""

from __future__ import annotations

import importlib.util
import re
import tempfile
from collections.abc import Iterable
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from ambient_operator.api.helm_values import (
    CHART_DEFAULTS,
    CHARTS,
    ENTRIES,
    Carried,
    RefusedValueError,
    import_values,
)
from ambient_operator.api.v1alpha1 import AmbientMesh
from ambient_operator.cli.main import main
from ambient_operator.render import render_dataplane
from chart_helpers import HELM, TEMPLATE_KUBE_VERSION, helm
from checks import every
from render_cases import REPO, SAMPLE_NODES, Case
from test_upstream_conformance import CHARTS as CHART_DIR
from test_upstream_conformance import LINUX_SCOPE, NAMESPACE, PLATFORM_LABEL, views
from upstream_diff import Difference, compare, generator

EXAMPLES = REPO / "tests" / "data" / "helm-values" / "examples.yaml"
ROUND_TRIP = REPO / "tests" / "data" / "helm-values" / "round-trip"
# `.Values.a.b`, and `(.Values.a).b` / `($.Values).b` as the templates also write them.
_VALUES_REF = re.compile(
    r"\(?\$?\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)*)\)?((?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
)
WINDOWS_TAGS = ("ltsc2022", "ltsc2025")


# --- what the charts have ----------------------------------------------------


def chart_defaults(chart: str) -> dict[str, Any]:
    data = yaml.safe_load((CHART_DIR / chart / "values.yaml").read_text(encoding="utf-8"))
    defaults: dict[str, Any] = data["_internal_defaults_do_not_set"]
    return defaults


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted paths of a values tree's leaves (an empty map or a list is a leaf)."""
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(leaves(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): node}


def template_refs(chart: str) -> set[str]:
    """Every `.Values.a.b` path the chart's templates read."""
    found: set[str] = set()
    for path in sorted((CHART_DIR / chart / "templates").iterdir()):
        for match in _VALUES_REF.finditer(path.read_text()):
            dotted = (match.group(1) + match.group(2))[1:]
            if dotted:
                found.add(dotted)
    return found


def covering(entries: Iterable[str], path: str) -> list[str]:
    """The entries that speak for a path: itself, or a map above it, or a value below it."""
    return [e for e in entries if e == path or path.startswith(e + ".") or e.startswith(path + ".")]


@pytest.mark.parametrize("chart", CHARTS)
def test_every_value_of_the_chart_has_an_entry(chart: str) -> None:
    if not (CHART_DIR / chart / "values.yaml").exists():
        pytest.fail(f"{CHART_DIR / chart} missing; run hack/build-binaries.sh")
    entries = ENTRIES[chart]
    wanted = set(leaves(chart_defaults(chart))) | template_refs(chart)
    missing = sorted(p for p in wanted if not covering(entries, p))
    assert not missing, (
        f"{chart} values with no entry in api/helm_values.py (carry them to a field, or fix "
        f"them with a reason): {missing}"
    )
    stale = sorted(e for e in entries if not covering(wanted, e))
    assert not stale, f"{chart} entries for values the chart no longer has: {stale}"


def test_the_value_counts_are_those_of_the_issue() -> None:
    # Literal: 39 leaves in ztunnel's values.yaml and 62 in istio-cni's at the pin.
    assert len(leaves(chart_defaults("ztunnel"))) == 39
    assert len(leaves(chart_defaults("istio-cni"))) == 62


@pytest.mark.parametrize("chart", CHARTS)
def test_the_defaults_the_import_combines_are_the_charts(chart: str) -> None:
    found = leaves(chart_defaults(chart))
    # A value only the templates read (resources.limits) has no default: None.
    every(CHART_DEFAULTS[chart].items(), lambda kv: found.get(kv[0]) == kv[1], "defaults")


# --- the examples ------------------------------------------------------------


@cache
def examples() -> tuple[dict[str, Any], ...]:
    data = yaml.safe_load(EXAMPLES.read_text(encoding="utf-8"))
    return tuple(data)


def test_every_carried_value_has_an_example() -> None:
    covered = {(ex["chart"], path) for ex in examples() for path in ex["covers"]}
    carried = {
        (chart, path)
        for chart in CHARTS
        for path, entry in ENTRIES[chart].items()
        if isinstance(entry, Carried)
    }
    assert sorted(carried - covered) == [], "carried values without an example"
    assert sorted(covered - carried) == [], "examples cover values that are not carried"


@cache
def upstream(chart: str, values_text: str) -> tuple[dict[str, Any], ...]:
    if not HELM.exists():
        pytest.fail(f"{HELM} missing; run hack/build-binaries.sh")
    with tempfile.TemporaryDirectory() as folder:
        values = Path(folder) / "values.yaml"
        values.write_text(values_text, encoding="utf-8")
        args = ["template", chart, str(CHART_DIR / chart), "--namespace", NAMESPACE]
        args += ["--kube-version", TEMPLATE_KUBE_VERSION, "--set", "profile=ambient"]
        done = helm(*args, "-f", str(values))
    assert done.returncode == 0, f"helm template {chart}: {done.stderr}"
    return tuple(doc for doc in yaml.safe_load_all(done.stdout) if doc)


def ours(mesh: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    case = Case("sample-default", SAMPLE_NODES)
    spec = AmbientMesh.model_validate(mesh).spec
    # The sample names no platform; an imported one is the override render applies.
    facts = case.facts()
    if spec.platform != "auto":
        facts = replace(facts, platform=spec.platform)
    return render_dataplane(spec, facts).objects


def scoped(objects: Iterable[dict[str, Any]], scope: Iterable[str]) -> list[dict[str, Any]]:
    wanted = set(scope)
    return [o for o in objects if o["metadata"].get("labels", {}).get(PLATFORM_LABEL) in wanted]


def _charts_of(values: dict[str, dict[str, Any]]) -> tuple[str, ...]:
    return tuple(chart for chart in CHARTS if chart in values)


Files = dict[str, dict[str, Any]]


def _side(values: Files, base: Files, empty: bool) -> Files:
    """The values files of one side: the baseline alone, or the baseline under the values."""
    return {c: (base.get(c, {}) if empty else _merged(base.get(c, {}), values[c])) for c in values}


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(out.get(key), dict)
        out[key] = _merged(out[key], value) if both else value
    return out


def _upstream_all(values: Files, base: Files, empty: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for chart, given in _side(values, base, empty).items():
        out += upstream(chart, yaml.safe_dump(given))
    return out


def _import(values: Files, base: Files, empty: bool) -> dict[str, Any]:
    files = _side(values, base, empty)
    return import_values(files.get("ztunnel"), files.get("istio-cni"))


def judged(
    values: Files,
    differs: list[dict[str, str]],
    base: Files | None = None,
    table_rows: list[dict[str, str]] | None = None,
) -> None:
    """The comparison of the module docstring, for one set of values files over a baseline.

    `differs` are the example's own rows: each must name an object compared, or
    it is stale. `table_rows` (the platforms table's) cover every chart: only
    those of the objects compared apply.
    """
    base = base or {}
    charts = _charts_of(values)
    # Both sides only for the charts given: the other chart's objects are not compared.
    u0, u1 = _upstream_all(values, base, True), _upstream_all(values, base, False)
    mine = [ours(_import(values, base, empty)) for empty in (True, False)]
    o0, o1 = ([o for o in scoped(m, LINUX_SCOPE) if _component(o) in charts] for m in mine)
    touched = {(d.object, d.field) for d in compare(views(u0), views(u1))}
    assert touched, f"the values touch nothing upstream renders: {values}"
    base = set(compare(views(u0), views(o0)))
    now = set(compare(views(u1), views(o1)))
    compared = set(views(u1)) | set(views(o1))
    stale = sorted({d["object"] for d in differs} - compared)
    assert stale == [], f"differs rows for objects this example does not compare: {stale}"
    literal = {
        Difference(d["object"], d["field"], d["upstream"], d["ours"])
        for d in [*differs, *(r for r in table_rows or [] if r["object"] in compared)]
    }
    expected = {d for d in base if (d.object, d.field) not in touched} | literal
    assert sorted(now - expected) == [], "differs with the values, and not without"
    assert sorted(expected - now) == [], "differed without the values, and not with"


def _component(obj: dict[str, Any]) -> str:
    return str(obj["metadata"].get("labels", {}).get("app.kubernetes.io/component"))


@pytest.mark.parametrize("example", examples(), ids=lambda ex: ex["name"])
def test_each_value_renders_what_upstreams_chart_renders(example: dict[str, Any]) -> None:
    chart = example["chart"]
    base = {chart: example["with"]} if "with" in example else {}
    judged({chart: example["values"]}, example.get("differs", []), base, platform_rows(example))


def platform_rows(example: dict[str, Any]) -> list[dict[str, str]]:
    """The platforms table's rows for the example's `platform_rows` (of its
    `platform_objects` alone, when it names them), as Linux rows.

    That table is what a platform changes beyond the Linux one, held to
    upstream's platform profiles by test_upstream_conformance.
    """
    name = example.get("platform_rows")
    if name is None:
        return []
    prefix = f"{name}: "
    only = example.get("platform_objects")
    rows = [
        {
            "object": e.object.removeprefix(prefix),
            "field": e.field,
            "upstream": e.upstream,
            "ours": e.ours,
        }
        for e in generator().load_tables()["platforms"]
        if e.object.startswith(prefix) and e.upstream is not None and e.ours is not None
        if only is None or e.object.removeprefix(prefix) in only
    ]
    assert rows, f"the platforms table has no rows with values for {name}"
    return rows


# --- Windows -----------------------------------------------------------------

_COUNTERPARTS = {
    "DaemonSet/ztunnel": "DaemonSet/ztunnel-windows-{tag}",
    "DaemonSet/istio-cni-node": "DaemonSet/istio-cni-node-windows-{tag}",
    "ConfigMap/istio-cni-config": "ConfigMap/istio-cni-config-windows-{tag}",
    "ServiceAccount/ztunnel": "ServiceAccount/ztunnel-windows",
}


def windows_changes(mesh0: dict[str, Any], mesh1: dict[str, Any], tag: str) -> set[Difference]:
    """What the values change in our Windows objects of one build, as Linux names."""
    scope = [b for b, t in {"10.0.20348": "ltsc2022", "10.0.26100": "ltsc2025"}.items() if t == tag]
    w0 = views(scoped(ours(mesh0), scope) + _windows_account(ours(mesh0)))
    w1 = views(scoped(ours(mesh1), scope) + _windows_account(ours(mesh1)))
    back = {v.format(tag=tag): k for k, v in _COUNTERPARTS.items()}
    return {replace(d, object=back.get(d.object, d.object)) for d in compare(w0, w1)}


def upstream_windows_changes(
    u0: list[dict[str, Any]], u1: list[dict[str, Any]], excepted: list[dict[str, str]]
) -> set[Difference]:
    """What upstream's values change in the Linux agent objects Windows has too, less the
    listed fields where our Windows agents differ on purpose; each must be one touched."""
    found = {d for d in compare(views(u0), views(u1)) if d.object in _COUNTERPARTS}
    kept = {(d["object"], d["field"]) for d in excepted}
    stale = kept - {(d.object, d.field) for d in found}
    assert not stale, f"windows_except rows for fields the values do not touch: {sorted(stale)}"
    return {d for d in found if (d.object, d.field) not in kept}


def windows_mode(entry: Carried) -> str:
    """`applied` or `not applied`, as the entry's text begins."""
    for mode in ("not applied", "applied"):
        if entry.windows.startswith(mode):
            return mode
    raise AssertionError(f"{entry.field}: Windows text {entry.windows!r} says neither")


def _windows_account(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["metadata"]["name"] == "ztunnel-windows"]


@pytest.mark.parametrize("tag", WINDOWS_TAGS)
@pytest.mark.parametrize("example", examples(), ids=lambda ex: ex["name"])
def test_each_value_reaches_the_windows_agents_as_its_entry_says(
    example: dict[str, Any], tag: str
) -> None:
    chart = example["chart"]
    values, base = {chart: example["values"]}, {chart: example.get("with", {})}
    entries = [ENTRIES[chart][p] for p in example["covers"]]
    modes = {windows_mode(e) for e in entries if isinstance(e, Carried)}
    assert len(modes) == 1, f"{example['name']} covers values of different Windows modes: {modes}"
    (mode,) = modes
    changed = windows_changes(_import(values, base, True), _import(values, base, False), tag)
    u0, u1 = _upstream_all(values, base, True), _upstream_all(values, base, False)
    linux = upstream_windows_changes(u0, u1, example.get("windows_except", []))
    # Upstream's new values, against our Windows new values.
    as_upstream = {(d.object, d.field, d.ours) for d in linux}
    as_ours = {(d.object, d.field, d.ours) for d in changed}
    if example["windows"] == "own":
        # Applied at Windows fields of their own (a platform's Windows CNI paths).
        assert mode == "applied", f"{example['name']}: the entry says {mode}"
        assert changed, f"{example['name']} changes nothing of the Windows agents"
        return
    if example["windows"] == "shared":
        # The objects the values touch serve both OSes (istio-cni's ServiceAccount).
        assert not as_upstream, f"{example['name']} touches agent objects of their own OS"
        return
    if example["windows"] == "none" and not linux:
        # The values touch no agent object Windows has a counterpart of (Multus's
        # attachment, for Linux pods): then nothing of our Windows agents changes either.
        assert mode == "not applied", f"{example['name']}: the entry says {mode}"
        assert sorted(changed) == [], f"{example['name']} changes the Windows agents"
        return
    assert as_upstream, f"{example['name']} changes no agent object upstream has on Windows too"
    if example["windows"] == "same":
        assert mode == "applied", f"{example['name']}: the entry says {mode}"
        assert sorted(as_upstream - as_ours) == [], "Linux changed where Windows did not"
    elif example["windows"] == "changed":
        # Applied, but the Windows value is not upstream's Linux one (an image name).
        assert mode == "applied", f"{example['name']}: the entry says {mode}"
        fields = {(d.object, d.field) for d in changed}
        assert sorted({(o, f) for o, f, _ in as_upstream} - fields) == []
    else:
        assert example["windows"] == "none"
        assert mode == "not applied", f"{example['name']}: the entry says {mode}"
        fields = {(o, f) for o, f, _ in as_upstream}
        assert not {(d.object, d.field) for d in changed} & fields


# --- import-values on the command line -------------------------------------


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str], **files: str) -> tuple[int, str, str]:
    argv = ["import-values"]
    for flag, text in files.items():
        path = tmp_path / f"{flag}.yaml"
        path.write_text(text, encoding="utf-8")
        argv += [f"--{flag.replace('_', '-')}", str(path)]
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("files", "said"),
    [
        (
            {"ztunnel": "multiCluster:\n  clusterNme: west\n"},
            "ztunnel: multiCluster.clusterNme: not a value",
        ),
        (
            {"istio_cni": "ambient:\n  dnsCapture: maybe\n"},
            "istio-cni: ambient.dnsCapture: expected bool",
        ),
        (
            {"ztunnel": "terminationGracePeriodSeconds: true\n"},
            "terminationGracePeriodSeconds: expected int",
        ),
        ({"ztunnel": "resourceScope: cluster\n"}, "ztunnel: resourceScope: splits a Helm install"),
        (
            {"istio_cni": "repair:\n  deletePods: true\n"},
            "istio-cni: repair.deletePods: istio-cni runs only the first mode set",
        ),
        (
            {"istio_cni": "repair:\n  repairPods: false\n"},
            "istio-cni: repair.repairPods: repairPods, deletePods and labelPods all false",
        ),
        (
            {"ztunnel": "hub: a.example/x\n", "istio_cni": "hub: b.example/y\n"},
            "spec.images.hub: is ",
        ),
        ({"istiod": "trustedZtunnelName: zt\n"}, "istiod: trustedZtunnelName: "),
        (
            {"ztunnel": "affinity:\n  podAntiAffinity: {}\n"},
            "ztunnel: affinity: only affinity.nodeAffinity.requiredDuringScheduling",
        ),
        (
            {"ztunnel": "multiCluster:\n  clusterName: 'bad name'\n"},
            "spec.multiCluster.clusterName",
        ),
    ],
)
def test_import_values_refuses_by_path_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str], said: str
) -> None:
    code, out, err = run(tmp_path, capsys, **files)
    assert (code, out) == (2, "")
    assert said in err


def test_import_values_prints_an_ambientmesh_named_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(tmp_path, capsys, ztunnel="network: west\n", istiod="revision: canary\n")
    assert (code, err) == (0, "")
    assert yaml.safe_load(out) == {
        "apiVersion": "ambientoperator.io/v1alpha1",
        "kind": "AmbientMesh",
        "metadata": {"name": "default"},
        "spec": {
            "images": {"variant": "distroless"},
            "istiod": {"revision": "canary"},
            "network": "west",
        },
    }
    code, out, _ = run(tmp_path, capsys, istio_cni="{}\n")
    assert code == 0 and yaml.safe_load(out)["spec"] == {"images": {"variant": "distroless"}}


def test_import_values_says_where_the_bundled_images_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Istio's charts have no value for them: the YAML says so on top, a comment.
    code, out, err = run(tmp_path, capsys, ztunnel="hub: mirror.example.com/istio\n")
    assert (code, err) == (0, "")
    assert out.startswith(
        "# spec.images.hub and tag name Istio's Linux images, as your values did. Istio\n"
        "# publishes no Windows agents and no redirection-wait image: "
        "`make images REGISTRY=<registry>`\n"
        "# builds and pushes them (docs/images.md); set spec.images.registry to that registry\n"
    )
    assert yaml.safe_load(out)["spec"]["images"] == {
        "hub": "mirror.example.com/istio",
        "variant": "distroless",
    }
    # --registry sets it, and then there is nothing left to say.
    argv = ["import-values", "--ztunnel", str(tmp_path / "ztunnel.yaml")]
    assert main([*argv, "--registry", "registry.example.com:5000/ambient"]) == 0
    out = capsys.readouterr().out
    assert not out.startswith("#")
    assert yaml.safe_load(out)["spec"]["images"] == {
        "hub": "mirror.example.com/istio",
        "registry": "registry.example.com:5000/ambient",
        "variant": "distroless",
    }
    assert main([*argv, "--registry", "Not A Registry"]) == 2
    refused = capsys.readouterr()
    assert refused.out == ""
    assert refused.err.startswith(
        "ambient-operator import-values: --registry 'Not A Registry': Value error, "
        "'Not A Registry' is not a valid image repository (hub)"
    ), refused.err


def test_istiod_and_agents_that_disagree_are_refused() -> None:
    with pytest.raises(RefusedValueError) as refused:
        import_values(
            {"multiCluster": {"clusterName": "west"}},
            None,
            {"global": {"multiCluster": {"clusterName": "east"}}},
        )
    assert "spec.multiCluster.clusterName" in str(refused.value)


# --- round trip of whole values files ----------------------------------------


def round_trip_cases() -> list[Path]:
    return sorted(ROUND_TRIP.glob("*.yaml"))


@pytest.mark.parametrize("path", round_trip_cases(), ids=lambda p: p.stem)
def test_whole_values_files_round_trip(path: Path) -> None:
    case = yaml.safe_load(path.read_text(encoding="utf-8"))
    values = {c: case[c] for c in CHARTS if c in case}
    assert values, f"{path.name} gives no chart's values"
    judged(values, case.get("differs", []))
    # Windows: every change upstream makes to a Linux agent object that Windows
    # has as well is made there, but for the fields the case excepts, with why.
    none: Files = {}
    u0, u1 = _upstream_all(values, none, True), _upstream_all(values, none, False)
    linux = {
        (d.object, d.field, d.ours)
        for d in upstream_windows_changes(u0, u1, case.get("windows_except", []))
    }
    assert linux, f"{path.name} changes nothing that Windows agents have as well"
    for tag in WINDOWS_TAGS:
        mesh0, mesh1 = _import(values, none, True), _import(values, none, False)
        changed = {(d.object, d.field, d.ours) for d in windows_changes(mesh0, mesh1, tag)}
        assert sorted(linux - changed) == [], f"{tag}: not applied on Windows"


def test_the_coming_from_helm_page_is_current() -> None:
    path = REPO / "hack" / "gen_helm_values.py"
    spec = importlib.util.spec_from_file_location("gen_helm_values", path)
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.PAGE.read_text(encoding="utf-8") == tool.render_markdown(), (
        "docs/coming-from-helm.md is stale; run `make docs` (or .venv/bin/python "
        "hack/gen_helm_values.py)"
    )
