"""Two istiod revisions live, judged by Istio's own programs (issue 32).

Istio is installed from its charts the way a canary upgrade does it: base and
istiod (the default revision), then the istiod chart again with
`revision=canary` and `revisionTags={prod}`, which also writes the tag's
webhook `istio-revision-tag-prod`. Both run as real `pilot-discovery`
processes beside the operator.

The oracle for which istiod a waypoint talks to is istiod itself: the canary
istiod's deployment controller deploys a Gateway of class istio-waypoint
labelled `istio.io/rev=canary` (or the tag `prod`), and the default istiod
deploys an unlabelled one. Each of our waypoints must dial the same CA and
discovery address and carry the same `istio.io/rev` as istiod's own in the
same case. What each istiod's `/debug/ambientz` binds is read from both.

The agents then move to the canary revision (spec.istiod.revision), Linux
first, then WS2022, then WS2025, and back, which status calls a rollback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client

from ambient_devcluster import IstioControlPlane, LocalCluster, apply_objects
from ambient_devcluster.harness import condition, get_mesh, set_mesh_spec
from ambient_operator.api import constants as c
from conftest import BIN_DIR, own_cluster, unique_name, wait_for
from operator_harness import RunningOperator
from test_istiod import ambient_services, app, create_gateway, make_namespace
from test_versions_cluster import (
    SAMPLE,
    Recorder,
    _first,
    _list_daemonsets,
    _list_meshes,
    _timeline,
    settled,
)

TIMEOUT = 120.0
OURS, ISTIODS = "ambient-waypoint", c.ISTIO_WAYPOINT_CLASS
ZTUNNELS = ("ztunnel", "ztunnel-windows-ltsc2022", "ztunnel-windows-ltsc2025")


@pytest.fixture(scope="module")
def revisions_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Our own control plane: the sample nodes, our CRDs, Gateway API v1.6."""
    with own_cluster(tmp_path_factory, "revisions-cluster", "pilot-discovery") as local:
        yield local


@pytest.fixture(scope="module")
def stable(
    revisions_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IstioControlPlane]:
    """The default revision: base and istiod from the charts."""
    plane = IstioControlPlane(
        revisions_cluster.kubeconfig, tmp_path_factory.mktemp("istiod-stable"), BIN_DIR
    )
    with plane:
        yield plane
    assert "panic:" not in plane.log_file.read_text(errors="replace")


@pytest.fixture(scope="module")
def canary(
    revisions_cluster: LocalCluster,
    stable: IstioControlPlane,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[IstioControlPlane]:
    """The canary revision beside it, with the tag prod pointing at it."""
    plane = IstioControlPlane(
        revisions_cluster.kubeconfig,
        tmp_path_factory.mktemp("istiod-canary"),
        BIN_DIR,
        revision="canary",
        values={"revisionTags": "{prod}"},
    )
    with plane:
        yield plane
    assert "panic:" not in plane.log_file.read_text(errors="replace")


@pytest.fixture(scope="module")
def api(revisions_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    """Admin client of the module's cluster."""
    with revisions_cluster.api_client() as admin:
        yield admin


@pytest.fixture(scope="module")
def operator(
    revisions_cluster: LocalCluster,
    canary: IstioControlPlane,
    api: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    """The operator beside both istiods, with the sample AmbientMesh (default revision)."""
    op = RunningOperator(revisions_cluster, tmp_path_factory.mktemp("revisions-operator"))
    with op.running():
        apply_objects(api, [yaml.safe_load(SAMPLE.read_text())])
        yield op
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


def _dialled(api: client.ApiClient, namespace: str, name: str) -> tuple[str, str, str] | None:
    """(istio.io/rev of the pods, CA_ADDR, discoveryAddress) of a waypoint's Deployment."""
    try:
        dep = client.AppsV1Api(api).read_namespaced_deployment(name, namespace)
    except client.ApiException:
        return None
    env = {e.name: e.value for e in dep.spec.template.spec.containers[0].env or [] if e.value}
    proxy = json.loads(env.get("PROXY_CONFIG") or "{}")
    annotations = dep.spec.template.metadata.annotations or {}
    return (
        str(annotations.get("istio.io/rev")),
        str(env.get("CA_ADDR")),
        str(proxy.get("discoveryAddress")),
    )


def _pair(api: client.ApiClient, labels: dict[str, str]) -> tuple[Any, Any]:
    """(ours, istiod's): a Gateway of each class with `labels`, each in a namespace of its own."""
    ours, theirs = unique_name("rev-ours"), unique_name("rev-istiod")
    for ns, klass in ((ours, OURS), (theirs, ISTIODS)):
        make_namespace(api, ns, {})
        create_gateway(api, ns, "wp", klass, labels=labels)
    return (
        wait_for(lambda: _dialled(api, ours, "wp"), TIMEOUT, f"{ours}/wp deployed"),
        wait_for(lambda: _dialled(api, theirs, "wp"), TIMEOUT, f"{theirs}/wp deployed by istiod"),
    )


CANARY = ("canary", "istiod-canary.istio-system.svc:15012", "istiod-canary.istio-system.svc:15012")
DEFAULT = ("default", "istiod.istio-system.svc:15012", "istiod.istio-system.svc:15012")


def test_a_waypoint_talks_to_the_revision_its_gateway_names_as_istiod_decides(
    api: client.ApiClient, stable: IstioControlPlane, canary: IstioControlPlane, operator: Any
) -> None:
    rev = c.LABEL_REVISION
    # istiod's own default waypoint leaves the discovery address to its mesh config.
    assert _pair(api, {}) == (DEFAULT, (*DEFAULT[:2], "None"))
    assert _pair(api, {rev: "canary"}) == (CANARY, CANARY)
    # The tag, which istiod's canary resolves through istio-revision-tag-prod:
    # its waypoint says the revision, not the tag, and dials the revision's Service.
    assert _pair(api, {rev: "prod"}) == (CANARY, CANARY)


def _status_revisions(api: client.ApiClient) -> dict[str, Any]:
    return {r["name"]: r for r in (get_mesh(api).get("status") or {}).get("revisions") or []}


def _no_waypoints_of_ours(api: client.ApiClient) -> None:
    """Every Gateway of our class deleted (an earlier test's too), and status counting none."""
    custom = client.CustomObjectsApi(api)
    gateways = ("gateway.networking.k8s.io", "v1", "gateways")
    for gw in custom.list_cluster_custom_object(*gateways)["items"]:
        if gw["spec"]["gatewayClassName"] == OURS:
            meta = gw["metadata"]
            custom.delete_namespaced_custom_object(
                *gateways[:2], meta["namespace"], *gateways[2:], meta["name"]
            )
    wait_for(
        lambda: (
            not [
                gw
                for gw in custom.list_cluster_custom_object(*gateways)["items"]
                if gw["spec"]["gatewayClassName"] == OURS
            ]
        ),
        TIMEOUT,
        "no Gateway of our class left",
    )
    wait_for(
        lambda: sum(r.get("waypoints", 0) for r in _status_revisions(api).values()) == 0,
        TIMEOUT,
        "status.revisions counting no waypoint",
    )


def test_a_namespace_label_moves_its_waypoints_and_status_lists_each_revision(
    api: client.ApiClient, stable: IstioControlPlane, canary: IstioControlPlane, operator: Any
) -> None:
    # The counts below are this test's own Gateways alone, whatever ran before.
    _no_waypoints_of_ours(api)
    ns, other = unique_name("rev-ns"), unique_name("rev-other")
    make_namespace(api, ns, {c.LABEL_DATAPLANE_MODE: "ambient", c.LABEL_USE_WAYPOINT: "wp"})
    make_namespace(api, other, {})
    apply_objects(api, app(ns, "web", "linux-amd64-1"))
    for namespace, name in ((ns, "wp"), (ns, "wp2"), (other, "wp")):
        create_gateway(api, namespace, name, OURS)
        found = wait_for(lambda n=namespace, g=name: _dialled(api, n, g), TIMEOUT, "deployed")
        assert found == DEFAULT, (namespace, name, found)
    client.CoreV1Api(api).patch_namespace(ns, {"metadata": {"labels": {c.LABEL_REVISION: "prod"}}})
    for name in ("wp", "wp2"):
        wait_for(lambda g=name: _dialled(api, ns, g) == CANARY, TIMEOUT, f"{name} moved to canary")
    host = f"wp.{ns}.svc.cluster.local"

    def bound(plane: IstioControlPlane) -> bool:
        web = ambient_services(plane).get((ns, "web")) or {}
        return bool((web.get("waypoint") or {}).get("hostname", {}).get("hostname") == host)

    # What each istiod binds: Istio's ambient index reads every Gateway whatever
    # its revision (pkg/kube/multicluster/cluster.go builds the Gateway informer
    # with no revision filter), so both bind the Service to the waypoint; which
    # istiod configures the waypoint itself is the address it dials, above.
    wait_for(lambda: bound(canary), TIMEOUT, "the canary istiod binding web to wp")
    wait_for(lambda: bound(stable), TIMEOUT, "the default istiod binding web to wp")

    def revisions() -> dict[str, Any] | None:
        found = _status_revisions(api)
        return found if ns in (found.get("canary") or {}).get("namespaces", []) else None

    seen = wait_for(revisions, TIMEOUT, "status.revisions naming the namespace")
    assert seen["canary"]["tags"] == ["prod"] and seen["canary"]["istiod"] is True
    assert (seen["default"]["agents"], seen["canary"]["agents"]) == (True, False)
    # ns's two waypoints follow its label to canary; other's stays at default.
    assert (seen["canary"]["waypoints"], seen["default"]["waypoints"]) == (2, 1), seen


TAG_WEBHOOK = "istio-revision-tag-prod"


def _point_tag(api: client.ApiClient, revision: str) -> None:
    """Point the tag prod at `revision`, as `istioctl tag set prod --revision <r> --overwrite`
    does: istiod reads the tag's revision from this label (pkg/revisions)."""
    client.AdmissionregistrationV1Api(api).patch_mutating_webhook_configuration(
        TAG_WEBHOOK, {"metadata": {"labels": {c.LABEL_REVISION: revision}}}
    )


def test_a_moved_tag_moves_the_waypoints_that_name_it(
    api: client.ApiClient, stable: IstioControlPlane, canary: IstioControlPlane, operator: Any
) -> None:
    ns = unique_name("rev-tag")
    make_namespace(api, ns, {c.LABEL_REVISION: "prod"})
    create_gateway(api, ns, "wp", OURS)
    assert wait_for(lambda: _dialled(api, ns, "wp"), TIMEOUT, "wp deployed") == CANARY
    _point_tag(api, "default")
    try:
        # Tags are read once per pass: the next pass sees the tag's new revision.
        wait_for(lambda: _dialled(api, ns, "wp") == DEFAULT, TIMEOUT, "wp moved with the tag")

        def tagged() -> dict[str, Any] | None:
            found = _status_revisions(api)
            return found if (found.get("default") or {}).get("tags") == ["prod"] else None

        seen = wait_for(tagged, TIMEOUT, "status.revisions: prod points at default")
        # (An earlier test's namespace labelled prod moves too: membership, not a list.)
        assert ns in seen["default"]["namespaces"], seen
        assert seen["canary"]["tags"] == [] and ns not in seen["canary"]["namespaces"], seen
        # A Gateway created now follows the tag where it points now.
        create_gateway(api, ns, "wp2", OURS)
        assert wait_for(lambda: _dialled(api, ns, "wp2"), TIMEOUT, "wp2 deployed") == DEFAULT
    finally:
        _point_tag(api, "canary")
    wait_for(lambda: _dialled(api, ns, "wp") == CANARY, TIMEOUT, "wp back with the tag")


def _serving(ds: dict[str, Any]) -> str:
    annotations = ds["spec"]["template"]["metadata"].get("annotations") or {}
    return str(annotations.get(c.LABEL_REVISION, "default"))


def _ztunnels_at(api: client.ApiClient, revision: str) -> bool:
    items = {d["metadata"]["name"]: d for d in _list_daemonsets(api)()["items"]}
    return all(
        n in items and _serving(items[n]) == revision and settled(items[n]) for n in ZTUNNELS
    )


def _move(api: client.ApiClient, revision: str | None) -> tuple[Recorder, Recorder]:
    spec = dict(get_mesh(api)["spec"])
    istiod = dict(spec.get("istiod") or {})
    # The sample names the Service istiod; the revision names the Service here.
    istiod.pop("serviceName", None)
    if revision is None:
        istiod.pop("revision", None)
    else:
        istiod["revision"] = revision
    spec["istiod"] = istiod
    with (
        Recorder(_list_daemonsets(api)) as daemonsets,
        Recorder(_list_meshes(api)) as meshes,
    ):
        set_mesh_spec(api, spec)
        target = revision or "default"
        wait_for(lambda: _ztunnels_at(api, target), TIMEOUT * 2, f"every ztunnel at {target}")
    return daemonsets, meshes


def _assert_in_order(daemonsets: Recorder, revision: str) -> None:
    timeline = _timeline(daemonsets.initial, daemonsets.events)

    def moved(name: str) -> Any:
        return lambda state: name in state and _serving(state[name]) == revision

    def ready(name: str) -> Any:
        return lambda state: moved(name)(state) and settled(state[name])

    linux, ws2022, ws2025 = ZTUNNELS
    seen = [(e["object"]["metadata"]["name"], _serving(e["object"])) for e in daemonsets.events]
    assert (
        0
        < _first(timeline, moved(linux))
        < _first(timeline, ready(linux))
        < _first(timeline, moved(ws2022))
        < _first(timeline, ready(ws2022))
        < _first(timeline, moved(ws2025))
    ), seen


def test_the_agents_move_to_the_canary_linux_first_and_back_as_a_rollback(
    api: client.ApiClient, stable: IstioControlPlane, canary: IstioControlPlane, operator: Any
) -> None:
    wait_for(lambda: _ztunnels_at(api, "default"), TIMEOUT, "every ztunnel at default")
    daemonsets, _ = _move(api, "canary")
    _assert_in_order(daemonsets, "canary")
    versions = get_mesh(api)["status"]["versions"]
    assert (versions["revision"], versions.get("rollback")) == ("canary", None)
    daemonsets, meshes = _move(api, None)
    _assert_in_order(daemonsets, "default")
    said = {
        (e["object"].get("status") or {}).get("versions", {}).get("rollback") for e in meshes.events
    } - {None}
    assert said == {"from istiod revision canary to default"}, said
    messages = [
        condition(e["object"], "Reconciled").get("message", "")
        for e in meshes.events
        if (e["object"].get("status") or {}).get("versions", {}).get("rollback")
    ]
    assert any(
        "rolling the agents back from istiod revision canary to default" in m for m in messages
    )
