"""Helm's release records: which objects a release holds, as Helm itself knows them.

Helm 3 keeps each revision of a release in a Secret of the release's
namespace, named `sh.helm.release.v1.<release>.v<revision>`, of type
`helm.sh/release.v1` and labelled `owner=helm`, `name=<release>`,
`status=<status>`, `version=<revision>`. Its `release` key holds the release
as JSON, gzipped and base64-encoded by Helm (the API server's own base64
of Secret data comes on top). The JSON's `manifest` is every object Helm
applied, as YAML documents; an object written without a namespace went to
the release's namespace when its kind is namespaced.

:func:`read_releases` reads the deployed revision of each release of a
namespace; :func:`parse_record` decodes one Secret (pure). A record that
cannot be read is an error, never an empty release: a take-over decided on
a guess could take the wrong objects.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from ambient_operator.kube.client import Kube
from ambient_operator.kube.resources import KINDS

RECORD_TYPE = "helm.sh/release.v1"
RECORD_SELECTOR = "owner=helm"
DEPLOYED = "deployed"
_GZIP_MAGIC = b"\x1f\x8b"
# Cluster-scoped kinds Istio's charts (or a user's additions to a release)
# may hold that the operator has no Kind entry for; every other kind not in
# KINDS is taken as namespaced, as nearly all are.
_CLUSTER_SCOPED = frozenset(
    {
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition"),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"),
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy"),
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding"),
        ("scheduling.k8s.io/v1", "PriorityClass"),
        ("storage.k8s.io/v1", "StorageClass"),
    }
)


class ReleaseRecordError(Exception):
    """A Helm release record that cannot be read (its Secret named in the message)."""


@dataclass(frozen=True)
class ReleaseObject:
    """One object of a release's manifest: what Helm created and would delete."""

    api_version: str
    kind: str
    namespace: str | None
    name: str

    def describe(self) -> str:
        """`Kind namespace/name`, or `Kind name` when cluster-scoped (as ownership.describe)."""
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


@dataclass(frozen=True)
class HelmRelease:
    """The deployed revision of one Helm release."""

    name: str
    namespace: str
    version: int
    status: str
    chart: str
    chart_version: str
    app_version: str
    # The values the user gave (helm get values), not the chart's defaults.
    values: Mapping[str, Any]
    objects: tuple[ReleaseObject, ...]
    # The Secret this was read from.
    record: str


def _namespaced(api_version: str, kind: str) -> bool:
    known = KINDS.get((api_version, kind))
    if known is not None:
        return known.namespaced
    return (api_version, kind) not in _CLUSTER_SCOPED


def manifest_objects(manifest: str, namespace: str, record: str) -> tuple[ReleaseObject, ...]:
    """The objects of a release manifest, each with the namespace Helm put it in."""
    out: list[ReleaseObject] = []
    try:
        documents = list(yaml.safe_load_all(manifest))
    except yaml.YAMLError as exc:
        raise ReleaseRecordError(
            f"Secret {namespace}/{record}: its manifest is not YAML: {exc}"
        ) from exc
    for doc in documents:
        if not doc:
            continue
        if not isinstance(doc, Mapping):
            raise ReleaseRecordError(
                f"Secret {namespace}/{record}: its manifest holds a document that is not an object"
            )
        meta = doc.get("metadata") or {}
        api_version, kind, name = doc.get("apiVersion"), doc.get("kind"), meta.get("name")
        if not (isinstance(api_version, str) and isinstance(kind, str) and isinstance(name, str)):
            raise ReleaseRecordError(
                f"Secret {namespace}/{record}: its manifest holds an object without apiVersion, "
                "kind or metadata.name"
            )
        where = None
        if _namespaced(api_version, kind):
            where = str(meta.get("namespace") or namespace)
        out.append(ReleaseObject(api_version, kind, where, name))
    return tuple(out)


def parse_record(secret: Mapping[str, Any]) -> HelmRelease:
    """One release record (a Secret as the API server returns it), decoded."""
    meta = secret.get("metadata") or {}
    record, namespace = str(meta.get("name", "?")), str(meta.get("namespace", "?"))
    where = f"Secret {namespace}/{record}"
    payload = (secret.get("data") or {}).get("release")
    if not isinstance(payload, str):
        raise ReleaseRecordError(f"{where}: no `release` key")
    try:
        raw = base64.b64decode(base64.b64decode(payload, validate=True), validate=True)
        if raw[:2] == _GZIP_MAGIC:
            raw = gzip.decompress(raw)
        body = json.loads(raw)
    except (binascii.Error, OSError, EOFError, ValueError) as exc:
        raise ReleaseRecordError(f"{where}: not a Helm release record ({exc})") from exc
    if not isinstance(body, Mapping):
        raise ReleaseRecordError(f"{where}: not a Helm release record (not a JSON object)")
    chart_meta = ((body.get("chart") or {}).get("metadata")) or {}
    info = body.get("info") or {}
    values = body.get("config") or {}
    return HelmRelease(
        name=str(body.get("name", "")),
        namespace=str(body.get("namespace") or namespace),
        version=int(body.get("version") or 0),
        status=str(info.get("status", "")),
        chart=str(chart_meta.get("name", "")),
        chart_version=str(chart_meta.get("version", "")),
        app_version=str(chart_meta.get("appVersion", "")),
        values=values if isinstance(values, Mapping) else {},
        objects=manifest_objects(str(body.get("manifest") or ""), namespace, record),
        record=record,
    )


def read_releases(kube: Kube, namespace: str) -> dict[str, HelmRelease]:
    """The deployed revision of each Helm release in `namespace`, by release name.

    Only records labelled `status=deployed` are decoded: Helm keeps exactly
    one per release (superseded and failed revisions carry other statuses).
    """
    secrets = kube.list(KINDS[("v1", "Secret")], namespace, f"{RECORD_SELECTOR},status={DEPLOYED}")
    out: dict[str, HelmRelease] = {}
    for secret in secrets:
        if secret.get("type") != RECORD_TYPE:
            continue
        release = parse_record(secret)
        held = out.get(release.name)
        if held is None or release.version > held.version:
            out[release.name] = release
    return out
