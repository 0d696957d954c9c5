"""`ambient-operator precheck`: read a live cluster and say whether ambient will work there.

Only reads (GET and LIST; tests/test_one_writer.py holds it to that), so it
runs before installing anything, or after. What it reads becomes a
`status.precheck.Snapshot`; the judgement is that module's table. Objects
the caller may not read are named once, and the checks go on without them.

Exit codes: 0 nothing blocks (warnings may be shown), 1 something blocks,
3 the cluster could not be read at all.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, HeldTemplates, RevisionStatus
from ambient_operator.apply.adopt import (
    CHARTS,
    HELM_MANAGED_BY,
    MANAGED_BY_LABEL,
    TAKEABLE_KINDS,
    release_key,
)
from ambient_operator.cli.kubeargs import add_kube_flags, kube_for
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.cluster.helm_releases import ReleaseRecordError, read_releases
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.credentials import CredentialsError
from ambient_operator.kube.resources import KINDS, Kind, ObjectKey
from ambient_operator.render.waypoints.listeners import is_waypoint
from ambient_operator.status import precheck as p
from ambient_operator.webhook import decide as d
from ambient_operator.webhook.config import CONFIG_NAME
from ambient_operator.webhook.misses import suspect_of
from ambient_operator.webhook.review import RUNTIME_CLASS

EXIT_OK, EXIT_BLOCKED, EXIT_UNREACHABLE = 0, 1, 3
CRD = KINDS[("apiextensions.k8s.io/v1", "CustomResourceDefinition")]
ENDPOINT_SLICE = Kind("discovery.k8s.io/v1", "EndpointSlice", "endpointslices", True)
MESH = KINDS[(f"{c.API_GROUP}/{c.API_VERSION}", c.KIND)]
WEBHOOK_CONFIG = KINDS[("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")]
LEVEL_MARKS = {
    p.OK: "ok",
    p.INFO: "--",
    p.WARNING: "WARN",
    p.BLOCKING: "BLOCK",
}


class Reader:
    """GETs and LISTs that name what they could not read instead of failing."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.unreadable: list[str] = []

    def refused(self, what: str, exc: KubeError) -> None:
        """Name what RBAC kept from us; any other error is the caller's."""
        if exc.status in (401, 403):
            self.unreadable.append(f"{what}: {exc.reason or 'forbidden'}")
            return
        raise exc

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        try:
            return self.kube.get(kind, name, namespace)
        except KubeError as exc:
            self.refused(f"{kind.plural} {name}", exc)
            return None

    def items(
        self, kind: Kind, namespace: str | None = None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        try:
            return list(self.kube.iter_list(kind, namespace, label_selector))
        except KubeError as exc:
            if exc.status == 404:
                return []  # not served: Gateway API or RuntimeClasses absent
            self.refused(kind.plural, exc)
            return []

    def served(self, kind: Kind) -> bool:
        """Whether the API server serves a kind (our CRD is absent before installing)."""
        try:
            self.kube.request("GET", kind.collection(), query=[("limit", "1")])
        except KubeError as exc:
            if exc.status != 404:
                self.refused(kind.plural, exc)
            return False
        return True


def _kube_version(kube: Kube) -> tuple[tuple[int, int] | None, str]:
    """(major, minor) the API server reports, and its version text.

    Servers built from source leave major and minor empty; their emulated
    version (Kubernetes 1.31 and later) still names the release.
    """
    info = kube.request("GET", "/version") or {}
    text = str(info.get("gitVersion") or "unknown")
    for major_key, minor_key in (("major", "minor"), ("emulationMajor", "emulationMinor")):
        major = str(info.get(major_key) or "").rstrip("+")
        minor = str(info.get(minor_key) or "").rstrip("+")
        if major.isdigit() and minor.isdigit() and major != "0":
            return (int(major), int(minor)), text
    return None, text


def _mesh_spec(mesh: Mapping[str, Any] | None, unreadable: list[str]) -> AmbientMeshSpec:
    try:
        return AmbientMeshSpec.model_validate((mesh or {}).get("spec") or {})
    except ValidationError as exc:
        unreadable.append(
            f"AmbientMesh {c.MESH_NAME}: invalid spec ({exc.error_count()} errors); "
            "the defaults are checked instead"
        )
        return AmbientMeshSpec()


def windows_misses(
    pods: Iterable[Mapping[str, Any]],
    namespaces: Mapping[str, Mapping[str, str]],
    mesh: Mapping[str, Any] | None,
    nodes: list[NodeFacts],
    runtime_classes: Mapping[str, Mapping[str, Any]],
    default_registry: str | None = None,
) -> list[str]:
    """Pods the webhook would give the init container but that lack it: its own decision.

    Judged with the workaround on, whatever the spec says: with it off, these
    are the pods it leaves exposed. Before installing, the defaults decide.
    """
    spec = dict((mesh or {}).get("spec") or {})
    spec["newPodWorkaround"] = {**(spec.get("newPodWorkaround") or {}), "enabled": True}
    body = {"metadata": {"name": c.MESH_NAME}, "spec": spec}
    ctx = d.Context.build(body, nodes, runtime_classes, default_registry=default_registry)
    out = []
    for pod in pods:
        suspect = suspect_of(pod)
        if suspect is None:
            continue
        meta = suspect["metadata"]
        labels = namespaces.get(str(meta.get("namespace")))
        if labels is None:
            continue
        decision = d.decide(suspect, labels, ctx)
        if decision.action in ("inject", "withheld"):
            where = f"{meta.get('namespace')}/{meta.get('name')}"
            out.append(f"{where}: {decision.reason}: {decision.message}")
    return sorted(out)


def _webhook(read: Reader) -> p.Webhook:
    config = read.get(WEBHOOK_CONFIG, CONFIG_NAME)
    if config is None:
        return p.Webhook()
    client_config = ((config.get("webhooks") or [{}])[0]).get("clientConfig") or {}
    service = client_config.get("service")
    if not service:
        return p.Webhook(configured=True, url=client_config.get("url"))
    namespace, name = str(service.get("namespace")), str(service.get("name"))
    slices = read.items(
        ENDPOINT_SLICE, namespace=namespace, label_selector=f"kubernetes.io/service-name={name}"
    )
    ready = sum(
        1
        for s in slices
        for endpoint in s.get("endpoints") or []
        if (endpoint.get("conditions") or {}).get("ready") is not False
    )
    return p.Webhook(configured=True, service=f"{namespace}/{name}", ready_endpoints=ready)


DEFAULT_REGISTRY_FLAG = "--default-registry="
DEFAULT_REGISTRY_ENV = "AMBIENT_OPERATOR_DEFAULT_REGISTRY"


def _default_registry(read: Reader, hook: p.Webhook) -> str | None:
    """The running operator's --default-registry, from the Deployment its webhook Service is
    named after (the chart names both alike); None when there is none or it sets none."""
    if not hook.service:
        return None
    namespace, name = hook.service.split("/", 1)
    deployment = read.get(KINDS[("apps/v1", "Deployment")], name, namespace)
    containers = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in containers.get("containers") or []:
        for arg in container.get("args") or []:
            if isinstance(arg, str) and arg.startswith(DEFAULT_REGISTRY_FLAG):
                return arg[len(DEFAULT_REGISTRY_FLAG) :] or None
        for env in container.get("env") or []:
            if env.get("name") == DEFAULT_REGISTRY_ENV and env.get("value"):
                return str(env["value"])
    return None


def _helm(read: Reader, namespace: str) -> dict[str, Any]:
    """The Helm releases of Istio's agent charts in `namespace`, and what spec.adopt reads."""
    try:
        releases = {
            name: release
            for name, release in read_releases(read.kube, namespace).items()
            if release.chart in CHARTS
        }
    except KubeError as exc:
        read.refused(f"secrets in {namespace} (Helm release records)", exc)
        return {}
    except ReleaseRecordError as exc:
        read.unreadable.append(str(exc))
        return {}
    live: dict[ObjectKey, dict[str, Any] | None] = {}
    for release in releases.values():
        for obj in release.objects:
            kind = KINDS.get((obj.api_version, obj.kind))
            if kind is not None:
                live[release_key(obj)] = read.get(kind, obj.name, obj.namespace)
    labelled = []
    for api_version, kind_name in TAKEABLE_KINDS:
        labelled += read.items(
            KINDS[(api_version, kind_name)], namespace, f"{MANAGED_BY_LABEL}={HELM_MANAGED_BY}"
        )
    return {"helm_releases": releases, "helm_live": live, "helm_labelled": labelled}


def _held(mesh: Mapping[str, Any] | None) -> HeldTemplates | None:
    """status.held as the operator last wrote it; None when absent or unreadable."""
    raw = ((mesh or {}).get("status") or {}).get("held")
    try:
        return HeldTemplates.model_validate(raw) if raw else None
    except ValidationError:
        return None


def _revisions(mesh: Mapping[str, Any] | None) -> list[RevisionStatus]:
    """status.revisions as the operator last wrote it; empty when absent or unreadable."""
    raw = ((mesh or {}).get("status") or {}).get("revisions") or []
    try:
        return [RevisionStatus.model_validate(item) for item in raw]
    except ValidationError:
        return []


def snapshot(kube: Kube) -> p.Snapshot:
    """Read everything the checks judge (GET and LIST only)."""
    read = Reader(kube)
    version, version_text = _kube_version(kube)
    nodes = read.items(KINDS[("v1", "Node")])
    mesh = read.get(MESH, c.MESH_NAME) if read.served(MESH) else None
    spec = _mesh_spec(mesh, read.unreadable)
    service = spec.istiod.service()
    istiod_service = read.get(KINDS[("v1", "Service")], service, spec.namespace)
    istiod = read.get(KINDS[("apps/v1", "Deployment")], service, spec.namespace)
    crds = {name: crd for name in p.GATEWAY_API_CRDS if (crd := read.get(CRD, name)) is not None}
    namespaces = {
        str(ns["metadata"]["name"]): dict(ns["metadata"].get("labels") or {})
        for ns in read.items(KINDS[("v1", "Namespace")])
    }
    gateways = read.items(KINDS[(c.GATEWAY_API_VERSION, "Gateway")]) if crds else []
    waypoints = {
        (str(gw["metadata"].get("namespace")), str(gw["metadata"]["name"])): is_waypoint(gw)
        for gw in gateways
    }
    facts = []
    for node in nodes:
        try:
            facts.append(NodeFacts.from_node(node))
        except ValueError:
            continue  # the nodes check names it
    runtime_classes = {
        str(rc["metadata"]["name"]): dict(rc.get("scheduling") or {})
        for rc in read.items(RUNTIME_CLASS)
    }
    helm = _helm(read, spec.namespace)
    hook = _webhook(read)
    default_registry = _default_registry(read, hook)
    misses = windows_misses(
        read.items(KINDS[("v1", "Pod")]),
        namespaces,
        mesh,
        facts,
        runtime_classes,
        default_registry,
    )
    return p.Snapshot(
        kube_version=version,
        kube_version_text=version_text,
        nodes=nodes,
        spec=spec,
        mesh_installed=mesh is not None,
        istiod_service=istiod_service is not None,
        istiod=istiod,
        crds=crds,
        daemonsets=read.items(KINDS[("apps/v1", "DaemonSet")]),
        namespaces=namespaces,
        waypoints=waypoints,
        windows_misses=misses,
        webhook=hook,
        default_registry=default_registry,
        mesh_uid=str(((mesh or {}).get("metadata") or {}).get("uid") or ""),
        held=_held(mesh),
        revisions=_revisions(mesh),
        **helm,
        unreadable=tuple(read.unreadable),
    )


def human(findings: list[p.Finding]) -> str:
    """The findings as lines for a terminal, and a verdict at the end."""
    lines = []
    for finding in findings:
        lines.append(f"[{LEVEL_MARKS[finding.level]:>5}] {finding.check}: {finding.message}")
        lines += [f"          {item}" for item in finding.items]
    blocking = sum(1 for f in findings if f.level == p.BLOCKING)
    warnings = sum(1 for f in findings if f.level == p.WARNING)
    verdict = "ambient will not work here as things are" if blocking else "nothing blocks ambient"
    lines.append(f"{verdict}: {blocking} blocking, {warnings} warning(s)")
    return "\n".join(lines) + "\n"


def as_json(findings: list[p.Finding]) -> str:
    """The findings as one JSON document."""
    body = {
        "blocked": p.blocked(findings),
        "blocking": sum(1 for f in findings if f.level == p.BLOCKING),
        "warnings": sum(1 for f in findings if f.level == p.WARNING),
        "findings": [f.as_json() for f in findings],
    }
    return json.dumps(body, indent=2) + "\n"


def _cmd(args: argparse.Namespace) -> int:
    try:
        kube = kube_for(args)
        findings = p.judge(snapshot(kube))
    except (KubeError, CredentialsError, OSError) as exc:
        # No kubeconfig, a host that does not answer, credentials refused.
        print(f"ambient-operator precheck: cannot read the cluster: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    sys.stdout.write(as_json(findings) if args.output == "json" else human(findings))
    return EXIT_BLOCKED if p.blocked(findings) else EXIT_OK


def add_parser(sub: Any) -> None:
    """Register `precheck` on the CLI's subparsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "precheck",
        help="read the current cluster and say whether ambient will work there (read-only)",
        description="Checks the Kubernetes version, the nodes (OS, architecture, Windows "
        "build), the platform, istiod (present, version, ambient mode, trusted ztunnel "
        "accounts), Gateway API, conflicting installs and labels, and the webhook. Exits 1 "
        "when something blocks ambient, 3 when the cluster cannot be read.",
    )
    add_kube_flags(parser)
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    parser.set_defaults(func=_cmd)
