"""Istio's own Helm charts judge our Linux data plane.

Upstream is what `helm template` makes of the pinned `ztunnel` and
`istio-cni` charts with `--set profile=ambient`; ours is what
render_dataplane makes of the sample mixed inventory with a default
AmbientMesh, restricted to the Linux and shared objects (platform label
`linux` or `all`). Both sides become comparable views (below), and the
comparison is a flat list of differences: object, field path, upstream
value, our value.

Every difference must be a row of tests/data/upstream-differences/linux.yaml
with a reason, and every row there must still be a difference; when a row
gives `upstream` or `ours`, it must be the value the comparison prints.
Nothing is left out of the comparison without a row.

The views change the shape of the objects, never their content:
- lists whose items have a key become maps by that key: containers and env
  by name, ports by name, volumeMounts by mountPath;
- each volumeMount carries the volume it mounts (`.volume`), so a path is
  compared with its hostPath and type in one row; volumes no container
  mounts stay under `volumes[name]`;
- a ClusterRole's rules are compared as what each ServiceAccount is granted
  through the ClusterRoleBindings (`ServiceAccount/x granted[group/resource]`
  with the verbs), because upstream splits one agent's permissions over
  three roles and bindings where we have one; the roles and bindings
  themselves are still compared as objects;
- null, and an empty label or annotation map, count as absent: the API
  server stores them so (Helm renders `annotations: {}` for nothing); other
  empty values (`emptyDir: {}`) are compared as they are.
Platform profiles of the charts (`files/profile-platform-*.yaml`) that we
do not claim to support are differences too (`Profile/platform-x`). Each
one we claim is rendered by upstream's charts with `global.platform=<p>` and
compared with ours for an AmbientMesh with `spec.platform: <p>`; what differs
there and not without a platform (or the other way round) is a row of
tests/data/upstream-differences/platforms.yaml, its object prefixed `<p>: `.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from ambient_operator.cli.render import load_node_objects
from ambient_operator.cluster.platform import detect_platform, effective_platform
from ambient_operator.render import render_dataplane
from chart_helpers import HELM, TEMPLATE_KUBE_VERSION, helm
from render_cases import REPO, SAMPLE_NODES, Case
from upstream_diff import (
    ABSENT,
    Difference,
    Keyed,
    check_table,
    compare,
    generator,
    key_lists,
    pod_view,
    pruned,
)

CHARTS = REPO / ".cache" / "istio" / "charts"
UPSTREAM_CHARTS = ("ztunnel", "istio-cni")
NAMESPACE = "istio-system"
TABLE = "linux"
PLATFORM_LABEL = "ambientoperator.io/platform"
LINUX_SCOPE = ("linux", "all")
# Platform profiles of the charts we claim to render for (render/platforms.py):
# all of upstream's. Generic Linux is the chart without a platform, and
# Windows is compared elsewhere.
CLAIMED_PLATFORMS: tuple[str, ...] = ("gke", "k3d", "k3s", "microk8s", "minikube", "openshift")
PLATFORM_TABLE = "platforms"
# A generic difference that a platform's render no longer shows.
GONE = " (differs only without the platform)"

# --- the two sides ---------------------------------------------------------


@cache
def upstream_objects(platform: str | None = None) -> tuple[dict[str, Any], ...]:
    """Both charts as `helm template` renders them for an ambient install (on a platform)."""
    if not HELM.exists():
        pytest.fail(f"{HELM} missing; run hack/build-binaries.sh")
    objects: list[dict[str, Any]] = []
    for chart in UPSTREAM_CHARTS:
        folder = CHARTS / chart
        if not (folder / "Chart.yaml").exists():
            pytest.fail(f"{folder} missing; run hack/build-binaries.sh")
        done = helm(
            "template",
            chart,
            str(folder),
            "--namespace",
            NAMESPACE,
            "--kube-version",
            TEMPLATE_KUBE_VERSION,
            "--set",
            "profile=ambient",
            *(["--set", f"global.platform={platform}"] if platform else []),
        )
        assert done.returncode == 0, f"helm template {chart}: {done.stderr}"
        objects += [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    return tuple(objects)


@cache
def our_objects(platform: str | None = None) -> tuple[dict[str, Any], ...]:
    """Our Linux and shared objects for the sample inventory and a default mesh.

    With a platform, the mesh names it in spec.platform: the sample's nodes
    carry no platform's marks, so this is the override the operator applies.
    """
    case = Case("sample-default", SAMPLE_NODES)
    if platform is None:
        result = case.render()
    else:
        spec = case.spec().model_copy(update={"platform": platform})
        choice = effective_platform(spec.platform, detect_platform(load_node_objects(SAMPLE_NODES)))
        assert (choice.name, choice.detected, choice.source) == (platform, "generic", "spec")
        result = render_dataplane(spec, replace(case.facts(), platform=choice.name))
    return tuple(
        obj
        for obj in result.objects
        if obj["metadata"].get("labels", {}).get(PLATFORM_LABEL) in LINUX_SCOPE
    )


def platform_profiles() -> dict[str, list[str]]:
    """Platform profile names of the upstream charts, with the charts that have them."""
    found: dict[str, list[str]] = {}
    for chart in UPSTREAM_CHARTS:
        for path in sorted((CHARTS / chart / "files").glob("profile-platform-*.yaml")):
            found.setdefault(path.stem.removeprefix("profile-"), []).append(chart)
    return found


# --- views ---------------------------------------------------------------


def _atoms(role: Mapping[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for rule in role.get("rules") or []:
        verbs = set(rule.get("verbs", []))
        for url in rule.get("nonResourceURLs", []):
            out.setdefault(f"nonResource{url}", set()).update(verbs)
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                base = f"{group or 'core'}/{resource}"
                for name in rule.get("resourceNames") or [None]:
                    out.setdefault(base if name is None else f"{base}/{name}", set()).update(verbs)
    return out


def _grants(objects: Iterable[Mapping[str, Any]]) -> dict[str, Keyed]:
    """What each ServiceAccount is granted cluster-wide, by ServiceAccount name."""
    objects = list(objects)
    roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
    granted: dict[str, dict[str, set[str]]] = {}
    for binding in (o for o in objects if o["kind"] == "ClusterRoleBinding"):
        ref = binding["roleRef"]
        assert ref["kind"] == "ClusterRole", binding
        assert ref["name"] in roles, f"{binding['metadata']['name']} binds a missing role"
        for subject in binding.get("subjects", []):
            if subject["kind"] != "ServiceAccount" or subject.get("namespace") != NAMESPACE:
                continue
            mine = granted.setdefault(subject["name"], {})
            for atom, verbs in _atoms(roles[ref["name"]]).items():
                mine.setdefault(atom, set()).update(verbs)
    return {sa: Keyed({a: sorted(v) for a, v in g.items()}) for sa, g in granted.items()}


def views(objects: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Comparable views of objects, by `Kind/name`."""
    objects = list(objects)
    grants = _grants(objects)
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    assert set(grants) <= accounts, f"grants to missing ServiceAccounts: {set(grants) - accounts}"
    bound = {o["roleRef"]["name"] for o in objects if o["kind"] == "ClusterRoleBinding"}
    out: dict[str, dict[str, Any]] = {}
    for obj in objects:
        key = f"{obj['kind']}/{obj['metadata']['name']}"
        assert key not in out, f"{key} rendered twice"
        view = pruned(obj)
        if obj["kind"] == "DaemonSet":
            template = dict(view["spec"]["template"])
            template["spec"] = pod_view(template["spec"], key)
            view = {**view, "spec": {**view["spec"], "template": template}}
        # A bound role's rules are compared as the grants of its subjects.
        if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] in bound:
            view = {k: v for k, v in view.items() if k != "rules"}
        if obj["kind"] == "ServiceAccount" and obj["metadata"]["name"] in grants:
            view = {**view, "granted": grants[obj["metadata"]["name"]]}
        # A NetworkPolicy's rules are ordered lists of unnamed ports: compared as they are.
        out[key] = view if obj["kind"] == "NetworkPolicy" else key_lists(view, key)
    return out


# --- the comparison ------------------------------------------------------


def profile_differences() -> list[Difference]:
    """Upstream platform profiles we do not claim: rendered by neither side here."""
    return [
        Difference(f"Profile/{name}", "(not rendered)", ", ".join(charts), "not claimed")
        for name, charts in sorted(platform_profiles().items())
        if name.removeprefix("platform-") not in CLAIMED_PLATFORMS
    ]


def differences() -> list[Difference]:
    """What the comparison finds today."""
    found = compare(views(upstream_objects()), views(our_objects()))
    return sorted(found + profile_differences())


def platform_differences(platform: str) -> list[Difference]:
    """What differs on a platform and not without one, or the other way round."""
    generic = set(compare(views(upstream_objects()), views(our_objects())))
    found = set(compare(views(upstream_objects(platform)), views(our_objects(platform))))
    return sorted(
        [
            Difference(f"{platform}: {d.object}", d.field, d.upstream, d.ours)
            for d in found - generic
        ]
        + [
            Difference(f"{platform}: {d.object}", d.field + GONE, d.upstream, d.ours)
            for d in generic - found
        ]
    )


# --- the helper itself, on literal data ----------------------------------


def test_comparison_reports_fields_mounts_and_grants() -> None:
    def daemonset(mount: str, env: dict[str, Any]) -> dict[str, Any]:
        return {
            "kind": "DaemonSet",
            "metadata": {"name": "d", "annotations": {}},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "env": [{"name": "A", **env}],
                                "volumeMounts": [{"name": "v", "mountPath": mount}],
                            }
                        ],
                        "volumes": [{"name": "v", "hostPath": {"path": "/p"}}],
                    }
                }
            },
        }

    def rbac(verbs: list[str]) -> list[dict[str, Any]]:
        return [
            {"kind": "ServiceAccount", "metadata": {"name": "sa", "namespace": NAMESPACE}},
            {
                "kind": "ClusterRole",
                "metadata": {"name": "r"},
                "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": verbs}],
            },
            {
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "r"},
                "roleRef": {"kind": "ClusterRole", "name": "r"},
                "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": NAMESPACE}],
            },
        ]

    up = views([daemonset("/host/x", {"value": "1"}), *rbac(["create", "patch"])])
    ours = views([daemonset("/x", {"valueFrom": {"fieldRef": {"fieldPath": "f"}}}), *rbac(["get"])])
    c = "spec.template.spec.containers[c]"
    mount = '{"name": "v", "volume": {"hostPath": {"path": "/p"}}}'
    ref = '{"fieldRef": {"fieldPath": "f"}}'
    assert compare(up, ours) == [
        Difference("DaemonSet/d", f"{c}.env[A].value", "1", ABSENT),
        Difference("DaemonSet/d", f"{c}.env[A].valueFrom", ABSENT, ref),
        Difference("DaemonSet/d", f"{c}.volumeMounts[/host/x]", mount, ABSENT),
        Difference("DaemonSet/d", f"{c}.volumeMounts[/x]", ABSENT, mount),
        Difference("ServiceAccount/sa", "granted[core/events]", '["create", "patch"]', '["get"]'),
    ]
    assert compare(up, {})[0] == Difference("ClusterRole/r", "(object)", "present", ABSENT)
    labels = {"kind": "ConfigMap", "metadata": {"name": "m", "labels": {"a.b/c": "1"}}}
    other = {**labels, "metadata": {"name": "m", "labels": {"x": "2"}}}
    assert compare(views([labels]), views([other])) == [
        Difference("ConfigMap/m", 'metadata.labels["a.b/c"]', "1", ABSENT),
        Difference("ConfigMap/m", "metadata.labels.x", ABSENT, "2"),
    ]
    # A side without the map at all differs once, at the map.
    assert compare(views([labels]), views([{**labels, "metadata": {"name": "m"}}])) == [
        Difference("ConfigMap/m", "metadata.labels", '{"a.b/c": "1"}', ABSENT)
    ]


# --- the verdicts --------------------------------------------------------


def test_linux_render_matches_upstream_but_for_listed_differences() -> None:
    check_table(TABLE, differences())


def test_every_upstream_platform_profile_is_claimed() -> None:
    # A new profile upstream would otherwise only show as a "not claimed" row.
    assert sorted(p.removeprefix("platform-") for p in platform_profiles()) == sorted(
        CLAIMED_PLATFORMS
    )


def test_each_platform_render_matches_upstreams_profile_but_for_listed_differences() -> None:
    check_table(PLATFORM_TABLE, [d for p in CLAIMED_PLATFORMS for d in platform_differences(p)])


def test_every_difference_table_is_well_formed() -> None:
    tables = generator().load_tables()
    assert TABLE in tables, f"tests/data/upstream-differences/{TABLE}.yaml missing"
    for name, entries in tables.items():
        for entry in entries:
            assert "\n" not in entry.reason, f"{name}.yaml: {entry.object} {entry.field}: one line"


def test_upstream_differences_page_is_current() -> None:
    tool = generator()
    page: Path = tool.PAGE
    text = tool.render_markdown(tool.load_tables(), tool.istio_pin())
    assert page.exists() and page.read_text(encoding="utf-8") == text, (
        "docs/upstream-differences.md is stale; run `make docs` "
        "(or `.venv/bin/python hack/gen_upstream_differences.py`)"
    )
