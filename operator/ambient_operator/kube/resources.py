"""Where each kind we touch lives in the REST API.

A fixed table instead of discovery: the operator only ever touches these
kinds, and discovery would cost a burst of requests on every start.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote


@dataclass(frozen=True)
class Kind:
    """One REST resource."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def group(self) -> str:
        """API group ('' for core)."""
        return self.api_version.rpartition("/")[0]

    def collection(self, namespace: str | None = None) -> str:
        """Path of the collection, across namespaces when namespace is None."""
        base = f"/api/{self.api_version}" if not self.group else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            return f"{base}/namespaces/{quote(namespace)}/{self.plural}"
        return f"{base}/{self.plural}"

    def path(self, name: str, namespace: str | None = None) -> str:
        """Path of one object."""
        if self.namespaced and not namespace:
            raise ValueError(f"{self.kind} {name} needs a namespace")
        return f"{self.collection(namespace)}/{quote(name)}"


_KINDS = [
    Kind("v1", "ServiceAccount", "serviceaccounts", True),
    Kind("v1", "ConfigMap", "configmaps", True),
    Kind("v1", "Service", "services", True),
    Kind("v1", "Secret", "secrets", True),
    Kind("v1", "Namespace", "namespaces", False),
    Kind("v1", "Node", "nodes", False),
    Kind("v1", "Pod", "pods", True),
    Kind("v1", "Event", "events", True),
    Kind("apps/v1", "DaemonSet", "daemonsets", True),
    Kind("apps/v1", "Deployment", "deployments", True),
    Kind("coordination.k8s.io/v1", "Lease", "leases", True),
    Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False),
    Kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", False),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles", True),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True),
    Kind(
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        False,
    ),
    Kind("gateway.networking.k8s.io/v1", "Gateway", "gateways", True),
    Kind("gateway.networking.k8s.io/v1", "GatewayClass", "gatewayclasses", False),
    Kind("ambientoperator.io/v1alpha1", "AmbientMesh", "ambientmeshes", False),
]
KINDS: dict[tuple[str, str], Kind] = {(k.api_version, k.kind): k for k in _KINDS}


def kind_of(obj: dict[str, Any]) -> Kind:
    """The Kind of an object by its apiVersion and kind."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    try:
        return KINDS[key]
    except KeyError:
        raise ValueError(f"unknown kind {key[0]}/{key[1]}") from None


def ref(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    """(apiVersion, kind, namespace, name): the identity of an object."""
    meta = obj.get("metadata", {})
    return (obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])


def resource_version(obj: Mapping[str, Any] | None) -> int:
    """An object's resourceVersion as a number; 0 when missing or not a number."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0
