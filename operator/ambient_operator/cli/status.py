"""`ambient-operator status`: what the ambient data plane does now, on one screen.

Read-only, like `precheck` (GET and LIST only; tests/test_one_writer.py holds
it to that): the AmbientMesh's status, and the cluster objects it summarises,
so it needs no access to the operator's pod. Per platform (Linux, each
Windows build): nodes, agents ready, the version their pods run and the one
being rolled to (status.nodes, status.components, status.versions, the
agents' pods); enrolled namespaces and their pods by OS and redirection
state, counted by the operator's own rule (cluster/enrollment.py); the
waypoints of both classes as `waypoint list -A` shows them; the pods the
webhook missed; the root cause when the mesh is Degraded. What the caller
may not read is named, and the rest is still shown.

Exit codes: 0 read, 1 no such AmbientMesh, 3 the cluster could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import bundled
from ambient_operator.api import constants as c
from ambient_operator.api.conditions import MeshCondition
from ambient_operator.api.v1alpha1 import AmbientMeshStatus, ComponentStatus, PodCounts
from ambient_operator.cli.kubeargs import add_kube_flags, kube_for
from ambient_operator.cli.precheck import MESH, Reader, windows_misses
from ambient_operator.cli.waypoint import DEPLOYMENT, GATEWAY, LIST_COLUMNS, class_of, listed_rows
from ambient_operator.cli.waypoint import table as columns_table
from ambient_operator.cluster.enrollment import namespace_enrolled, summarize
from ambient_operator.cluster.facts import NodeFacts, node_os
from ambient_operator.cluster.state import PodSummary
from ambient_operator.cluster.versions import image_tag
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.credentials import CredentialsError
from ambient_operator.kube.resources import KINDS
from ambient_operator.render.model import PLATFORM_LINUX
from ambient_operator.status.versions import platform_name
from ambient_operator.webhook.review import RUNTIME_CLASS

EXIT_OK, EXIT_NO_MESH, EXIT_UNREACHABLE = 0, 1, 3
NODE, NAMESPACE, POD = KINDS[("v1", "Node")], KINDS[("v1", "Namespace")], KINDS[("v1", "Pod")]
# The waypoint table's columns (waypoint list -A) as JSON keys.
WAYPOINT_KEYS = {
    "NAMESPACE": "namespace",
    "NAME": "name",
    "REVISION": "revision",
    "TRAFFIC TYPE": "trafficType",
    "PROGRAMMED": "programmed",
    "WHOSE": "whose",
    "OS": "os",
}
# Each condition's state that needs no word on the screen.
HEALTHY = {
    MeshCondition.RECONCILED: "True",
    MeshCondition.READY: "True",
    MeshCondition.DEGRADED: "False",
}


def _counts(counts: PodCounts) -> dict[str, int]:
    return {"enabled": counts.enabled, "pending": counts.pending, "missing": counts.missing}


def agent_versions(
    pods: Iterable[Mapping[str, Any]], namespace: str, components: list[ComponentStatus]
) -> dict[str, Counter[str]]:
    """Per platform, how many agent pods run each version (their first container's tag)."""
    platform_of = {cs.name: cs.platform for cs in components}
    out: dict[str, Counter[str]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != namespace:
            continue
        owner = next(
            (
                ref.get("name")
                for ref in meta.get("ownerReferences") or []
                if ref.get("kind") == "DaemonSet"
            ),
            None,
        )
        platform = platform_of.get(str(owner))
        if platform is None:
            continue
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        version = image_tag(containers[0].get("image")) or "unknown"
        out.setdefault(platform, Counter())[version] += 1
    return out


def platforms(
    status: AmbientMeshStatus, running: Mapping[str, Counter[str]]
) -> list[dict[str, Any]]:
    """One entry per platform: nodes, agents ready, versions running and rolling."""
    nodes = {PLATFORM_LINUX: (status.nodes.linux, True)}
    nodes |= {b.build: (b.nodes, b.supported) for b in status.nodes.windows_builds}
    platforms = list(nodes)
    platforms += sorted({cs.platform for cs in status.components} - set(nodes))
    versions = status.versions
    out = []
    for platform in platforms:
        count, supported = nodes.get(platform, (0, True))
        agents = {
            cs.component: {"ready": cs.ready, "desired": cs.desired, "updated": cs.updated}
            for cs in status.components
            if cs.platform == platform
        }
        rolling: dict[str, Any] | None = None
        if versions is not None and versions.rolling == platform:
            rolling = {"state": "rolling", "to": versions.data_plane}
        elif versions is not None and platform in versions.waiting:
            rolling = {"state": "waiting", "after": versions.rolling}
        if platform == PLATFORM_LINUX and not count and not agents:
            continue
        out.append(
            {
                "platform": platform,
                "name": platform_name(platform),
                "nodes": count,
                "supported": supported,
                "ztunnel": agents.get("ztunnel"),
                "istioCni": agents.get("istio-cni"),
                "running": dict(sorted(running.get(platform, Counter()).items())),
                "rollout": rolling,
            }
        )
    return out


def _enrollment(
    status: AmbientMeshStatus,
    pods: list[dict[str, Any]],
    namespaces: Mapping[str, Mapping[str, str]],
    nodes: list[dict[str, Any]],
) -> dict[str, Any]:
    """The operator's totals, and each enrolled namespace's pods by the same rule."""
    os_by_node = {
        str(n["metadata"]["name"]): node_os(n) or "linux" for n in nodes if n.get("metadata")
    }
    by_namespace: dict[str, list[PodSummary]] = {}
    for pod in pods:
        summary = PodSummary.of(pod)
        by_namespace.setdefault(summary.namespace, []).append(summary)
    rows = []
    for name in sorted(set(namespaces) | set(by_namespace)):
        labels = namespaces.get(name) or {}
        counted = summarize(by_namespace.get(name, []), {name: {"labels": labels}}, os_by_node)
        linux, windows = _counts(counted.linux_pods), _counts(counted.windows_pods)
        if namespace_enrolled(labels) or any(linux.values()) or any(windows.values()):
            rows.append({"namespace": name, "linux": linux, "windows": windows})
    total = status.enrollment
    return {
        "namespaces": total.namespaces,
        "linuxPods": _counts(total.linux_pods),
        "windowsPods": _counts(total.windows_pods),
        "byNamespace": rows,
    }


def _conditions(mesh: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    return {
        str(cond.get("type")): {
            "status": str(cond.get("status", "Unknown")),
            "reason": str(cond.get("reason", "")),
            "message": str(cond.get("message", "")),
        }
        for cond in ((mesh or {}).get("status") or {}).get("conditions") or []
    }


def gather(kube: Kube, mesh_name: str = c.MESH_NAME) -> dict[str, Any]:
    """Everything the screen shows, as one JSON-ready document (GET and LIST only)."""
    read = Reader(kube)
    mesh = read.get(MESH, mesh_name) if read.served(MESH) else None
    try:
        status = AmbientMeshStatus.model_validate((mesh or {}).get("status") or {})
    except ValidationError as exc:
        read.unreadable.append(f"AmbientMesh {mesh_name}: status unreadable ({exc.error_count()})")
        status = AmbientMeshStatus()
    spec = (mesh or {}).get("spec") or {}
    agents_namespace = str(spec.get("namespace") or "istio-system")
    nodes = read.items(NODE)
    pods = read.items(POD)
    namespaces = {
        str(ns["metadata"]["name"]): dict(ns["metadata"].get("labels") or {})
        for ns in read.items(NAMESPACE)
    }
    facts = []
    for node in nodes:
        try:
            facts.append(NodeFacts.from_node(node))
        except ValueError:
            continue
    runtime_classes = {
        str(rc["metadata"]["name"]): dict(rc.get("scheduling") or {})
        for rc in read.items(RUNTIME_CLASS)
    }
    waypoints = [
        {WAYPOINT_KEYS[column]: value for column, value in row.items()}
        for row in listed_rows(read.items(GATEWAY), read.items(DEPLOYMENT), class_of(mesh))
    ]
    conditions = _conditions(mesh)
    degraded = conditions.get(MeshCondition.DEGRADED)
    meta = (mesh or {}).get("metadata") or {}
    versions = status.versions
    return {
        "mesh": mesh_name,
        "found": mesh is not None,
        "generation": meta.get("generation"),
        "observedGeneration": status.observed_generation,
        "conditions": conditions,
        "rootCause": degraded if degraded and degraded["status"] == "True" else None,
        "versions": None
        if versions is None
        else {
            "istiod": versions.control_plane,
            "agents": versions.data_plane,
            "source": versions.source,
            "rolling": versions.rolling,
            "waiting": list(versions.waiting),
        },
        "platforms": platforms(
            status, agent_versions(pods, agents_namespace, list(status.components))
        ),
        "enrollment": _enrollment(status, pods, namespaces, nodes),
        "waypoints": waypoints,
        "webhook": {
            "misses": status.enrollment.workaround_misses,
            "imageUnavailable": status.enrollment.workaround_image_unavailable,
            "pods": windows_misses(pods, namespaces, mesh, facts, runtime_classes),
        },
        "unreadable": list(read.unreadable),
    }


def _ready(agents: Mapping[str, int] | None) -> str:
    return "-" if agents is None else f"{agents['ready']}/{agents['desired']}"


def _running(versions: Mapping[str, int]) -> str:
    if len(versions) == 1:
        return next(iter(versions))
    return ", ".join(f"{v} ({n})" for v, n in versions.items()) or "-"


def _rollout(entry: Mapping[str, Any]) -> str:
    rollout = entry["rollout"]
    if rollout is None:
        return "-"
    if rollout["state"] == "waiting":
        after = rollout["after"]
        return "waiting" if after is None else f"waits for {platform_name(str(after))}"
    agents = [a for a in (entry["ztunnel"], entry["istioCni"]) if a is not None]
    updated = sum(a["updated"] for a in agents)
    desired = sum(a["desired"] for a in agents)
    return f"to {rollout['to']} ({updated}/{desired} pods updated)"


def _pods(counts: Mapping[str, int]) -> str:
    return f"{counts['enabled']}/{counts['pending']}/{counts['missing']}"


def platform_table(entries: list[Mapping[str, Any]]) -> str:
    """The platforms section: one row per platform, without a final newline."""
    rows = [
        {
            "PLATFORM": p["name"],
            "NODES": str(p["nodes"]) + ("" if p["supported"] else " unsupported"),
            "ZTUNNEL": _ready(p["ztunnel"]),
            "ISTIO-CNI": _ready(p["istioCni"]),
            "RUNNING": _running(p["running"]),
            "ROLLOUT": _rollout(p),
        }
        for p in entries
    ]
    if not rows:
        return "No platforms reported yet."
    return columns_table(rows, list(rows[0])).rstrip("\n")


def human(doc: Mapping[str, Any]) -> str:
    """The document as a person reads it on a terminal."""
    lines = []
    if not doc["found"]:
        refused = any(what.startswith(MESH.plural) for what in doc["unreadable"])
        lines.append(f"AmbientMesh {doc['mesh']}: {'not readable' if refused else 'not found'}")
    else:
        conditions = doc["conditions"]
        states = " ".join(
            f"{kind}={conditions[kind]['status']}" for kind in HEALTHY if kind in conditions
        )
        lines.append(f"AmbientMesh {doc['mesh']}: {states or 'no status yet'}")
        if doc["observedGeneration"] != doc["generation"]:
            lines.append(
                f"  status of generation {doc['observedGeneration']}; the spec is at "
                f"generation {doc['generation']}"
            )
        for kind, healthy in HEALTHY.items():
            cond = conditions.get(kind)
            if cond is None or cond["status"] == healthy:
                continue
            said = "Root cause" if kind == MeshCondition.DEGRADED else f"{kind}={cond['status']}"
            lines.append(f"  {said}: {cond['reason']}: {cond['message']}")
    versions = doc["versions"]
    if versions is not None:
        lines.append(
            f"Versions: agents {versions['agents']} (from {versions['source']}), "
            f"istiod {versions['istiod'] or 'unknown'}"
        )
    lines.append("")
    lines.append(platform_table(doc["platforms"]))
    lines.append("")
    enrollment = doc["enrollment"]
    lines.append(
        f"Enrolled namespaces: {enrollment['namespaces']}; pods redirected "
        f"(enabled/pending/missing): Linux {_pods(enrollment['linuxPods'])}, "
        f"Windows {_pods(enrollment['windowsPods'])}"
    )
    if enrollment["byNamespace"]:
        ns_rows = [
            {
                "NAMESPACE": r["namespace"],
                "LINUX": _pods(r["linux"]),
                "WINDOWS": _pods(r["windows"]),
            }
            for r in enrollment["byNamespace"]
        ]
        lines.append(columns_table(ns_rows, ["NAMESPACE", "LINUX", "WINDOWS"]).rstrip("\n"))
    lines.append("")
    if doc["waypoints"]:
        lines.append("Waypoints:")
        rows = [{col: w[WAYPOINT_KEYS[col]] for col in LIST_COLUMNS} for w in doc["waypoints"]]
        lines.append(columns_table(rows, LIST_COLUMNS).rstrip("\n"))
    else:
        lines.append("Waypoints: none")
    lines.append("")
    webhook = doc["webhook"]
    why = ""
    if webhook["imageUnavailable"]:
        why = (
            f" ({webhook['imageUnavailable']} because no redirection-wait image is known: run "
            f"`{bundled.BUILD_COMMAND}` and set {bundled.REGISTRY_FIELD})"
        )
    lines.append(
        f"Webhook misses: {webhook['misses']} Windows pod(s) admitted without the "
        f"redirection-wait init container{why}"
    )
    lines += [f"  {pod}" for pod in webhook["pods"]]
    if doc["unreadable"]:
        lines.append("")
        lines.append("Not readable with these credentials (left out above):")
        lines += [f"  {what}" for what in doc["unreadable"]]
    return "\n".join(lines) + "\n"


def _cmd(args: argparse.Namespace) -> int:
    try:
        doc = gather(kube_for(args), args.mesh)
    except (KubeError, CredentialsError, OSError) as exc:
        print(f"ambient-operator status: cannot read the cluster: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.output == "json" else human(doc))
    return EXIT_OK if doc["found"] else EXIT_NO_MESH


def add_parser(sub: Any) -> None:
    """Register `status` on the CLI's subparsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "status",
        help="one screen: agents per platform, versions, enrollment, waypoints, webhook "
        "misses and the root cause when Degraded (read-only)",
        description="Reads the AmbientMesh's status and the cluster (GET and LIST only), so it "
        "works without access to the operator's pod. Exits 1 when the AmbientMesh does not "
        "exist, 3 when the cluster cannot be read.",
    )
    add_kube_flags(parser)
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    parser.add_argument(
        "--mesh", default=c.MESH_NAME, help=f"the AmbientMesh (default {c.MESH_NAME})"
    )
    parser.set_defaults(func=_cmd)
