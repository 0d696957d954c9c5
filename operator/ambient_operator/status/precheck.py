"""`ambient-operator precheck`: will ambient work on this cluster? Pure.

The command (cli/precheck.py) reads the cluster into a `Snapshot`; `CHECKS`,
a table of rows, judges it. Each row says what it looks at and when it
blocks or only warns (docs/precheck.md shows the table). Nothing here
re-states a rule kept elsewhere: node support is the render's verdicts,
the platform is cluster/platform.py's, istiod's version and the skew rule
are cluster/versions.py's, its trust is status/components.py's, namespace
labels are cluster/enrollment.py's, and the Windows pods missing the
workaround are found by the webhook's own decision (the command asks it).

Levels: `blocking` means ambient cannot work as things are (the exit code
is 1); `warning` means part of it will not (some nodes, some namespaces,
the L7 waypoints); `info` and `ok` are the facts.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ambient_operator.api import bundled
from ambient_operator.api import constants as c
from ambient_operator.api.conditions import INTENDED_EXCLUSIONS
from ambient_operator.api.releases import fixed_since
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, HeldTemplates, RevisionStatus
from ambient_operator.apply.adopt import helm_release_of, plan_takeover
from ambient_operator.apply.ownership import conflict, describe
from ambient_operator.apply.plan import Owner
from ambient_operator.cluster.enrollment import namespace_problems
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts
from ambient_operator.cluster.helm_releases import HelmRelease
from ambient_operator.cluster.platform import detect_platform
from ambient_operator.cluster.versions import (
    ISTIOD_CONTAINER,
    agent_tag,
    istiod_version,
    parse_version,
    skew_problem,
    workload_image,
)
from ambient_operator.kube.resources import ObjectKey, key_of
from ambient_operator.render import RenderResult, render_dataplane
from ambient_operator.render import values as v
from ambient_operator.render.model import PLATFORM_LINUX
from ambient_operator.status.adoption import pending_roll
from ambient_operator.status.components import istiod_trust, trust_message
from ambient_operator.status.held import approve_command, per_platform
from ambient_operator.status.versions import older_patch

GATEWAY_API_GROUP = "gateway.networking.k8s.io"
GATEWAY_API_CRDS = (f"gatewayclasses.{GATEWAY_API_GROUP}", f"gateways.{GATEWAY_API_GROUP}")
BUNDLE_VERSION = f"{GATEWAY_API_GROUP}/bundle-version"
CHANNEL = f"{GATEWAY_API_GROUP}/channel"
# The oldest Gateway API release the waypoints are tested with (tests use v1.4 and v1.6).
OLDEST_GATEWAY_API = (1, 4)
# Upstream's agents: the names and pod labels of Istio's ztunnel and istio-cni charts.
UPSTREAM_AGENTS = {"ztunnel": "ztunnel", "istio-cni-node": "istio-cni"}
UPSTREAM_POD_LABELS = {("app", "ztunnel"): "ztunnel", ("k8s-app", "istio-cni-node"): "istio-cni"}
MAX_ITEMS = 20


# How much a finding matters; the exit code is 1 when any is blocking.
# Plain words, not a vocabulary of reasons: what a finding says is its message.
Level = Literal["ok", "info", "warning", "blocking"]
OK: Level = "ok"
INFO: Level = "info"
WARNING: Level = "warning"
BLOCKING: Level = "blocking"
LEVELS: tuple[Level, ...] = (OK, INFO, WARNING, BLOCKING)


@dataclass(frozen=True)
class Finding:
    """One thing precheck says: the check, its level, a sentence, and what it names."""

    check: str
    level: Level
    message: str
    items: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The finding in `-o json`."""
        return {
            "check": self.check,
            "level": self.level,
            "message": self.message,
            "items": list(self.items),
        }


@dataclass(frozen=True)
class Webhook:
    """The redirection-wait webhook's configuration as the API server holds it."""

    configured: bool = False
    service: str | None = None  # namespace/name it calls
    url: str | None = None
    ready_endpoints: int | None = None  # of the Service; None when not read


@dataclass(frozen=True)
class Snapshot:
    """What the command read from the cluster. Mappings are API JSON."""

    kube_version: tuple[int, int] | None
    kube_version_text: str
    nodes: Sequence[Mapping[str, Any]]
    spec: AmbientMeshSpec
    mesh_installed: bool
    istiod_service: bool
    istiod: Mapping[str, Any] | None
    crds: Mapping[str, Mapping[str, Any]]
    daemonsets: Sequence[Mapping[str, Any]]
    namespaces: Mapping[str, Mapping[str, str]]
    waypoints: Mapping[tuple[str, str], bool]
    # "namespace/name: why" of enrolled Windows pods without the workaround
    # (the webhook's decision on each stored pod).
    windows_misses: Sequence[str]
    webhook: Webhook
    # What could not be read (RBAC), said once.
    unreadable: Sequence[str] = ()
    # Helm releases of Istio's agent charts in spec.namespace, the live objects
    # their records name (None: not there), and the objects there that carry
    # Helm's metadata (cluster/helm_releases.py): what spec.adopt would take.
    helm_releases: Mapping[str, HelmRelease] = field(default_factory=dict)
    helm_live: Mapping[ObjectKey, Mapping[str, Any] | None] = field(default_factory=dict)
    helm_labelled: Sequence[Mapping[str, Any]] = ()
    mesh_uid: str = ""
    # status.held of the AmbientMesh: agents that keep the template they run.
    held: HeldTemplates | None = None
    # status.revisions of the AmbientMesh: each istiod revision and who uses it.
    revisions: Sequence[RevisionStatus] = ()
    # The running operator's --default-registry (the chart's value registry),
    # which stands for spec.images.registry when the AmbientMesh names none.
    default_registry: str | None = None

    @functools.cached_property
    def effective_spec(self) -> AmbientMeshSpec:
        """The spec as the operator reads it: with its default registry where none is set."""
        return self.spec.with_default_registry(self.default_registry)

    def node_facts(self) -> tuple[list[NodeFacts], list[str]]:
        """Facts of every Node, and the names of those too malformed to read."""
        facts, bad = [], []
        for node in self.nodes:
            try:
                facts.append(NodeFacts.from_node(node))
            except ValueError as exc:
                bad.append(f"{(node.get('metadata') or {}).get('name', '?')}: {exc}")
        return facts, bad

    @functools.cached_property
    def rendered(self) -> RenderResult:
        """The render of the spec over these nodes: its verdicts and its agents' accounts."""
        facts, _ = self.node_facts()
        return render_dataplane(
            self.effective_spec, ClusterFacts(nodes=tuple(facts)), cni_rbac=False
        )


@dataclass(frozen=True)
class Check:
    """One row of the table: what it looks at, when it blocks, when it warns."""

    name: str
    what: str
    blocks: str
    warns: str
    judge: Callable[[Snapshot], list[Finding]]


def _one(check: str, level: Level, message: str, items: Sequence[str] = ()) -> list[Finding]:
    shown = list(items[:MAX_ITEMS])
    if len(items) > MAX_ITEMS:
        shown.append(f"... and {len(items) - MAX_ITEMS} more")
    return [Finding(check, level, message, tuple(shown))]


# -- the checks ------------------------------------------------------------------------


def _kubernetes(snap: Snapshot) -> list[Finding]:
    oldest, newest = c.KUBE_MINORS
    supported = f"1.{oldest} to 1.{newest}"
    version = snap.kube_version
    if version is None:
        return _one(
            "kubernetes",
            WARNING,
            f"the API server reports no release version ({snap.kube_version_text}); the "
            f"operator supports Kubernetes {supported}",
        )
    shown = f"Kubernetes {version[0]}.{version[1]}"
    if version[0] != 1 or version[1] < oldest:
        return _one(
            "kubernetes",
            BLOCKING,
            f"{shown} is older than 1.{oldest}, the oldest the operator supports ({supported})",
        )
    if version[1] > newest:
        return _one(
            "kubernetes",
            WARNING,
            f"{shown} is newer than 1.{newest}, the newest the manifests are validated against",
        )
    return _one("kubernetes", OK, f"{shown} (supported: {supported})")


def _release(build: str | None) -> str:
    if build is None:
        return "unknown build"
    name = c.WINDOWS_BUILD_NAMES.get(build)
    return f"{name} ({build})" if name else build


def _nodes(snap: Snapshot) -> list[Finding]:
    facts, bad = snap.node_facts()
    groups = Counter(
        f"{n.os or 'unknown OS'}/{n.arch or 'unknown arch'}"
        + (f" {_release(n.build)}" if n.os == "windows" else "")
        for n in facts
    )
    inventory = [f"{group}: {count} node(s)" for group, count in sorted(groups.items())]
    verdicts = snap.rendered.verdicts
    served = [v for v in verdicts if v.supported]
    unsupported = [
        f"{v.node}: {v.reason}: {v.message}"
        for v in verdicts
        if not v.supported and v.reason not in INTENDED_EXCLUSIONS
    ]
    excluded = [
        f"{v.node}: {v.reason}: {v.message}"
        for v in verdicts
        if not v.supported and v.reason in INTENDED_EXCLUSIONS
    ]
    out = _one("nodes", INFO, f"{len(facts)} node(s) by OS, architecture and build", inventory)
    if bad:
        out += _one("nodes", WARNING, f"{len(bad)} node(s) cannot be read", bad)
    if not served:
        out += _one(
            "nodes",
            BLOCKING,
            "no node can run the ambient agents",
            unsupported + excluded,
        )
        return out
    if unsupported:
        out += _one(
            "nodes",
            WARNING,
            f"{len(unsupported)} node(s) can never run the agents; pods there are not in the mesh",
            unsupported,
        )
    if excluded:
        out += _one("nodes", INFO, f"{len(excluded)} node(s) left out by the spec", excluded)
    if not unsupported:
        out += _one("nodes", OK, f"{len(served)} node(s) can run the agents")
    return out


def _platform(snap: Snapshot) -> list[Finding]:
    guess = detect_platform(snap.nodes)
    level = WARNING if guess.conflicting else INFO
    return _one("platform", level, f"detected: {guess.platform}", guess.evidence)


def _istiod_name(snap: Snapshot) -> str:
    return f"{snap.spec.namespace}/{snap.spec.istiod.service()}"


def _env(deployment: Mapping[str, Any] | None) -> dict[str, str]:
    """The discovery container's literal environment (valueFrom entries are left out)."""
    containers = ((deployment or {}).get("spec") or {}).get("template", {}).get("spec", {})
    for container in containers.get("containers") or []:
        if container.get("name") == ISTIOD_CONTAINER:
            return {
                str(e.get("name")): str(e.get("value"))
                for e in container.get("env") or []
                if "value" in e
            }
    return {}


def _istiod(snap: Snapshot) -> list[Finding]:
    name = _istiod_name(snap)
    if snap.spec.istiod.address is not None and not snap.istiod_service:
        return _one(
            "istiod",
            INFO,
            f"spec.istiod.address is {snap.spec.istiod.address}; istiod there is not checked",
        )
    if not snap.istiod_service:
        return _one(
            "istiod",
            BLOCKING,
            f"no istiod: Service {name} not found. Install Istio's base and istiod charts with "
            f"--set profile=ambient in {snap.spec.namespace} (or point spec.istiod at yours)",
        )
    if snap.istiod is None:
        return _one(
            "istiod",
            WARNING,
            f"Service {name} exists but no Deployment {name}: its version, ambient mode and "
            "trusted accounts cannot be checked",
        )
    version = istiod_version(snap.istiod)
    image = workload_image(snap.istiod, ISTIOD_CONTAINER) or "no image"
    if version is None:
        return _one("istiod", WARNING, f"istiod {name} runs {image}, which names no Istio version")
    return _one("istiod", OK, f"istiod {name} {version} ({image})")


def _no_istiod(check: str, snap: Snapshot) -> list[Finding] | None:
    if snap.istiod is None:
        return _one(check, INFO, "not checked: no istiod Deployment")
    return None


def _ambient_enabled(snap: Snapshot) -> list[Finding]:
    skipped = _no_istiod("ambient-enabled", snap)
    if skipped is not None:
        return skipped
    value = _env(snap.istiod).get("PILOT_ENABLE_AMBIENT")
    if value != "true":
        shown = "not set" if value is None else f"{value!r}"
        return _one(
            "ambient-enabled",
            BLOCKING,
            f"istiod does not serve ambient: PILOT_ENABLE_AMBIENT is {shown}. Install or upgrade "
            "the istiod chart with --set profile=ambient",
        )
    out = _one("ambient-enabled", OK, "istiod serves ambient (PILOT_ENABLE_AMBIENT=true)")
    if (
        snap.spec.node_readiness.enabled
        and _env(snap.istiod).get("PILOT_ENABLE_NODE_UNTAINT_CONTROLLERS") == "true"
    ):
        out += _one(
            "ambient-enabled",
            WARNING,
            "istiod's own untaint controller is on (the istiod chart's taint.enabled): it "
            "removes the readiness taint once istio-cni alone is Ready, before ztunnel; turn "
            "it off when spec.nodeReadiness.enabled",
        )
    return out


def _node_trust(snap: Snapshot) -> list[Finding]:
    skipped = _no_istiod("node-trust", snap)
    if skipped is not None:
        return skipped
    trust = istiod_trust(snap.rendered, snap.istiod)
    trusted, missing = trust if trust is not None else ([], [])
    if missing:
        return _one("node-trust", BLOCKING, trust_message(trusted, missing), missing)
    return _one(
        "node-trust",
        OK,
        f"istiod's CA_TRUSTED_NODE_ACCOUNTS lists every ztunnel account: {','.join(trusted)}",
    )


def _multi_cluster(snap: Snapshot) -> list[Finding]:
    skipped = _no_istiod("multi-cluster", snap)
    if skipped:
        return skipped
    # What istiod's chart renders from global.multiCluster.clusterName (default Kubernetes).
    istiod_cluster = _env(snap.istiod).get("CLUSTER_ID", c.DEFAULT_CLUSTER_ID)
    agents_cluster = snap.spec.multi_cluster.cluster_name or c.DEFAULT_CLUSTER_ID
    out: list[Finding] = []
    if istiod_cluster != agents_cluster:
        out += _one(
            "multi-cluster",
            BLOCKING,
            f"istiod's cluster is {istiod_cluster} (CLUSTER_ID, the istiod chart's "
            f"global.multiCluster.clusterName) but the agents say {agents_cluster} "
            "(spec.multiCluster.clusterName): istiod's CA refuses the certificates ztunnel "
            f"asks for its node's workloads (no node authorizer for cluster {agents_cluster}). "
            f"Set spec.multiCluster.clusterName to {istiod_cluster}",
        )
    labels = snap.namespaces.get(snap.spec.namespace, {})
    label = labels.get(c.LABEL_NETWORK)
    if (snap.spec.network or None) != (label or None):
        out += _one(
            "multi-cluster",
            WARNING,
            f"the agents' network is {snap.spec.network or 'unset'} (spec.network) but "
            f"namespace {snap.spec.namespace} is labelled {c.LABEL_NETWORK}="
            f"{label or '(none)'}, which istiod takes as its own network: set both alike",
        )
    if out:
        return out
    where = f", network {snap.spec.network}" if snap.spec.network else ""
    return _one(
        "multi-cluster", OK, f"istiod and the agents are in cluster {agents_cluster}{where}"
    )


def _version_skew(snap: Snapshot) -> list[Finding]:
    skipped = _no_istiod("version-skew", snap)
    if skipped is not None:
        return skipped
    control = istiod_version(snap.istiod)
    chosen = agent_tag(snap.spec.images.tag_if_set(), c.ISTIO_VERSION, snap.istiod)
    data = parse_version(chosen.tag)
    if control is None or data is None:
        return _one("version-skew", INFO, "not checked: a version is unknown")
    problem = skew_problem(control, data)
    if problem is not None:
        return _one("version-skew", BLOCKING, problem)
    followed = f" ({chosen.note})" if chosen.source == "istiod" else ""
    newest = older_patch(control, data)
    if newest is not None:
        fixes = [
            f"{r.version}: {fix}"
            for r in fixed_since(control.line_name, data.patch or 0)
            for fix in r.fixes
        ]
        return _one(
            "version-skew",
            WARNING,
            f"istiod {control} serves agents at {data}{followed}; the newest patch of "
            f"{control.line_name} this operator knows is {newest}: run the agents at istiod's "
            "minor, newest patch (docs/versions.md)",
            fixes,
        )
    return _one("version-skew", OK, f"istiod {control} serves agents at {data}{followed}")


def _gateway_api(snap: Snapshot) -> list[Finding]:
    missing = [name for name in GATEWAY_API_CRDS if name not in snap.crds]
    if missing:
        return _one(
            "gateway-api",
            WARNING,
            "Gateway API CRDs are not installed: no waypoint (L7) can be used; L4 ambient works. "
            "Install Gateway API's standard channel, v1.4 or newer",
            missing,
        )
    annotations = (snap.crds[GATEWAY_API_CRDS[1]].get("metadata") or {}).get("annotations") or {}
    bundle = str(annotations.get(BUNDLE_VERSION) or "")
    channel = str(annotations.get(CHANNEL) or "unknown channel")
    release = parse_version(bundle)
    if release is None:
        return _one("gateway-api", WARNING, f"Gateway API CRDs of an unknown version ({channel})")
    shown = f"Gateway API {bundle} ({channel})"
    if release.line < OLDEST_GATEWAY_API:
        oldest = ".".join(map(str, OLDEST_GATEWAY_API))
        return _one(
            "gateway-api",
            WARNING,
            f"{shown} is older than v{oldest}, the oldest the waypoints are tested with",
        )
    return _one("gateway-api", OK, shown)


def _upstream_agent(ds: Mapping[str, Any]) -> str | None:
    """'ztunnel' or 'istio-cni' when a DaemonSet not ours runs Istio's own agent."""
    meta = ds.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(c.LABEL_MANAGED_BY) == c.MANAGED_BY:
        return None
    pod_labels = ((ds.get("spec") or {}).get("template") or {}).get("metadata", {}).get(
        "labels"
    ) or {}
    for (key, value), agent in UPSTREAM_POD_LABELS.items():
        if pod_labels.get(key) == value:
            return agent
    return UPSTREAM_AGENTS.get(str(meta.get("name") or ""))


def _upstream_agents(snap: Snapshot) -> list[Finding]:
    found = []
    adopting = {(name, snap.spec.namespace) for name in snap.spec.adopt.helm_releases}
    for ds in snap.daemonsets:
        agent = _upstream_agent(ds)
        if agent is None or helm_release_of(ds) in adopting:
            continue  # spec.adopt takes it over: the helm-releases row says whether it can
        meta = ds.get("metadata") or {}
        labels = meta.get("labels") or {}
        release = (meta.get("annotations") or {}).get("meta.helm.sh/release-name")
        by = f"Helm release {release}" if release else labels.get(c.LABEL_MANAGED_BY) or "unknown"
        found.append(f"{meta.get('namespace')}/{meta.get('name')}: {agent}, managed by {by}")
    if found:
        return _one(
            "upstream-agents",
            BLOCKING,
            f"{len(found)} DaemonSet(s) already run Istio's own node agents: two ztunnels or two "
            "istio-cni on a node fight over each pod's redirection, and the operator leaves "
            "objects it did not create alone (NameConflict). Name their Helm releases in "
            "spec.adopt.helmReleases to take them over without a restart (docs/migration.md), "
            "or uninstall them first (helm uninstall ztunnel / istio-cni)",
            sorted(found),
        )
    return _one("upstream-agents", OK, "no other ztunnel or istio-cni DaemonSet")


def _helm_releases(snap: Snapshot) -> list[Finding]:
    namespace = snap.spec.namespace
    if not snap.helm_releases:
        return _one(
            "helm-releases", OK, f"no Helm release of Istio's ztunnel or istio-cni in {namespace}"
        )
    rendered = {key_of(obj): obj for obj in snap.rendered.objects}
    owner = Owner(f"{c.API_GROUP}/{c.API_VERSION}", c.KIND, c.MESH_NAME, snap.mesh_uid)
    named = set(snap.spec.adopt.helm_releases)
    out: list[Finding] = []
    for name, release in sorted(snap.helm_releases.items()):
        where = f"Helm release {namespace}/{name} ({release.chart} {release.chart_version})"
        plan = plan_takeover(
            [name],
            namespace,
            snap.helm_releases,
            snap.helm_live,
            rendered.keys(),
            owner,
            labelled=snap.helm_labelled,
        )
        if plan.refused:
            out += _one(
                "helm-releases",
                WARNING,
                f"{where}: spec.adopt would take nothing of it, for the reasons listed",
                plan.refused,
            )
            continue
        ours = [
            live
            for key, live in snap.helm_live.items()
            if key in rendered and live is not None and conflict(live, owner) is None
        ]
        if not plan.taken and ours:
            out += _one(
                "helm-releases",
                WARNING,
                f"{where}: its objects are the AmbientMesh's already, but Helm still records "
                f"them, so `helm uninstall {name}` would delete them: have Helm forget it "
                f"(kubectl delete secret -n {namespace} -l owner=helm,name={name})",
                sorted(describe(obj) for obj in ours),
            )
            continue
        rolls = [
            pending_roll(rendered[key], live)
            for key, (_, live) in sorted(plan.taken.items())
            if key[1] == "DaemonSet"
        ]
        later = "; ".join(
            f"{roll.name}: {roll.pods} pod(s) on {roll.platform or 'linux'}, "
            f"{len(roll.differences)} template field(s) differ"
            for roll in rolls
        )
        consent = (
            "spec.adopt names it: it takes"
            if name in named
            else (f"with {name} in spec.adopt.helmReleases, the operator would take")
        )
        out += _one(
            "helm-releases",
            INFO,
            f"{where}: {consent} {len(plan.taken)} object(s) as they run, and no pod restarts; "
            f"the first change of the AmbientMesh afterwards replaces {later or 'no pod'}",
            [
                *sorted(describe(live) for _, live in plan.taken.values()),
                *(f"left with Helm: {what}" for what in plan.left_with_helm),
            ],
        )
    return out


def _held_templates(snap: Snapshot) -> list[Finding]:
    held = snap.held
    if held is None:
        return _one("held-templates", OK, "every agent runs the operator's pod template")
    order = [PLATFORM_LINUX, *sorted({ds.platform for ds in held.daemon_sets} - {PLATFORM_LINUX})]
    restarts = "; ".join(
        f"{platform}: {pods} pod(s)" for platform, pods, _ in per_platform(held, order)
    )
    return _one(
        "held-templates",
        INFO,
        f"agents keep the pod template they run (status.held); the operator's render would "
        f"restart {restarts}. Nothing restarts until the AmbientMesh changes or you approve: "
        f"{approve_command(held.approval)}",
        [
            f"{ds.name} ({ds.platform}, {ds.reason}{', approved' if ds.approved else ''}): "
            f"{', '.join(ds.differences) or 'no field listed'}"
            for ds in held.daemon_sets
        ],
    )


def _revisions(snap: Snapshot) -> list[Finding]:
    if not snap.revisions:
        return _one("revisions", OK, "no istiod revision reported yet (status.revisions)")
    items = [
        f"{r.name}: istiod {r.version or ('of unknown version' if r.istiod else 'not found')}"
        + (f", tags {', '.join(r.tags)}" if r.tags else "")
        + (", the agents" if r.agents else "")
        + f", {r.waypoints} waypoint(s)"
        + (f", namespaces {', '.join(r.namespaces)}" if r.namespaces else "")
        for r in snap.revisions
    ]
    skewed = [f"{r.name}: {line}" for r in snap.revisions for line in r.skew]
    missing = [r.name for r in snap.revisions if not r.istiod and (r.waypoints or r.namespaces)]
    if skewed or missing:
        why = [*skewed, *(f"{name}: used, but no istiod serves it" for name in missing)]
        return _one(
            "revisions",
            WARNING,
            f"{len(snap.revisions)} istiod revision(s); {len(why)} problem(s): " + "; ".join(why),
            items,
        )
    return _one("revisions", INFO, f"{len(snap.revisions)} istiod revision(s)", items)


def _namespace_labels(snap: Snapshot) -> list[Finding]:
    found = [
        f"{name}: {reason}: {message}"
        for name, labels in sorted(snap.namespaces.items())
        for reason, message in namespace_problems(name, labels, snap.waypoints, enrollment=True)
    ]
    if found:
        return _one(
            "namespace-labels",
            WARNING,
            f"{len(found)} problem(s) with namespaces' ambient labels",
            found,
        )
    enrolled = sum(1 for labels in snap.namespaces.values() if _enrolled(labels))
    return _one("namespace-labels", OK, f"{enrolled} namespace(s) enrolled, labels valid")


def _enrolled(labels: Mapping[str, str]) -> bool:
    return labels.get(c.LABEL_DATAPLANE_MODE) == "ambient"


def _windows_pods(snap: Snapshot) -> list[Finding]:
    if snap.windows_misses:
        fix = (
            "Delete them once the webhook runs"
            if snap.spec.new_pod_workaround.enabled
            else "spec.newPodWorkaround.enabled is false: turn it on, then delete them"
        )
        return _one(
            "windows-pods",
            WARNING,
            f"{len(snap.windows_misses)} enrolled Windows pod(s) that can run on pre-WS2025 "
            "nodes lack the redirection-wait init container: started before istio-cni "
            f"redirects them, their traffic bypasses ztunnel. {fix}",
            snap.windows_misses,
        )
    return _one("windows-pods", OK, "no enrolled Windows pod lacks the workaround")


def _bundled_images(snap: Snapshot) -> list[Finding]:
    spec = snap.effective_spec
    builds = sorted({d.platform for d in snap.rendered.daemonsets if d.platform != PLATFORM_LINUX})
    if not builds:
        return _one("bundled-images", INFO, "no Windows node gets the agents: none needed")
    problems = [
        w
        for w in (
            v.windows_image_warning(spec, v.ZTUNNEL, builds),
            v.windows_image_warning(spec, v.ISTIO_CNI, builds),
            v.redirection_wait_warning(spec, builds),
        )
        if w
    ]
    if problems:
        return _one(
            "bundled-images",
            WARNING,
            f"{len(problems)} image(s) the Windows nodes need are unset or placeholders; "
            f"`{bundled.BUILD_COMMAND}` builds and pushes them (docs/images.md)",
            problems,
        )
    where = (
        f"{bundled.REGISTRY_FIELD} {spec.images.registry}"
        if spec.images.registry
        else "the images set in full"
    )
    return _one(
        "bundled-images",
        OK,
        f"the Windows agents and the redirection-wait image come from {where}",
    )


def _webhook(snap: Snapshot) -> list[Finding]:
    hook = snap.webhook
    if not hook.configured:
        if not snap.mesh_installed:
            return _one("webhook", INFO, "not installed yet (no AmbientMesh)")
        level = WARNING if snap.spec.new_pod_workaround.enabled else INFO
        return _one(
            "webhook",
            level,
            "MutatingWebhookConfiguration ambient-operator not found: new Windows pods on "
            "pre-WS2025 nodes get no redirection-wait init container. Is the operator running "
            "with its webhook on?",
        )
    if hook.service is not None:
        if not hook.ready_endpoints:
            return _one(
                "webhook",
                WARNING,
                f"the webhook's Service {hook.service} has no ready endpoint: the API server "
                "cannot call it and admits new Windows pods without the workaround "
                "(failurePolicy Ignore)",
            )
        return _one(
            "webhook",
            OK,
            f"the webhook's Service {hook.service} has {hook.ready_endpoints} ready endpoint(s)",
        )
    return _one(
        "webhook",
        OK,
        f"configured; the API server calls {hook.url} (not probed from here)",
    )


CHECKS: tuple[Check, ...] = (
    Check(
        "kubernetes",
        "The API server's version.",
        f"Older than 1.{c.KUBE_MINORS[0]}.",
        f"Newer than 1.{c.KUBE_MINORS[1]}, or no release version reported.",
        _kubernetes,
    ),
    Check(
        "nodes",
        "Nodes by OS, architecture and Windows build; the render's verdict of each.",
        "No node can run the agents.",
        "Some nodes never can (named, with the reason); nodes the spec leaves out are info.",
        _nodes,
    ),
    Check(
        "platform",
        "The platform the Nodes point at, with the evidence.",
        "Never.",
        "Nodes point at more than one platform.",
        _platform,
    ),
    Check(
        "istiod",
        "istiod's Service and Deployment in spec.namespace, and its version.",
        "No istiod Service (and no spec.istiod.address).",
        "A Service without a Deployment to read, or an image that names no version.",
        _istiod,
    ),
    Check(
        "ambient-enabled",
        "istiod's PILOT_ENABLE_AMBIENT (what the istiod chart's ambient profile sets).",
        "Not true.",
        "istiod's own untaint controller is on while spec.nodeReadiness is.",
        _ambient_enabled,
    ),
    Check(
        "node-trust",
        "istiod's CA_TRUSTED_NODE_ACCOUNTS against every ztunnel account the render makes.",
        "An account is missing (those ztunnels get no certificates).",
        "Never.",
        _node_trust,
    ),
    Check(
        "multi-cluster",
        "istiod's CLUSTER_ID against spec.multiCluster.clusterName, and spec.network against "
        "the topology.istio.io/network label of spec.namespace.",
        "The cluster names differ (istiod's CA refuses ztunnel's certificates for its node's "
        "workloads).",
        "The network and the namespace's label differ.",
        _multi_cluster,
    ),
    Check(
        "version-skew",
        "istiod's version against the agents' (spec.images.tag, or istiod's own when it is "
        "unset), by Istio's support rule, and the newest patch of istiod's minor.",
        "Outside the rule (agents newer, or more than one minor behind).",
        "The agents on an older patch of istiod's minor than the newest this operator knows.",
        _version_skew,
    ),
    Check(
        "gateway-api",
        "Gateway API CRDs, their bundle version and channel.",
        "Never: L4 ambient works without them.",
        "Missing, of an unknown version, or older than v1.4.",
        _gateway_api,
    ),
    Check(
        "upstream-agents",
        "DaemonSets of Istio's own ztunnel or istio-cni charts (or of those names).",
        "Any, but those of the Helm releases spec.adopt.helmReleases names.",
        "Never.",
        _upstream_agents,
    ),
    Check(
        "helm-releases",
        "Helm releases of Istio's ztunnel and istio-cni charts in spec.namespace, and what "
        "spec.adopt would do with each: the objects taken, the pods restarted (none), and "
        "what the first change afterwards replaces.",
        "Never.",
        "A release spec.adopt would refuse (each object and why), or one whose objects are "
        "the operator's already while Helm still records them.",
        _helm_releases,
    ),
    Check(
        "revisions",
        "status.revisions of the AmbientMesh: each istiod revision seen, its version and tags, "
        "and the agents, waypoints and namespaces that use it.",
        "Never.",
        "A revision used by waypoints or namespaces that no istiod serves, or the agents or "
        "waypoints outside Istio's support rule with their revision's istiod.",
        _revisions,
    ),
    Check(
        "held-templates",
        "status.held of the AmbientMesh: agent DaemonSets that keep the pod template they run "
        "(written by another operator version, or taken over from Helm), per platform, the "
        "pods that would restart, and the command that approves the roll.",
        "Never.",
        "Never: it is told as info, with the approval command.",
        _held_templates,
    ),
    Check(
        "namespace-labels",
        "Namespaces' ambient labels: near-miss keys, invalid values, sidecar and ambient "
        "together, use-waypoint naming no waypoint or set on a namespace not enrolled.",
        "Never.",
        "Any problem (named per namespace, with the fix).",
        _namespace_labels,
    ),
    Check(
        "windows-pods",
        "Enrolled Windows pods that the webhook would give the redirection-wait init "
        "container, running without it.",
        "Never.",
        "Any (named).",
        _windows_pods,
    ),
    Check(
        "bundled-images",
        "The images only this project builds (`make images`, docs/images.md): the Windows "
        "agents and the multi-build redirection-wait image, from spec.images.registry (or the "
        "running operator's --default-registry, the chart's value registry) or set in full.",
        "Never.",
        "One that is unset or a placeholder under Istio's hub while Windows nodes get the "
        "agents (named, with the command that builds it and the field to set).",
        _bundled_images,
    ),
    Check(
        "webhook",
        "The MutatingWebhookConfiguration ambient-operator and its Service's ready endpoints.",
        "Never.",
        "An AmbientMesh exists but no configuration, or its Service has no ready endpoint.",
        _webhook,
    ),
)


def judge(snap: Snapshot) -> list[Finding]:
    """Every check's findings, in table order, and one for what could not be read."""
    out: list[Finding] = []
    if snap.unreadable:
        out += _one(
            "access",
            WARNING,
            "some objects could not be read; the checks that need them are incomplete",
            list(snap.unreadable),
        )
    for check in CHECKS:
        out += check.judge(snap)
    return out


def blocked(findings: Sequence[Finding]) -> bool:
    """Whether anything blocks: the command exits 1."""
    return any(f.level == BLOCKING for f in findings)
