"""spec.istioCni.provider multus on the real API server, as the chart's ServiceAccount.

Upstream's istio-cni chart renders a NetworkAttachmentDefinition (Multus's
CRD, k8s.cni.cncf.io/v1) named istio-cni in namespace default when its
provider is multus; tests/test_helm_values.py holds ours to it through the
real helm. Here, with data-plane passes in process as the chart's
ServiceAccount with the chart's arguments (test_ownership_dataplane's
InProcess), on the shared AmbientMesh:

- with the chart value multus.enabled and no Multus (the kind not served):
  the rest of the data plane is applied (Reconciled=True) and Degraded says
  MultusNotAvailable, with what to do; once Multus's CRD (a minimal one,
  literal below) is installed, a later pass writes the attachment, owned by
  the mesh, and Degraded no longer says so; unset, it is pruned;
- a namesake that is not ours: NameConflict naming it, left as it was; once
  the name is free ours takes it;
- without the chart value: no watch of the kind at all, Degraded says to set
  multus.enabled;
- and not one request of the operator answered Forbidden.

Expected values are literal.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import test_chart_rbac as chart_rbac
from ambient_devcluster import LocalCluster
from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.render import RenderResult, render_dataplane
from conftest import wait_for
from operator_harness import AuditLog
from test_chart_rbac import Identity, chart_identity
from test_ownership_dataplane import (
    AGENTS,
    TIMEOUT,
    InProcess,
    current,
    patch_spec,
)
from test_render import MIXED

# Reused, not copied: the shared AmbientMesh and the audit log.
audit = chart_rbac.audit
mesh = chart_rbac.mesh

GROUP, VERSION, PLURAL = "k8s.cni.cncf.io", "v1", "network-attachment-definitions"
NAME, NAMESPACE = "istio-cni", "default"
CRD_NAME = f"{PLURAL}.{GROUP}"
# Multus's CRD, cut to what the API server needs to serve the kind.
NAD_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": CRD_NAME},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {
            "plural": PLURAL,
            "singular": "network-attachment-definition",
            "kind": "NetworkAttachmentDefinition",
            "shortNames": ["net-attach-def"],
        },
        "versions": [
            {
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"config": {"type": "string"}},
                            }
                        },
                    }
                },
            }
        ],
    },
}
MULTUS = {"istioCni": {"provider": "multus"}}
UNSET = {"istioCni": {"provider": None}}


# -- offline: what render makes of the field -------------------------------------------------


def _render(spec: dict[str, Any], attachments: str = "served") -> RenderResult:
    facts = ClusterFacts(MIXED, "10.96.0.20", "10.96.0.10", network_attachments=attachments)
    return render_dataplane(AmbientMeshSpec.model_validate(spec), facts)


def _attachments(result: RenderResult) -> list[dict[str, Any]]:
    return [o for o in result.objects if o["kind"] == "NetworkAttachmentDefinition"]


def test_multus_renders_one_attachment_in_default_and_nothing_else_changes() -> None:
    plain, multus = _render({}), _render(MULTUS)
    (found,) = _attachments(multus)
    assert (found["apiVersion"], found["metadata"]["namespace"], found["metadata"]["name"]) == (
        "k8s.cni.cncf.io/v1",
        NAMESPACE,
        NAME,
    )
    assert "spec" not in found
    assert [o for o in multus.objects if o is not found] == list(plain.objects)
    assert multus.problems == () and _attachments(plain) == []


@pytest.mark.parametrize(
    ("attachments", "said"),
    [
        ("not served", "Multus is not installed. Install Multus"),
        ("not granted", "--set multus.enabled=true"),
    ],
)
def test_an_attachment_that_cannot_be_written_is_a_problem_and_the_rest_is_rendered(
    attachments: str, said: str
) -> None:
    result = _render(MULTUS, attachments)
    assert _attachments(result) == []
    assert [o["metadata"]["name"] for o in result.objects] == [
        o["metadata"]["name"] for o in _render({}).objects
    ]
    (problem,) = result.problems
    assert problem.reason == "MultusNotAvailable"
    assert said in problem.message and "unset spec.istioCni.provider" in problem.message


def test_no_attachment_without_linux_agents() -> None:
    result = _render({**MULTUS, "platforms": {"linux": {"enabled": False}}}, "not served")
    assert _attachments(result) == [] and result.problems == ()


# -- on the API server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def identity(cluster: LocalCluster, k8s: client.ApiClient) -> Iterator[Identity]:
    """The chart's RBAC with multus.enabled."""
    with chart_identity(cluster, k8s, {"multus": {"enabled": True}}) as ident:
        yield ident


def _crds(k8s: client.ApiClient) -> client.ApiextensionsV1Api:
    return client.ApiextensionsV1Api(k8s)


def _served(k8s: client.ApiClient) -> bool:
    try:
        found = client.CustomObjectsApi(k8s).list_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        return False
    return isinstance(found, dict)


def _uninstall_multus(k8s: client.ApiClient) -> None:
    with contextlib.suppress(ApiException):
        _crds(k8s).delete_custom_resource_definition(CRD_NAME)
    wait_for(lambda: not _served(k8s), TIMEOUT, "the NetworkAttachmentDefinition kind gone")


def _install_multus(k8s: client.ApiClient) -> None:
    _crds(k8s).create_custom_resource_definition(NAD_CRD)
    wait_for(lambda: _served(k8s), TIMEOUT, "the NetworkAttachmentDefinition kind served")


def _attachment(k8s: client.ApiClient) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = client.CustomObjectsApi(k8s).get_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, PLURAL, NAME
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        return None
    return found


def _ours(found: dict[str, Any] | None, uid: str) -> bool:
    refs = ((found or {}).get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("uid") == uid for ref in refs)


@pytest.fixture
def no_multus(k8s: client.ApiClient) -> Iterator[None]:
    _uninstall_multus(k8s)
    yield
    patch_spec(k8s, UNSET)
    _uninstall_multus(k8s)


# How our problem begins in Degraded's message. Its reason is the most severe
# problem's (the shared cluster has no istiod: IstiodNotFound), and the message
# tells every problem once.
SAID = "spec.istioCni.provider is multus, but NetworkAttachmentDefinition default/istio-cni"


def _degraded(k8s: client.ApiClient) -> str:
    """Degraded's message while Degraded, else ""."""
    cond = current(k8s, "Degraded")
    return str(cond.get("message")) if cond.get("status") == "True" else ""


def _pruned_and_never_forbidden(
    run: InProcess, k8s: client.ApiClient, audit: AuditLog, mark: int, identity: Identity
) -> None:
    """Once the spec no longer asks: the attachment pruned, and no request refused since `mark`."""
    run.converge(k8s, AGENTS)
    assert _attachment(k8s) is None
    assert chart_rbac.forbidden(audit, mark, identity) == []


def test_multus_installed_later_gets_the_attachment_and_the_rest_never_waits(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: chart_rbac.Mesh,
    identity: Identity,
    audit: AuditLog,
    no_multus: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))  # Operator() sets it; put back
    assert "--network-attachments" in identity.operator_args
    run = InProcess(identity.kubeconfig, identity.operator_args)
    uid = run.converge(k8s, AGENTS)
    mark = audit.mark()
    patch_spec(k8s, MULTUS)
    run.run_pass()
    assert current(k8s, "Reconciled")["status"] == "True"
    message = _degraded(k8s)
    assert SAID in message, message
    assert "does not serve NetworkAttachmentDefinition (k8s.cni.cncf.io/v1)" in message
    assert "Install Multus" in message and "unset spec.istioCni.provider" in message
    _install_multus(k8s)

    def written() -> bool:
        run.run_pass()
        return _ours(_attachment(k8s), uid)

    wait_for(written, TIMEOUT, "the NetworkAttachmentDefinition written by a later pass")
    found = _attachment(k8s) or {}
    labels = found["metadata"]["labels"]
    assert (labels[c.LABEL_MANAGED_BY], labels["app.kubernetes.io/name"]) == (
        c.MANAGED_BY,
        "istio-cni",
    )
    assert "spec" not in found
    run.converge(k8s, AGENTS)
    assert SAID not in _degraded(k8s)
    patch_spec(k8s, UNSET)
    _pruned_and_never_forbidden(run, k8s, audit, mark, identity)


def test_a_namesake_of_somebody_else_is_a_name_conflict_and_left_alone(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: chart_rbac.Mesh,
    identity: Identity,
    audit: AuditLog,
    no_multus: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    _install_multus(k8s)
    custom = client.CustomObjectsApi(k8s)
    run = InProcess(identity.kubeconfig, identity.operator_args)
    uid = run.converge(k8s, AGENTS)
    # The attachment an OpenShift install of Istio's chart leaves behind.
    custom.create_namespaced_custom_object(
        GROUP,
        VERSION,
        NAMESPACE,
        PLURAL,
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": NAME, "labels": {c.LABEL_MANAGED_BY: "Helm"}},
        },
        field_manager="helm",
    )
    theirs = _attachment(k8s) or {}
    mark = audit.mark()
    patch_spec(k8s, MULTUS)
    try:
        for _ in range(2):
            run.run_pass()
        cond = current(k8s, "Reconciled")
        assert cond["reason"] == "NameConflict", cond
        assert f"NetworkAttachmentDefinition {NAMESPACE}/{NAME}" in cond["message"]
        assert _attachment(k8s) == theirs
        # Once the name is free, ours takes it.
        custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NAME)
        run.converge(k8s, AGENTS)
        assert _ours(_attachment(k8s), uid)
    finally:
        found = _attachment(k8s)
        if found is not None and not _ours(found, uid):
            custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, NAME)
        patch_spec(k8s, UNSET)
    _pruned_and_never_forbidden(run, k8s, audit, mark, identity)


def test_without_the_chart_value_the_kind_is_not_watched_and_degraded_says_so(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: chart_rbac.Mesh,
    audit: AuditLog,
    no_multus: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    _install_multus(k8s)
    with chart_identity(cluster, k8s) as plain:
        assert "--network-attachments" not in plain.operator_args
        run = InProcess(plain.kubeconfig, plain.operator_args)
        run.converge(k8s, AGENTS)
        mark = audit.mark()
        patch_spec(k8s, MULTUS)
        run.run_pass()
        assert current(k8s, "Reconciled")["status"] == "True"
        message = _degraded(k8s)
        assert SAID in message, message
        assert "--set multus.enabled=true" in message
        assert _attachment(k8s) is None
        # Not a request for the kind, so none refused.
        requests = [e.get("requestURI", "") for e in audit.events(mark, user=plain.user)]
        assert not [r for r in requests if PLURAL in r], requests
        assert chart_rbac.forbidden(audit, mark, plain) == []
