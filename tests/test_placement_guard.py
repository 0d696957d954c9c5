"""OS placement is enforced in the one writer (apply/placement.py, apply/writer.py).

Every pod-bearing object the operator can write (the agents' DaemonSets, the
waypoints' Deployments) is rendered here and must pass the check; literal
objects show what it refuses; `writer.write` refuses an unpinned object
before any request; and the webhook's patch never moves a pod. Offline: no
cluster, no API server.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Callable, Iterator
from typing import Any, cast

import jsonpatch
import pytest
import yaml

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply import writer
from ambient_operator.apply.placement import placement_problem, pod_spec_path
from ambient_operator.apply.plan import Owner, prepare
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts, Taint
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.render import render_dataplane
from ambient_operator.render.waypoints.verdicts import WaypointRender, render_waypoint
from ambient_operator.webhook.config import WebhookOptions
from ambient_operator.webhook.upkeep import Webhook
from render_cases import CASES, SAMPLE_MESH, SAMPLE_NODES, Case
from test_waypoint_units import gateway, gateway_class
from test_webhook_units import _review

MESH_OWNER = Owner("ambientoperator.io/v1alpha1", "AmbientMesh", "default", "uid-mesh")
WS2022, WS2025 = "10.0.20348", "10.0.26100"
WINDOWS_TAINT = (Taint("os", "windows", "NoSchedule"),)
OS = "kubernetes.io/os"
TERMS = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"


# -- inventories beyond the golden cases -----------------------------------------


def _linux(name: str, *, os_label: bool = True, arch: str = "amd64") -> NodeFacts:
    labels = {c.LABEL_ARCH: arch}
    if os_label:
        labels[c.LABEL_OS] = "linux"
    return NodeFacts(name, "linux", arch, None, False, labels)


def _windows(
    name: str, build: str, *, os_label: bool = True, build_label: bool = True
) -> NodeFacts:
    labels = {c.LABEL_ARCH: "amd64"}
    if os_label:
        labels[c.LABEL_OS] = "windows"
    if build_label:
        labels[c.LABEL_WINDOWS_BUILD] = build
    return NodeFacts(name, "windows", "amd64", build, build_label, labels, WINDOWS_TAINT)


# Facts built here, not read from files: nodes that lack the OS label (their
# OS came from nodeInfo), so placement moves the OS pin into node affinity and
# names those nodes in matchFields terms of their own.
INVENTORIES: dict[str, tuple[NodeFacts, ...]] = {
    "linux-only": (_linux("l1"), _linux("l2", arch="arm64")),
    "mixed-ws2022-ws2025": (
        _linux("l1"),
        _windows("w22", WS2022),
        _windows("w25", WS2025),
    ),
    "os-label-missing": (
        _linux("l1"),
        _linux("bare-linux", os_label=False),
        _windows("bare-w22", WS2022, os_label=False, build_label=False),
        _windows("w22", WS2022),
        _windows("bare-w25", WS2025, os_label=False),
    ),
    "no-nodes": (),
}
MESHES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "user-selectors": {
        "platforms": {
            "linux": {"nodeSelector": {"pool": "mesh"}},
            "windows": {"nodeSelector": {"pool": "win"}, "builds": [WS2022, WS2025]},
        }
    },
    # The user's selector repeats the OS label: it lands in the affinity, agreeing.
    "os-in-user-selector": {
        "platforms": {
            "linux": {"nodeSelector": {OS: "linux"}},
            "windows": {"nodeSelector": {OS: "windows"}},
        }
    },
}


def _dataplane_renders() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    for case in CASES:
        yield f"golden:{case.name}", case.render().objects
    sample = Case("sample", SAMPLE_NODES, mesh=SAMPLE_MESH)
    for inventory, nodes in INVENTORIES.items():
        for mesh, spec in MESHES.items():
            facts = ClusterFacts(nodes, "10.96.0.20", "10.96.0.10")
            result = render_dataplane(AmbientMeshSpec.model_validate(spec), facts)
            yield f"{inventory}/{mesh}", result.objects
        # The sample mesh over these inventories too.
        result = render_dataplane(sample.spec(), ClusterFacts(nodes, "10.96.0.20", "10.96.0.10"))
        yield f"{inventory}/sample-mesh", result.objects


# -- waypoints -------------------------------------------------------------------


def _ref(name: str, **extra: str) -> dict[str, str]:
    return {"group": "", "kind": "ConfigMap", "name": name, **extra}


# Parameters that ask for Windows, through the Gateway's own ConfigMap.
WINDOWS_PARAMETERS = {
    "nodeSelector": yaml.safe_dump({OS: "windows", c.LABEL_WINDOWS_BUILD: WS2022, "pool": "x"}),
    "tolerations": yaml.safe_dump(
        [
            {"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"},
            {"key": "dedicated", "operator": "Exists"},
        ]
    ),
}


def _waypoint_renders() -> Iterator[tuple[str, WaypointRender]]:
    yield "defaults", render_waypoint(AmbientMeshSpec(), gateway(), gateway_class(), {})
    yield (
        "gateway-parameters-ask-for-windows",
        render_waypoint(
            AmbientMeshSpec(),
            gateway(infrastructure={"parametersRef": _ref("params")}),
            gateway_class(),
            {("apps", "params"): WINDOWS_PARAMETERS},
        ),
    )
    spec = AmbientMeshSpec.model_validate(
        {"waypoints": {"replicas": 2, "nodeSelector": {"pool": "mesh"}}}
    )
    yield (
        "mesh-class-and-gateway-layers",
        render_waypoint(
            spec,
            gateway(infrastructure={"parametersRef": _ref("gw-params")}),
            gateway_class(_ref("class-params", namespace="istio-system")),
            {
                ("istio-system", "class-params"): {
                    "nodeSelector": "{zone: a, beta.kubernetes.io/os: linux}",
                    "tolerations": "[{key: dedicated, operator: Exists}]",
                },
                ("apps", "gw-params"): {"replicas": "3"},
            },
        ),
    )


def _pod_bearing() -> list[tuple[str, dict[str, Any]]]:
    """(where it came from, object) for every pod-bearing object rendered above."""
    found: list[tuple[str, dict[str, Any]]] = []
    for source, objects in _dataplane_renders():
        found += [(source, o) for o in objects if pod_spec_path(o) is not None]
    for source, result in _waypoint_renders():
        assert result.accepted.status == "True", (source, result.accepted)
        found += [(f"waypoint:{source}", o) for o in result.objects if pod_spec_path(o) is not None]
    return found


PLACED = _pod_bearing()


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def _pinned_by_affinity_only(obj: dict[str, Any]) -> bool:
    pod = _pod(obj)
    return OS not in (pod.get("nodeSelector") or {}) and bool(pod.get("affinity"))


def _has_name_terms(obj: dict[str, Any]) -> bool:
    terms = (
        (_pod(obj).get("affinity") or {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
        .get("nodeSelectorTerms", [])
    )
    return any("matchFields" in term for term in terms)


def test_every_rendered_pod_template_is_placed() -> None:
    refused = {
        f"{source}: {o['kind']} {o['metadata']['name']}": problem
        for source, o in PLACED
        if (problem := placement_problem(o)) is not None
    }
    assert refused == {}


def test_the_rendered_set_covers_agents_waypoints_and_both_oses() -> None:
    # The loop above must not pass on nothing: these are what was checked.
    assert {o["kind"] for _, o in PLACED} == {"DaemonSet", "Deployment"}
    # The OS as the pod spec names it, next to the names the renderers give.
    linux = {o["metadata"]["name"] for _, o in PLACED if _pod(o)["os"]["name"] == "linux"}
    windows = {o["metadata"]["name"] for _, o in PLACED if _pod(o)["os"]["name"] == "windows"}
    assert {"ztunnel", "istio-cni-node", "waypoint"} <= linux
    assert {
        "ztunnel-windows-ltsc2022",
        "istio-cni-node-windows-ltsc2022",
        "ztunnel-windows-ltsc2025",
        "istio-cni-node-windows-ltsc2025",
    } <= windows
    assert not any("windows" in name for name in linux)
    assert all("-windows-" in name for name in windows)
    deployments = [o for _, o in PLACED if o["kind"] == "Deployment"]
    assert len(deployments) == 3
    assert all(_pod(o)["nodeSelector"][OS] == "linux" for o in deployments)
    # Pins that sit only in node affinity, with terms that name unlabelled
    # nodes, were checked on both OSes (the os-label-missing inventory).
    by_affinity = {
        (_pod(o)["os"]["name"], _has_name_terms(o))
        for _, o in PLACED
        if _pinned_by_affinity_only(o)
    }
    assert {("linux", True), ("windows", True)} <= by_affinity


# -- literal cases -----------------------------------------------------------------


def _ds(pod: dict[str, Any], kind: str = "DaemonSet") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "agent", "namespace": "istio-system"},
        "spec": {"template": {"spec": {"containers": [{"name": "a"}], **pod}}},
    }


def _terms(*terms: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}
        }
    }


def _os_in(*values: str, operator: str = "In") -> dict[str, Any]:
    return {"matchExpressions": [{"key": OS, "operator": operator, "values": list(values)}]}


BY_NAME = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
ARCH = {"matchExpressions": [{"key": c.LABEL_ARCH, "operator": "In", "values": ["amd64"]}]}


@pytest.mark.parametrize(
    "obj",
    [
        _ds({"nodeSelector": {OS: "linux"}}),
        _ds({"nodeSelector": {OS: "windows"}}),
        _ds({"os": {"name": "linux"}, "nodeSelector": {OS: "linux", "pool": "a"}}),
        _ds({"os": {"name": "windows"}, "nodeSelector": {OS: "windows"}}, kind="Deployment"),
        _ds({"nodeSelector": {OS: "linux"}}, kind="StatefulSet"),
        _ds({"nodeSelector": {OS: "linux"}}, kind="Job"),
        _ds({"affinity": _terms(_os_in("linux"))}),
        _ds({"os": {"name": "windows"}, "affinity": _terms(_os_in("windows"), BY_NAME)}),
        _ds(
            {
                "os": {"name": "linux"},
                "affinity": _terms(
                    {
                        "matchExpressions": [
                            *_os_in("linux")["matchExpressions"],
                            *ARCH["matchExpressions"],
                        ]
                    },
                    BY_NAME,
                ),
            }
        ),
        {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeSelector": {OS: "windows"}}},
        {
            "kind": "CronJob",
            "metadata": {"name": "cj"},
            "spec": {
                "jobTemplate": {"spec": {"template": {"spec": {"nodeSelector": {OS: "linux"}}}}}
            },
        },
    ],
    ids=[
        "nodeSelector-linux",
        "nodeSelector-windows",
        "os-and-nodeSelector-agree",
        "deployment-windows",
        "statefulset",
        "job",
        "affinity-only",
        "affinity-with-name-terms",
        "affinity-os-and-arch",
        "pod",
        "cronjob",
    ],
)
def test_pinned_to_one_os_is_accepted(obj: dict[str, Any]) -> None:
    assert placement_problem(obj) is None


TPL = "spec.template.spec"
AFF = f"{TPL}.{TERMS}"


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        (
            _ds({}),
            f"{TPL} pins no OS: it needs nodeSelector[kubernetes.io/os] or a required node "
            f"affinity on kubernetes.io/os ({AFF})",
        ),
        (
            _ds({"nodeSelector": {"pool": "a"}, "os": {"name": "linux"}}),
            f"{TPL} pins no OS: it needs nodeSelector[kubernetes.io/os] or a required node "
            f"affinity on kubernetes.io/os ({AFF})",
        ),
        (
            _ds({"os": {"name": "windows"}, "nodeSelector": {OS: "linux"}}),
            f"{TPL}.os.name is 'windows' but {TPL}.nodeSelector[kubernetes.io/os] pins 'linux'",
        ),
        (
            _ds({"nodeSelector": {OS: "Linux"}}),
            f"{TPL}.nodeSelector[kubernetes.io/os] is 'Linux', not one of linux, windows",
        ),
        (
            _ds({"affinity": _terms(_os_in("linux"), _os_in("windows"))}),
            f"{AFF} disagree on kubernetes.io/os: term 0 linux, term 1 windows",
        ),
        (
            _ds({"affinity": _terms(_os_in("linux"), ARCH)}),
            f"{AFF}[1] pins no OS: a term needs kubernetes.io/os In one OS, or to select "
            "nodes only by metadata.name",
        ),
        (
            _ds({"affinity": _terms(BY_NAME)}),
            f"{AFF} only names nodes and pins no OS",
        ),
        (
            _ds({"affinity": _terms(_os_in("linux", "windows"))}),
            f"{AFF}[0].matchExpressions[0] must be kubernetes.io/os In one OS, not 'In' "
            "['linux', 'windows']",
        ),
        (
            _ds({"affinity": _terms(_os_in("windows", operator="NotIn"))}),
            f"{AFF}[0].matchExpressions[0] must be kubernetes.io/os In one OS, not 'NotIn' "
            "['windows']",
        ),
        (
            _ds({"os": {"name": "windows"}, "affinity": _terms(_os_in("linux"), BY_NAME)}),
            f"{TPL}.os.name is 'windows' but {AFF}[0] pins 'linux'",
        ),
        (
            {"kind": "DaemonSet", "metadata": {"name": "empty"}, "spec": {}},
            f"{TPL} is missing, so nothing pins the pods' OS",
        ),
        (
            {"kind": "CronJob", "metadata": {"name": "cj"}, "spec": {"jobTemplate": {}}},
            "spec.jobTemplate.spec.template.spec is missing, so nothing pins the pods' OS",
        ),
        (
            {"kind": "Pod", "metadata": {"name": "p"}, "spec": {"nodeName": "w1"}},
            "spec pins no OS: it needs nodeSelector[kubernetes.io/os] or a required node "
            f"affinity on kubernetes.io/os (spec.{TERMS})",
        ),
    ],
    ids=[
        "no-pin",
        "other-labels-and-os-name-only",
        "os-name-disagrees-with-nodeSelector",
        "unknown-os",
        "affinity-terms-disagree",
        "term-without-os-or-names",
        "names-only",
        "two-oses-in-one-expression",
        "not-in",
        "os-name-disagrees-with-affinity",
        "no-template",
        "cronjob-without-template",
        "pod-by-node-name",
    ],
)
def test_unpinned_or_contradictory_placement_is_refused(obj: dict[str, Any], problem: str) -> None:
    assert placement_problem(obj) == problem


@pytest.mark.parametrize(
    "obj",
    [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "x"}},
    ],
    ids=["configmap", "service", "serviceaccount"],
)
def test_objects_without_pods_have_no_placement(obj: dict[str, Any]) -> None:
    assert placement_problem(obj) is None


# -- through writer.write ------------------------------------------------------------


class NoRequests:
    """A Kube stand-in on which any request fails the test."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"Kube.{name} was called: a request was made")

        return refuse


class Recording(NoRequests):
    """Answers a creation's one request: a server-side apply that only a free name takes."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def apply(self, obj: dict[str, Any], *, force: bool = True) -> dict[str, Any]:
        self.calls.append(("apply", copy.deepcopy(obj)))
        created = copy.deepcopy(obj)
        created["metadata"].update(
            uid="uid-new",
            resourceVersion="2",
            managedFields=[{"manager": c.FIELD_MANAGER, "operation": "Apply"}],
        )
        return created


def _sample_daemonset(name: str) -> dict[str, Any]:
    objects = Case("sample", SAMPLE_NODES, mesh=SAMPLE_MESH).render().objects
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"] == name]
    return prepare(ds, MESH_OWNER, "dataplane")


def _unpinned(name: str) -> dict[str, Any]:
    ds = _sample_daemonset(name)
    pod = _pod(ds)
    assert pod["nodeSelector"].pop(OS) == "windows"  # the sample's WS2022 nodes are labelled
    assert "affinity" not in pod
    return ds


@pytest.mark.parametrize("live", [False, True], ids=["create", "update"])
def test_write_refuses_an_unpinned_daemonset_before_any_request(live: bool) -> None:
    ds = _unpinned("ztunnel-windows-ltsc2022")
    current = copy.deepcopy(ds) if live else None
    if current is not None:
        current["metadata"]["resourceVersion"] = "7"
    with pytest.raises(KubeError) as caught:
        writer.write(cast(Kube, NoRequests()), ds, current, MESH_OWNER)
    assert (caught.value.status, caught.value.reason) == (422, "Unplaced")
    assert caught.value.message == (
        "DaemonSet istio-system/ztunnel-windows-ltsc2022: spec.template.spec pins no OS: it "
        "needs nodeSelector[kubernetes.io/os] or a required node affinity on kubernetes.io/os "
        f"({AFF}); not written"
    )


def test_write_refuses_a_daemonset_whose_os_name_disagrees() -> None:
    ds = _sample_daemonset("istio-cni-node")
    _pod(ds)["os"]["name"] = "windows"
    with pytest.raises(KubeError) as caught:
        writer.write(cast(Kube, NoRequests()), ds, None, MESH_OWNER)
    assert caught.value.reason == "Unplaced"
    assert caught.value.message == (
        "DaemonSet istio-system/istio-cni-node: spec.template.spec.os.name is 'windows' but "
        "spec.template.spec.nodeSelector[kubernetes.io/os] pins 'linux'; not written"
    )


@pytest.mark.parametrize(
    "name", ["ztunnel", "ztunnel-windows-ltsc2022", "istio-cni-node-windows-ltsc2025"]
)
def test_write_lets_a_rendered_daemonset_through(name: str) -> None:
    ds = _sample_daemonset(name)
    kube = Recording()
    writer.write(cast(Kube, kube), ds, None, MESH_OWNER)
    assert [call for call, _ in kube.calls] == ["apply"]
    # The object as rendered, with the precondition no stored object meets.
    sent = kube.calls[0][1]
    assert sent["metadata"].pop("resourceVersion") == "1"
    assert sent == ds


def test_write_lets_a_rendered_waypoint_deployment_through() -> None:
    (_, result), *_ = _waypoint_renders()
    (deployment,) = [o for o in result.objects if o["kind"] == "Deployment"]
    owner = Owner(c.GATEWAY_API_VERSION, "Gateway", "waypoint", "uid-gw")
    kube = Recording()
    writer.write(cast(Kube, kube), prepare(deployment, owner, "waypoints"), None, owner)
    assert [call for call, _ in kube.calls] == ["apply"]
    assert kube.calls[0][1]["kind"] == "Deployment"


def test_create_new_and_replace_refuse_an_unpinned_daemonset_too() -> None:
    ds = _unpinned("istio-cni-node-windows-ltsc2022")
    with pytest.raises(KubeError, match="Unplaced"):
        writer.create_new(cast(Kube, NoRequests()), ds)
    ds["metadata"]["resourceVersion"] = "3"
    with pytest.raises(KubeError, match="Unplaced"):
        writer.replace(cast(Kube, NoRequests()), ds)


# -- the webhook's patch -------------------------------------------------------------

MOVES_A_POD = (
    "/spec/nodeSelector",
    "/spec/affinity",
    "/spec/os",
    "/spec/tolerations",
    "/spec/nodeName",
)


def _touches(path: str, field: str) -> bool:
    """Whether a JSON-patch path changes `field`: the field, inside it, or a parent of it."""
    return path == field or path.startswith(field + "/") or (field + "/").startswith(path + "/")


def _webhook() -> Webhook:
    state = ClusterState()
    for node in yaml.safe_load(SAMPLE_NODES.read_text())["items"]:
        state.nodes[node["metadata"]["name"]] = node
    state.mesh = {"metadata": {"name": "default", "uid": "u"}, "spec": {}}
    state.namespaces["ns"] = {"labels": {c.LABEL_DATAPLANE_MODE: "ambient"}}
    # The operator's default registry (the chart's value), so unpinned pods get an image.
    return Webhook(
        state,
        cast(Kube, NoRequests()),
        WebhookOptions(url="https://127.0.0.1:9443"),
        default_registry="registry.example.com/ambient",
    )


def _windows_pod(**placement: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "labels": {}, "annotations": {}},
        "spec": {"containers": [{"name": "app", "image": "app:1"}], **placement},
    }


TOLERATE = [{"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"}]


@pytest.mark.parametrize(
    ("placement", "annotation"),
    [
        (
            {"nodeName": "win2022-1", "os": {"name": "windows"}},
            "injected; build=10.0.20348; reason=ScheduledOnPreWS2025Node",
        ),
        (
            {
                "os": {"name": "windows"},
                "nodeSelector": {OS: "windows", c.LABEL_WINDOWS_BUILD: WS2022},
                "tolerations": TOLERATE,
                "affinity": _terms(_os_in("windows")),
            },
            "injected; build=10.0.20348; reason=PinnedToPreWS2025Build",
        ),
        (
            {"nodeSelector": {OS: "windows"}, "tolerations": TOLERATE},
            "injected; build=any; reason=MayLandOnPreWS2025Node",
        ),
    ],
    ids=["bound-to-ws2022-node", "pinned-to-ws2022", "may-land-on-ws2022"],
)
def test_the_webhook_patch_never_moves_a_pod(placement: dict[str, Any], annotation: str) -> None:
    pod = _windows_pod(**placement)
    review = _review(pod)
    response = _webhook().review(review)["response"]
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert ops, "the workaround produced no patch operation"
    moving = [op for op in ops for f in MOVES_A_POD if _touches(op["path"], f)]
    assert moving == []
    patched = jsonpatch.apply_patch(pod, ops)
    assert patched["metadata"]["annotations"]["ambientoperator.io/redirection-wait"] == annotation
    assert patched["spec"]["initContainers"][0]["name"] == "ambient-redirection-wait"
    for key in ("nodeSelector", "affinity", "os", "tolerations", "nodeName"):
        assert patched["spec"].get(key) == placement.get(key)


@pytest.mark.parametrize(
    ("path", "moves"),
    [
        ("/spec/nodeSelector", True),
        ("/spec/nodeSelector/kubernetes.io~1os", True),
        ("/spec", True),
        ("", True),
        ("/spec/initContainers/0", False),
        ("/spec/volumes/-", False),
        ("/spec/osx", False),
        ("/metadata/annotations", False),
    ],
)
def test_the_path_check_sees_a_move(path: str, moves: bool) -> None:
    assert any(_touches(path, f) for f in MOVES_A_POD) == moves
