"""Every cache a watch keeps, declared as one table: what is watched and kept.

A `Watched` row names one kind and everything the operator does with it:
the watch's filters, and `record`, the one function that turns an event
into the cache's entry and wakes whoever reads it. The app layer lists and
watches every row's kind with an informer (app/watches.py), whose first
list fills the caches before the first pass; nothing else fills a cache.

`state_watches` is the table of `ClusterState`'s caches; the waypoint
controller adds its rows (controllers/waypoints/priming.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.cluster.facts import node_os, windows_build
from ambient_operator.cluster.revisions import LABEL_TAG, TAG_WEBHOOK_PREFIX
from ambient_operator.cluster.state import ClusterState
from ambient_operator.kube.resources import KINDS, Kind, cached_copy, key_of

Record = Callable[[str | None, Mapping[str, Any]], None]
Key = tuple[str, str]
MANAGED = {c.LABEL_MANAGED_BY: c.MANAGED_BY}


@dataclass(frozen=True)
class Watched:
    """One kind the operator keeps a cache of."""

    id: str
    kind: Kind
    # (event type, body): update the cache and wake its readers. Runs on the event loop.
    record: Record
    # The watch's filters: labels that must be present (None: with any value)...
    labels: Mapping[str, str | None] | None = None
    # ...and a test of (name, namespace, labels) made on every event.
    when: Callable[[str, str, Mapping[str, str]], bool] | None = None
    # The cache as {(namespace, name): object}, and how to forget an entry as a
    # deletion would: what a complete list no longer holds is forgotten. None:
    # the row keeps nothing a deletion event would not reach.
    cached: Callable[[], Mapping[Key, Mapping[str, Any]]] | None = None
    forget: Callable[[Key], None] | None = None
    # The informer of the kind sees every object of it, whatever the filters
    # above: a name it has not seen is free, known before a write without
    # asking the API server (app/watches.Watches.seen).
    every_name: bool = False
    # Whether a modified body changes nothing the row keeps, asked on the
    # informer's thread (kube/informer.py): True spares waking the event loop.
    # It reads the cache from that thread, so it must only read it.
    unchanged: Callable[[Mapping[str, Any]], bool] | None = None


# -- the rows of ClusterState ---------------------------------------------------------


def istiod_or_dns(name: str, _namespace: str, _labels: Mapping[str, str]) -> bool:
    """The Services and Deployments the data plane reads: istiod's and the cluster DNS."""
    return name.startswith("istiod") or name == "kube-dns"


def desired_part(obj: Mapping[str, Any]) -> Any:
    """What of one of our objects we (or a drifting user) write: all but status."""
    meta = obj.get("metadata", {})
    return (
        meta.get("generation"),
        meta.get("labels"),
        meta.get("annotations"),
        {k: v for k, v in obj.items() if k not in ("metadata", "status")},
    )


def mesh_shape(mesh: Mapping[str, Any] | None) -> Any:
    """What of the AmbientMesh a data-plane pass acts on: all but its status.

    The status is what the pass writes: its own write coming back is status news.
    """
    if mesh is None:
        return None
    meta = mesh.get("metadata") or {}
    return (
        meta.get("uid"),
        meta.get("generation"),
        meta.get("labels"),
        meta.get("annotations"),
        meta.get("finalizers"),
        meta.get("deletionTimestamp"),
        {k: v for k, v in mesh.items() if k not in ("metadata", "status")},
    )


def node_shape(node: Mapping[str, Any]) -> Any:
    """What render reads from a Node; heartbeats change nothing here.

    Condition taints (node.kubernetes.io/not-ready and friends) come and go
    with node health and are tolerated by every DaemonSet pod anyway. The
    providerID tells the platform (cluster/platform.py), and a cloud's
    controller sets it only after the node has joined.
    """
    meta = node.get("metadata", {})
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    taints = [
        t
        for t in spec.get("taints") or []
        if not str(t.get("key", "")).startswith("node.kubernetes.io/")
    ]
    return (meta.get("labels"), taints, status.get("nodeInfo"), spec.get("providerID"))


def _without_heartbeat(status: Any) -> Any:
    if not isinstance(status, Mapping):
        return status
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return status
    return {
        **status,
        "conditions": [
            {k: v for k, v in cond.items() if k != "lastHeartbeatTime"}
            if isinstance(cond, Mapping)
            else cond
            for cond in conditions
        ],
    }


def heartbeat_only(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether a Node's new state differs from the cached one only by a kubelet's heartbeat.

    A heartbeat moves the conditions' lastHeartbeatTime (and with it the
    resourceVersion and the time of a managedFields entry), every node every
    few minutes: at 5,000 nodes, most of an idle operator's events. Compared
    at C speed on what differs; anything else (a condition's status, a
    taint, a label) is a change. The cached copy is then kept as it is, so
    the passes' per-node reads (cluster/node_table.PerNode) see the
    same object and read nothing again.
    """
    if old.keys() != new.keys():
        return False
    for key, value in new.items():
        held = old[key]
        if key == "metadata":
            if not isinstance(value, Mapping) or not isinstance(held, Mapping):
                return False
            skip = ("resourceVersion", "managedFields")
            if {k: v for k, v in value.items() if k not in skip} != {
                k: v for k, v in held.items() if k not in skip
            }:
                return False
        elif key == "status":
            if value != held and _without_heartbeat(value) != _without_heartbeat(held):
                return False
        elif value != held:
            return False
    return True


def platform_key(node: Mapping[str, Any]) -> str:
    """The key of a node's platform for the loop (`platform/<os>/<Windows build>`).

    The build as render tells it (cluster/facts.py): the label, else the kernel version.
    """
    os_name = node_os(node) or "linux"
    build = ""
    if os_name == "windows":
        labels = (node.get("metadata") or {}).get("labels") or {}
        info = (node.get("status") or {}).get("nodeInfo") or {}
        build = labels.get(c.LABEL_WINDOWS_BUILD) or windows_build(info.get("kernelVersion")) or ""
    return f"platform/{os_name}/{build}"


def namespace_entry(ns: Mapping[str, Any]) -> dict[str, Any]:
    """What the caches keep of a Namespace: identity, labels, and whether it is going away."""
    meta = ns.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        # The version tells a list whether the entry is older than it (app/watches.py).
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "labels": dict(meta.get("labels") or {}),
        # Nothing can be created in a terminating namespace; writers skip it.
        "terminating": bool(meta.get("deletionTimestamp")),
    }


def same_namespace(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two namespace entries differ in nothing but their resourceVersion."""
    return (
        old.get("labels") == new.get("labels")
        and old.get("terminating") == new.get("terminating")
        and (old.get("metadata") or {}).get("uid") == (new.get("metadata") or {}).get("uid")
    )


def _name(body: Mapping[str, Any]) -> str:
    return str((body.get("metadata") or {}).get("name") or "")


def _nskey(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def state_watches(state: ClusterState, owned_kinds: Sequence[tuple[str, str]]) -> list[Watched]:
    """The rows of `ClusterState`: the mesh, nodes, namespaces, istiod, and our own objects.

    `owned_kinds` are the (apiVersion, kind) of the objects the data plane writes.
    """

    def record_mesh(event: str | None, body: Mapping[str, Any]) -> None:
        old, state.mesh = state.mesh, None if event == "DELETED" else cached_copy(body)
        state.poke(status=mesh_shape(old) == mesh_shape(state.mesh))

    def record_crd(event: str | None, body: Mapping[str, Any]) -> None:
        state.mesh_crd = None if event == "DELETED" else cached_copy(body)
        state.poke()

    def forget_crd(_key: Key) -> None:
        state.mesh_crd = None

    def node_unchanged(body: Mapping[str, Any]) -> bool:
        # Most of an idle operator's events at 5,000 nodes are heartbeats: the
        # informer drops them on its thread, and the row again on the loop
        # for those the informer could not (a change was still on its way).
        old = state.nodes.get(_name(body))
        return old is not None and heartbeat_only(old, body)

    # A node's arrival, departure or change (of what render reads) is keyed by
    # its platform: the user waits for its verdict, its placement and its
    # platform's agents. The data plane's pass is full, as it must be: render
    # reads the nodes. It costs the node and its platform: only a changed
    # node's facts are read again (PerNode), only a platform whose inputs
    # changed is rendered again (RenderMemo), only what differs is written.
    def record_node(event: str | None, body: Mapping[str, Any]) -> None:
        name = _name(body)
        if event == "DELETED":
            old = state.nodes.pop(name, None)
            state.tally.node(name, None)
            state.poke(key=platform_key(old or body))
            return
        if node_unchanged(body):
            return
        old = state.nodes.get(name)
        node = cached_copy(body)
        state.nodes[name] = node
        if old is None or node_shape(old) != node_shape(node):
            # Enrollment counts a pod without an OS of its own by its node's.
            state.tally.node(name, node_os(node) or "linux")
            state.poke(key=platform_key(node))

    def forget_node(key: Key) -> None:
        if key[1] in state.nodes:
            record_node("DELETED", {"metadata": {"name": key[1]}})

    def record_namespace(event: str | None, body: Mapping[str, Any]) -> None:
        name = _name(body)
        old = state.namespaces.get(name)
        new = None if event == "DELETED" else namespace_entry(body)
        if new is None:
            state.namespaces.pop(name, None)
        else:
            state.namespaces[name] = new
            if old is not None and same_namespace(old, new):
                return
        labels = None if new is None else new["labels"]
        state.tally.namespace(name, labels)
        state.namespace_changed(name)
        revision = (labels or {}).get(c.LABEL_REVISION)
        if revision != ((old or {}).get("labels") or {}).get(c.LABEL_REVISION):
            state.revision_changes += 1
        # Keyed: its Events (the namespace checks judge this namespace alone),
        # its enrollment tally and the status lines it moves are news the user
        # waits for, and a status-only pass of the data plane answers them.
        # A full pass only where what the data plane writes reads the
        # namespace (ClusterState.namespace_read_by_writes).
        state.poke(key=f"namespace/{name}", status=not state.namespace_read_by_writes(name))

    def forget_namespace(key: Key) -> None:
        if key[1] in state.namespaces:
            record_namespace("DELETED", {"metadata": {"name": key[1]}})

    def record_in(cache: dict[tuple[str, str], dict[str, Any]], *, revisions: bool) -> Record:
        def record(event: str | None, body: Mapping[str, Any]) -> None:
            if event == "DELETED":
                cache.pop(_nskey(body), None)
            else:
                cache[_nskey(body)] = cached_copy(body)
            if revisions:
                state.revision_changes += 1
            state.poke()

        return record

    def record_owned(event: str | None, body: Mapping[str, Any]) -> None:
        obj = cached_copy(body)
        before = state.owned.get(key_of(obj))
        if not state.remember_owned(obj, deleted=event == "DELETED"):
            return  # a late event: a write's response told us more
        # A rollout moving along is status; an edit or a deletion is drift.
        drift = event == "DELETED" or before is None or desired_part(before) != desired_part(obj)
        state.poke(urgent=drift, status=not drift)

    def forget_in(cache: dict[Any, Any], entry: Callable[[Key], Any]) -> Callable[[Key], None]:
        def forget(key: Key) -> None:
            if cache.pop(entry(key), None) is not None:
                state.poke()

        return forget

    def record_tag(event: str | None, body: Mapping[str, Any]) -> None:
        name = _name(body)
        if event == "DELETED":
            state.revision_tags.pop(name, None)
        else:
            # The labels name the tag and its revision; the webhooks are not read.
            meta = body.get("metadata") or {}
            entry = {"metadata": {"name": name, "labels": dict(meta.get("labels") or {})}}
            if state.revision_tags.get(name) == entry:
                return
            state.revision_tags[name] = entry
        state.revision_changes += 1
        state.poke()

    def forget_tag(key: Key) -> None:
        if state.revision_tags.pop(key[1], None) is not None:
            state.revision_changes += 1
            state.poke()

    def forget_deployment(key: Key) -> None:
        if state.deployments.pop(key, None) is not None:
            state.revision_changes += 1
            state.poke()

    def forget_mesh(_key: Key) -> None:
        state.mesh = None
        state.poke()

    def owned_row(api_version: str, kind_name: str) -> Watched:
        def cached() -> dict[Key, dict[str, Any]]:
            return {
                (key[2], key[3]): obj
                for key, obj in state.owned.items()
                if key[0] == api_version and key[1] == kind_name
            }

        def forget(key: Key) -> None:
            obj = state.owned.get((api_version, kind_name, *key))
            if obj is not None:
                state.remember_owned(obj, deleted=True)
                state.poke()  # one of ours is gone: put it back

        kind = KINDS[(api_version, kind_name)]
        # The data plane's objects only: the waypoints' (their ServiceAccounts,
        # the class defaults) are that controller's to keep, and kept here too
        # they were a second copy, and a wake-up of this loop at each change.
        ours = {**MANAGED, c.LABEL_CONTROLLER: c.DATAPLANE_CONTROLLER}
        return Watched(
            f"owned-{kind.plural}", kind, record_owned, labels=ours, cached=cached, forget=forget
        )

    return [
        Watched(
            "mesh",
            KINDS[(f"{c.API_GROUP}/{c.API_VERSION}", c.KIND)],
            record_mesh,
            when=lambda name, _ns, _labels: name == c.MESH_NAME,
            cached=lambda: {("", c.MESH_NAME): state.mesh} if state.mesh else {},
            forget=forget_mesh,
        ),
        Watched(
            "mesh-crd",
            KINDS[("apiextensions.k8s.io/v1", "CustomResourceDefinition")],
            record_crd,
            when=lambda name, _ns, _labels: name == c.CRD_NAME,
            cached=lambda: {("", c.CRD_NAME): state.mesh_crd} if state.mesh_crd else {},
            forget=forget_crd,
        ),
        Watched(
            "nodes",
            KINDS[("v1", "Node")],
            record_node,
            cached=lambda: {("", name): node for name, node in state.nodes.items()},
            forget=forget_node,
            unchanged=node_unchanged,
        ),
        Watched(
            "namespaces",
            KINDS[("v1", "Namespace")],
            record_namespace,
            cached=lambda: {("", name): ns for name, ns in state.namespaces.items()},
            forget=forget_namespace,
        ),
        Watched(
            "istiod-services",
            KINDS[("v1", "Service")],
            record_in(state.services, revisions=False),
            when=istiod_or_dns,
            cached=lambda: dict(state.services),
            forget=forget_in(state.services, lambda key: key),
        ),
        Watched(
            "istiod-deployments",
            KINDS[("apps/v1", "Deployment")],
            record_in(state.deployments, revisions=True),
            when=istiod_or_dns,
            cached=lambda: dict(state.deployments),
            forget=forget_deployment,
        ),
        Watched(
            "revision-tags",
            KINDS[("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")],
            record_tag,
            labels={LABEL_TAG: None},
            when=lambda name, _ns, _labels: name.startswith(TAG_WEBHOOK_PREFIX),
            cached=lambda: {("", name): tag for name, tag in state.revision_tags.items()},
            forget=forget_tag,
        ),
        *(owned_row(*kind) for kind in owned_kinds),
    ]
