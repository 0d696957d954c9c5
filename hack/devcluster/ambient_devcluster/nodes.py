"""Turn a node inventory (``kubectl get nodes -o yaml``) into kwok-managed Nodes.

Only what describes the machine is kept: labels, annotations, taints, pod
CIDRs, providerID, unschedulable, and from the status nodeInfo, capacity,
allocatable and addresses. Server-populated metadata and observed state (conditions, images,
volumes) are dropped; kwok produces fresh conditions.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .launcher import KWOK_NODE_ANNOTATION, KWOK_NODE_VALUE

DEFAULT_CAPACITY: dict[str, str] = {
    "cpu": "32",
    "memory": "256Gi",
    "pods": "110",
    "ephemeral-storage": "1Ti",
}

# Taints the node lifecycle controller derives from conditions in the cluster
# the inventory was taken from; here they would be stale, and the local
# controller adds its own when the fake node's conditions call for it.
_CONDITION_TAINT_PREFIX = "node.kubernetes.io/"
_CONDITION_TAINTS = {
    "not-ready",
    "unreachable",
    "memory-pressure",
    "disk-pressure",
    "pid-pressure",
    "network-unavailable",
    "unschedulable",
    "out-of-service",
}

_NODE_INFO_FIELDS = (
    "architecture",
    "bootID",
    "containerRuntimeVersion",
    "kernelVersion",
    "kubeProxyVersion",
    "kubeletVersion",
    "machineID",
    "operatingSystem",
    "osImage",
    "systemUUID",
)

_DROP_ANNOTATIONS = {
    "kubectl.kubernetes.io/last-applied-configuration",
    "node.alpha.kubernetes.io/ttl",
    "volumes.kubernetes.io/controller-managed-attach-detach",
}


def parse_inventory(text: str) -> list[dict[str, Any]]:
    """Nodes from a ``kind: List``/``NodeList`` or multi-document YAML of Nodes."""
    nodes: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if not isinstance(doc, dict):
            raise ValueError(f"expected a mapping, got {type(doc).__name__}")
        kind = doc.get("kind")
        if kind in ("List", "NodeList"):
            items = doc.get("items") or []
        elif kind == "Node":
            items = [doc]
        else:
            raise ValueError(f"unsupported kind {kind!r} in node inventory")
        for item in items:
            if item.get("kind", "Node") != "Node":
                raise ValueError(f"unsupported item kind {item.get('kind')!r} in node list")
            if not (item.get("metadata") or {}).get("name"):
                raise ValueError("a node in the inventory has no metadata.name")
            nodes.append(item)
    return nodes


def _synthetic_ip(name: str) -> str:
    # Stable per name so restarts and re-creations keep the same address.
    digest = hashlib.sha256(name.encode()).digest()
    return f"172.30.{digest[0]}.{digest[1] % 254 + 1}"


def to_kwok_node(source: Mapping[str, Any]) -> dict[str, Any]:
    """A Node body (with status) for kwok, built from one inventory entry."""
    src = copy.deepcopy(dict(source))
    meta = src.get("metadata") or {}
    name = meta["name"]
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k not in _DROP_ANNOTATIONS
    }
    annotations[KWOK_NODE_ANNOTATION] = KWOK_NODE_VALUE
    labels = dict(meta.get("labels") or {})
    labels.setdefault("kubernetes.io/hostname", name)

    spec_src = src.get("spec") or {}
    spec: dict[str, Any] = {}
    taints = [
        {k: v for k, v in t.items() if k != "timeAdded"}
        for t in spec_src.get("taints") or []
        if not (
            t.get("key", "").startswith(_CONDITION_TAINT_PREFIX)
            and t["key"][len(_CONDITION_TAINT_PREFIX) :] in _CONDITION_TAINTS
        )
    ]
    if taints:
        spec["taints"] = taints
    # providerID tells the platform (AKS, EKS, kind...) the inventory came from.
    for key in ("podCIDR", "podCIDRs", "providerID", "unschedulable"):
        if key in spec_src:
            spec[key] = spec_src[key]

    status_src = src.get("status") or {}
    capacity = {**DEFAULT_CAPACITY, **(status_src.get("capacity") or {})}
    allocatable = {**capacity, **(status_src.get("allocatable") or {})}
    addresses = status_src.get("addresses") or [
        {"type": "InternalIP", "address": _synthetic_ip(name)},
        {"type": "Hostname", "address": name},
    ]
    status: dict[str, Any] = {
        "capacity": capacity,
        "allocatable": allocatable,
        "addresses": addresses,
    }
    # NodeSystemInfo has no optional fields; the OS and architecture fall
    # back to the well-known labels so a labels-only inventory still yields
    # e.g. a Windows nodeInfo. kwok fills the remaining empty strings.
    info = {key: "" for key in _NODE_INFO_FIELDS}
    info["operatingSystem"] = labels.get("kubernetes.io/os", "")
    info["architecture"] = labels.get("kubernetes.io/arch", "")
    info.update({k: v for k, v in (status_src.get("nodeInfo") or {}).items() if v is not None})
    status["nodeInfo"] = info

    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": spec,
        "status": status,
    }
    return body


def load_inventory(path: Path | str) -> list[dict[str, Any]]:
    """Read an inventory file and convert every node with :func:`to_kwok_node`."""
    return [to_kwok_node(n) for n in parse_inventory(Path(path).read_text())]


def _status_matches(actual: Mapping[str, Any] | None, wanted: Mapping[str, Any]) -> bool:
    actual = actual or {}
    info = actual.get("nodeInfo") or {}
    for key, value in (wanted.get("nodeInfo") or {}).items():
        if info.get(key) != value:
            return False
    return all(
        (actual.get(k) or {}) == v for k, v in wanted.items() if k in ("capacity", "allocatable")
    )


def create_nodes(
    api_client: Any,
    inventory: str | Path | Iterable[Mapping[str, Any]],
    *,
    wait_ready: bool = True,
    timeout: float = 60.0,
) -> list[str]:
    """Create (or update) kwok nodes from an inventory and return their names.

    ``inventory`` is YAML text, a path to a YAML file, or already-parsed Node
    dicts. Each node is created without the kwok annotation, its status written,
    and only then handed to kwok by adding the annotation, so kwok never sees
    the node before its nodeInfo is in place. Existing nodes of the same name
    are updated in place (labels, taints and status), which makes this
    idempotent.
    """
    if isinstance(inventory, Path):
        bodies = load_inventory(inventory)
    elif isinstance(inventory, str):
        bodies = [to_kwok_node(n) for n in parse_inventory(inventory)]
    else:
        bodies = [to_kwok_node(n) for n in inventory]

    core = client.CoreV1Api(api_client)
    names = []
    for body in bodies:
        name = body["metadata"]["name"]
        names.append(name)
        staged = copy.deepcopy(body)
        del staged["metadata"]["annotations"][KWOK_NODE_ANNOTATION]
        try:
            # The client accepts a plain dict (validated against V1Node) and
            # keeps the status in it: Node creation, like a kubelet's
            # registration, stores the status given.
            created = api_client.sanitize_for_serialization(
                core.create_node(cast(client.V1Node, staged))
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            created = None
        if created is not None:
            if not _status_matches(created.get("status"), body["status"]):
                core.patch_node_status(name, {"status": body["status"]})
        else:
            # Already there: bring spec/metadata and the file's status in line.
            core.patch_node(
                name,
                {
                    "metadata": {
                        "labels": body["metadata"]["labels"],
                        "annotations": body["metadata"]["annotations"],
                    },
                    "spec": {"taints": body["spec"].get("taints", [])},
                },
            )
            core.patch_node_status(name, {"status": body["status"]})
        core.patch_node(
            name, {"metadata": {"annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_VALUE}}}
        )
    if wait_ready:
        wait_nodes_ready(api_client, names, timeout=timeout)
    return names


def node_ready(node: Any) -> bool:
    """Whether a ``V1Node`` is Ready=True and no longer carries the
    ``node.kubernetes.io/not-ready`` taint (removed by the node lifecycle
    controller a few seconds after kwok reports Ready; until then ordinary
    pods cannot be scheduled there)."""
    conditions = (node.status.conditions if node.status else None) or []
    if not any(c.type == "Ready" and c.status == "True" for c in conditions):
        return False
    taints = (node.spec.taints if node.spec else None) or []
    return not any(t.key == "node.kubernetes.io/not-ready" for t in taints)


def _name(obj: Any) -> str:
    return str(obj.metadata.name)


def wait_nodes_ready(api_client: Any, names: Iterable[str], timeout: float = 60.0) -> None:
    """Wait until every named node reports Ready (kwok picked it up)."""
    core = client.CoreV1Api(api_client)
    pending = set(names)
    deadline = time.monotonic() + timeout
    while pending:
        for node in core.list_node().items:
            if _name(node) in pending and node_ready(node):
                pending.discard(_name(node))
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes not Ready after {timeout}s: {sorted(pending)}")
        time.sleep(0.2)


def delete_nodes(
    api_client: Any, names: Iterable[str], *, wait: bool = True, timeout: float = 60.0
) -> None:
    """Delete nodes (missing ones are ignored) and optionally wait until gone.

    Pods bound to them are removed by the pod garbage collector in
    kube-controller-manager, as in a real cluster.
    """
    core = client.CoreV1Api(api_client)
    names = list(names)
    for name in names:
        try:
            core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while True:
        remaining = {_name(n) for n in core.list_node().items} & set(names)
        if not remaining:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nodes still present after {timeout}s: {sorted(remaining)}")
        time.sleep(0.2)


def dump_inventory(nodes: Iterable[Mapping[str, Any]]) -> str:
    """YAML ``kind: List`` of Node dicts, the shape ``kubectl get -o yaml`` prints."""
    return yaml.safe_dump(
        {"apiVersion": "v1", "kind": "List", "items": list(nodes), "metadata": {}},
        sort_keys=False,
    )
