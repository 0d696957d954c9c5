"""Where each kind we touch lives in the REST API.

A fixed table instead of discovery: the operator only ever touches these
kinds, and discovery would cost a burst of requests on every start.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote

from ambient_operator.api.constants import FIELD_MANAGER

# apimachinery's IsDNS1123Subdomain and IsDNS1123Label. fullmatch, because
# `$` would let a trailing newline through.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SHOWN = 64
# How deep a cached copy keeps our field sets (see cached_copy): spec.replicas.
FIELD_SET_DEPTH = 2
# What a cached copy keeps of each managedFields entry.
_ENTRY_KEYS = ("manager", "operation", "subresource", "apiVersion")

NameRule = Literal["subdomain", "label", "segment"]


class InvalidNameError(ValueError):
    """A name or namespace no object can carry; refused before any request is made."""


def shown(value: str) -> str:
    # The value may come from an annotation: bounded in messages and logs.
    return repr(value if len(value) <= _SHOWN else value[:_SHOWN] + "...")


def why_not_a_name(name: str, rule: NameRule = "subdomain") -> str | None:
    """Why `name` cannot name an object under this rule, or None when it can."""
    if rule == "segment":
        # RBAC names (apimachinery IsPathSegmentName): anything that stays one
        # path segment, which is how `system:controller:...` names exist.
        if not name or name in (".", "..") or "/" in name or "%" in name:
            return "must be non-empty, not '.' or '..', and without '/' or '%'"
        return None
    if rule == "label":
        if len(name) > 63 or not _LABEL.fullmatch(name):
            return (
                "must be a DNS-1123 label: lowercase letters, digits and '-', starting and "
                "ending with a letter or digit, at most 63 characters"
            )
        return None
    if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
        return (
            "must be a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', starting "
            "and ending with a letter or digit, at most 253 characters"
        )
    return None


def _segment(value: str) -> str:
    # safe="": a '/' that slipped through would otherwise start another segment.
    return quote(value, safe="")


@dataclass(frozen=True)
class Kind:
    """One REST resource."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool
    # What the API server validates this kind's names against.
    names: NameRule = "subdomain"

    @property
    def group(self) -> str:
        """API group ('' for core)."""
        return self.api_version.rpartition("/")[0]

    def collection(self, namespace: str | None = None) -> str:
        """Path of the collection, across namespaces when namespace is None.

        Raises InvalidNameError for a namespace that is not a DNS-1123 label.
        """
        base = f"/api/{self.api_version}" if not self.group else f"/apis/{self.api_version}"
        if self.namespaced and namespace:
            problem = why_not_a_name(namespace, "label")
            if problem:
                raise InvalidNameError(f"namespace {shown(namespace)} of a {self.kind}: {problem}")
            return f"{base}/namespaces/{_segment(namespace)}/{self.plural}"
        return f"{base}/{self.plural}"

    def path(self, name: str, namespace: str | None = None) -> str:
        """Path of one object.

        Raises InvalidNameError for a name the API server would not take for this
        kind, or a namespace that is not a DNS-1123 label.
        """
        if self.namespaced and not namespace:
            raise ValueError(f"{self.kind} {name} needs a namespace")
        problem = why_not_a_name(name, self.names)
        if problem:
            raise InvalidNameError(f"{self.kind} name {shown(name)}: {problem}")
        return f"{self.collection(namespace)}/{_segment(name)}"


_KINDS = [
    Kind("v1", "ServiceAccount", "serviceaccounts", True),
    Kind("v1", "ConfigMap", "configmaps", True),
    Kind("v1", "ResourceQuota", "resourcequotas", True),
    Kind("v1", "Service", "services", True),
    Kind("v1", "Secret", "secrets", True),
    Kind("v1", "Namespace", "namespaces", False, names="label"),
    Kind("v1", "Node", "nodes", False),
    Kind("v1", "Pod", "pods", True),
    Kind("v1", "Event", "events", True),
    Kind("apps/v1", "DaemonSet", "daemonsets", True),
    Kind("apps/v1", "Deployment", "deployments", True),
    Kind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers", True),
    Kind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets", True),
    Kind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies", True),
    # Multus's CRD: served only where Multus is installed.
    Kind(
        "k8s.cni.cncf.io/v1", "NetworkAttachmentDefinition", "network-attachment-definitions", True
    ),
    Kind("coordination.k8s.io/v1", "Lease", "leases", True),
    Kind("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", False, names="segment"),
    Kind(
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        False,
        names="segment",
    ),
    Kind("rbac.authorization.k8s.io/v1", "Role", "roles", True, names="segment"),
    Kind("rbac.authorization.k8s.io/v1", "RoleBinding", "rolebindings", True, names="segment"),
    Kind(
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        False,
    ),
    Kind("gateway.networking.k8s.io/v1", "Gateway", "gateways", True),
    Kind("gateway.networking.k8s.io/v1", "GatewayClass", "gatewayclasses", False),
    Kind("ambientoperator.io/v1alpha1", "AmbientMesh", "ambientmeshes", False),
    Kind(
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        False,
    ),
]
KINDS: dict[tuple[str, str], Kind] = {(k.api_version, k.kind): k for k in _KINDS}


def kind_of(obj: dict[str, Any]) -> Kind:
    """The Kind of an object by its apiVersion and kind."""
    key = (obj.get("apiVersion", ""), obj.get("kind", ""))
    try:
        return KINDS[key]
    except KeyError:
        raise ValueError(f"unknown kind {key[0]}/{key[1]}") from None


def resource_version(obj: Mapping[str, Any] | None) -> int:
    """An object's resourceVersion as a number; 0 when missing or not a number."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except (TypeError, ValueError):
        return 0


ObjectKey = tuple[str, str, str, str]


def key_of(obj: Mapping[str, Any]) -> ObjectKey:
    """(apiVersion, kind, namespace, name) of an object."""
    meta = obj.get("metadata", {})
    return (
        str(obj.get("apiVersion")),
        str(obj.get("kind")),
        meta.get("namespace") or "",
        str(meta.get("name")),
    )


def _shared(value: Any) -> Any:
    """A copy of JSON data whose strings are interned: one copy of each across the caches.

    A parsed object has a string of its own for every key and value; the
    caches hold thousands of objects whose keys and most values (labels,
    images, env names, field paths) are the same. Interned strings are
    mortal: one no cached object holds any more is freed.
    """
    if isinstance(value, str):
        return sys.intern(value)
    if isinstance(value, Mapping):
        return {sys.intern(str(k)): _shared(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shared(v) for v in value]
    return value


def _field_set_head(fields: Any, depth: int = FIELD_SET_DEPTH) -> dict[str, Any]:
    """The first `depth` levels of a fieldsV1 set, interned."""
    if depth <= 0 or not isinstance(fields, Mapping):
        return {}
    return {sys.intern(str(k)): _field_set_head(v, depth - 1) for k, v in fields.items()}


def cached_copy(obj: Mapping[str, Any], field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
    """A copy of an object as a cache keeps it: managedFields cut down, strings shared.

    Ownership (apply/ownership.py) reads every manager's name, operation and
    subresource, and `applies_field` whether our entries hold a field
    FIELD_SET_DEPTH levels down (spec.replicas); nothing reads more of
    managedFields from a cache, and it was a third of a waypoint Deployment's
    weight. Anything that writes managedFields back, or reads another
    manager's fields, reads the object again first (apply/writer.py's claim,
    a take-over). Strings are interned (`_shared`): a waypoint's objects
    cost a third of their parsed size.
    """
    meta = obj.get("metadata") or {}
    out = {sys.intern(str(k)): _shared(v) for k, v in obj.items() if k != "metadata"}
    kept = out["metadata"] = {
        sys.intern(str(k)): _shared(v) for k, v in meta.items() if k != "managedFields"
    }
    entries = meta.get("managedFields")
    if entries:
        kept["managedFields"] = [_entry(entry, field_manager) for entry in entries]
    return out


def _entry(entry: Any, field_manager: str) -> Any:
    if not isinstance(entry, Mapping):
        return _shared(entry)
    out: dict[str, Any] = {
        k: sys.intern(str(entry[k])) for k in _ENTRY_KEYS if entry.get(k) is not None
    }
    if entry.get("manager") == field_manager and "fieldsV1" in entry:
        out["fieldsV1"] = _field_set_head(entry["fieldsV1"])
    return out
