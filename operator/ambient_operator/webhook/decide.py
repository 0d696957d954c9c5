"""Which new pods get the redirection-wait init container, and the change that adds it.

Pure: the caller passes the pod, its namespace's labels and a `Context` built
from the caches; nothing here reads the cluster or the clock. The admission
webhook and the misses check call the same `decide`, so "should have been
mutated" means exactly what the webhook would have done.

See shared DESIGN "The pre-WS2025 new-pod problem": before WS2025 a pod's
network compartment exists only once a container runs in it, so istio-cni
cannot redirect a new pod when its CNI plugin runs. The init container holds
the pod's own containers back until istio-cni reports redirection.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ValidationError

from ambient_operator.api import bundled
from ambient_operator.api import constants as c
from ambient_operator.api.conditions import AdmissionReason
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster import scheduling
from ambient_operator.cluster.enrollment import namespace_enrolled, namespace_sidecar
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.cluster.state import SIDECAR_INJECT_LABEL, SIDECAR_STATUS_ANNOTATION
from ambient_operator.render import values as v
from ambient_operator.render.verdicts import assign

# Ours: "false" opts a pod out; otherwise the webhook records what it did.
ANNOTATION = "ambientoperator.io/redirection-wait"
OPT_OUT_VALUE = "false"
CONTAINER_NAME = "ambient-redirection-wait"
VOLUME_NAME = "ambient-redirection-wait-podinfo"
MOUNT_DIR = "C:\\ambient\\podinfo"
ANNOTATIONS_FILE = "annotations"
ENV_TIMEOUT = "REDIRECTION_WAIT_TIMEOUT_SECONDS"
ENV_FILE = "REDIRECTION_WAIT_FILE"
ANY_BUILD = "any"
# The annotation's first word on a pod admitted without the init container
# because its image is unavailable; such a pod stays a miss (misses.py).
INJECTED = "injected"
WITHHELD = "withheld"

# cmd.exe, because nanoserver (the per-build default image) has no
# PowerShell, and servercore would cost gigabytes per node for a loop.
# The script has no double quotes: the container runtime quotes each argv
# entry with backslash escapes that cmd.exe does not undo. findstr /R lets
# `.` stand for the quotes around the value in the downward-API file
# (`key="value"` lines); /B anchors at line start without `^`, which cmd
# would eat. `ping -n 2` to loopback waits about one second (timeout.exe
# refuses to run without a console). The one `%i` is harmless: in cmd's
# command-line mode an undefined `%i in (1,1,%` is kept as text and scanning
# resumes at its closing `%`, so the environment variables still expand.
WAIT_SCRIPT = (
    f"for /L %i in (1,1,%{ENV_TIMEOUT}%) do @("
    "findstr /B /R /C:ambient\\.istio\\.io/redirection=.enabled. "
    f"%{ENV_FILE}% >nul 2>&1 && exit 0 & ping -n 2 127.0.0.1 >nul) & "
    "echo redirection-wait: ambient.istio.io/redirection=enabled did not appear on this pod "
    f"within %{ENV_TIMEOUT}% seconds; is istio-cni running and healthy on this node? 1>&2 & "
    "exit 1"
)
COMMAND = ("cmd.exe", "/S", "/C", WAIT_SCRIPT)

# Init containers count toward the pod's request only when they ask for more
# than its app containers together, so small requests cost nothing.
REQUESTS = {"cpu": "10m", "memory": "32Mi"}
# A Guaranteed pod stays Guaranteed only if every container has limits equal
# to requests; then give ours headroom, since a Windows job object limit
# also covers the container's system processes.
GUARANTEED = {"cpu": "100m", "memory": "128Mi"}

# The init container's pull policy unless spec.images.pullPolicy says otherwise.
DEFAULT_PULL_POLICY = "IfNotPresent"
# withheld: the pod needs the init container, but the image it would get is
# known not to exist; it is admitted without it and annotated with why.
Action = Literal["inject", "reorder", "withheld", "none"]

# Reasons (AdmissionReason): CamelCase, shown in the pod annotation and the metric.


@dataclass(frozen=True)
class MeshFacts:
    """What the decision needs of the AmbientMesh and the nodes it serves."""

    spec: AmbientMeshSpec
    # Pre-WS2025 builds the spec gives agents, whether or not nodes exist yet.
    served_builds: frozenset[str]
    # Pre-WS2025 nodes that run (or are about to run) the agents.
    capable_nodes: tuple[NodeFacts, ...]

    @classmethod
    def of(cls, spec: AmbientMeshSpec, nodes: Sequence[NodeFacts]) -> MeshFacts:
        """Facts of a valid spec over the current nodes."""
        windows = spec.platforms.windows
        served = frozenset(
            b
            for b in c.PRE_WS2025_BUILDS
            if windows.enabled and (windows.builds is None or b in windows.builds)
        )
        per_build = assign(spec, nodes).windows
        capable = tuple(n for b in sorted(served) for n in per_build.get(b, ()))
        return cls(spec=spec, served_builds=served, capable_nodes=capable)

    def image(self, build: str | None) -> str | None:
        """The per-build image of a fixed build, else the multi-build image; None when the
        one it comes to is known not to exist (render/values.py redirection_wait_image)."""
        if build:
            return v.build_wait_image(self.spec, build)
        return v.redirection_wait_image(self.spec)

    def inject(self, reason: AdmissionReason, message: str, build: str | None) -> Decision:
        """The decision to inject the init container for a build (None: any build); withheld,
        with the reason ImageUnavailable, when its image is unavailable."""
        workaround = self.spec.new_pod_workaround
        image = self.image(build)
        if image is None:
            return Decision(
                "withheld",
                AdmissionReason.IMAGE_UNAVAILABLE,
                f"{message}, but no {bundled.REDIRECTION_WAIT} image is known for "
                f"{'build ' + build if build else 'pods whose build is not fixed'} "
                f"({v.MULTI_BUILD_IMAGE_FIELD} and {bundled.REGISTRY_FIELD} are unset, or "
                "name a placeholder); admitted without the init container",
                build=build,
            )
        return Decision(
            "inject",
            reason,
            message,
            build=build,
            image=image,
            timeout_seconds=workaround.timeout_seconds,
            pull_policy=self.spec.images.pull_policy or DEFAULT_PULL_POLICY,
            pull_secrets=tuple(workaround.pull_secrets or ()),
        )


@dataclass(frozen=True)
class Context:
    """The cluster as the decision sees it."""

    nodes: tuple[NodeFacts, ...] = ()
    mesh: MeshFacts | None = None
    # Why there is no MeshFacts: absent, being deleted or invalid.
    mesh_problem: str = "no AmbientMesh named default exists"
    # RuntimeClass name -> its `scheduling` (nodeSelector, tolerations).
    runtime_classes: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @functools.cached_property
    def by_name(self) -> Mapping[str, NodeFacts]:
        """The nodes by name: a pod bound by nodeName is judged by one lookup.

        The misses are judged pod by pod on every pass; scanning 5,000 nodes
        for each of 50,000 bound pods kept a core busy for seconds a pass.
        """
        return {n.name: n for n in self.nodes}

    def candidates(self, spec: Mapping[str, Any]) -> Sequence[NodeFacts]:
        """The nodes a pod spec may be on before its other constraints: its node, when bound."""
        node_name = spec.get("nodeName")
        if not node_name:
            return self.nodes
        node = self.by_name.get(str(node_name))
        return () if node is None else (node,)

    @classmethod
    def build(
        cls,
        mesh: Mapping[str, Any] | None,
        nodes: Iterable[NodeFacts],
        runtime_classes: Mapping[str, Mapping[str, Any]] | None = None,
        default_registry: str | None = None,
    ) -> Context:
        """Context from the AmbientMesh object (or None), node facts and RuntimeClasses;
        `default_registry` (the operator's --default-registry) where the spec names none."""
        node_list = tuple(sorted(nodes, key=lambda n: n.name))
        rcs = dict(runtime_classes or {})
        if mesh is None:
            return cls(nodes=node_list, runtime_classes=rcs)
        if (mesh.get("metadata") or {}).get("deletionTimestamp"):
            return cls(
                nodes=node_list,
                runtime_classes=rcs,
                mesh_problem="the AmbientMesh is being deleted",
            )
        try:
            spec = AmbientMeshSpec.model_validate(mesh.get("spec") or {})
        except ValidationError as exc:
            return cls(
                nodes=node_list,
                runtime_classes=rcs,
                mesh_problem=f"the AmbientMesh spec is invalid ({exc.error_count()} errors)",
            )
        spec = spec.with_default_registry(default_registry)
        return cls(nodes=node_list, mesh=MeshFacts.of(spec, node_list), runtime_classes=rcs)


@dataclass(frozen=True)
class Decision:
    """What to do with one pod, and why."""

    action: Action
    # Shown in the pod annotation and the metric.
    reason: AdmissionReason
    message: str
    build: str | None = None
    image: str | None = None
    timeout_seconds: int = 120
    pull_policy: str = DEFAULT_PULL_POLICY
    # Secrets of the pod's own namespace to pull the image with, added when missing.
    pull_secrets: tuple[str, ...] = ()

    @property
    def inject(self) -> bool:
        """The pod needs the init container and lacks it."""
        return self.action == "inject"

    def annotation(self) -> str:
        """Value of our annotation on a mutated (or withheld) pod."""
        what = WITHHELD if self.action == "withheld" else INJECTED
        return f"{what}; build={self.build or ANY_BUILD}; reason={self.reason}"


def _skip(reason: AdmissionReason, message: str) -> Decision:
    return Decision("none", reason, message)


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("metadata") or {}


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("spec") or {}


def _names(containers: Any) -> list[str]:
    return [str(ct.get("name")) for ct in containers or [] if isinstance(ct, Mapping)]


def has_container(pod: Mapping[str, Any]) -> bool:
    """The pod already carries our init container (by name)."""
    return CONTAINER_NAME in _names(_spec(pod).get("initContainers"))


def has_annotation(pod: Mapping[str, Any]) -> bool:
    """The pod carries our annotation, whatever its value."""
    return ANNOTATION in (_meta(pod).get("annotations") or {})


def withheld(pod: Mapping[str, Any]) -> bool:
    """The webhook admitted the pod without the init container its image was unavailable for."""
    value = (_meta(pod).get("annotations") or {}).get(ANNOTATION)
    return isinstance(value, str) and value.startswith(WITHHELD)


def opted_out(pod: Mapping[str, Any]) -> bool:
    """The pod asks to be left alone."""
    value = (_meta(pod).get("annotations") or {}).get(ANNOTATION)
    return isinstance(value, str) and value.strip().lower() == OPT_OUT_VALUE


def sidecar(pod: Mapping[str, Any], namespace_labels: Mapping[str, str]) -> bool:
    """Istio injects (or injected) a sidecar: sidecar wins over ambient."""
    labels = _meta(pod).get("labels") or {}
    annotations = _meta(pod).get("annotations") or {}
    if SIDECAR_STATUS_ANNOTATION in annotations:
        return True
    inject = labels.get(SIDECAR_INJECT_LABEL)
    if inject == "true":
        return True
    return namespace_sidecar(namespace_labels) and inject != "false"


def effective_spec(
    spec: Mapping[str, Any], runtime_classes: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The pod spec with its RuntimeClass's nodeSelector and tolerations merged in.

    The RuntimeClass admission plugin merges them before webhooks run, so this
    is usually a no-op; it matters for pods read back from elsewhere.
    """
    out = dict(spec)
    name = spec.get("runtimeClassName")
    scheduling_ = runtime_classes.get(name) if isinstance(name, str) else None
    if scheduling_:
        out["nodeSelector"] = {
            **(scheduling_.get("nodeSelector") or {}),
            **(spec.get("nodeSelector") or {}),
        }
        out["tolerations"] = [
            *(spec.get("tolerations") or []),
            *(scheduling_.get("tolerations") or []),
        ]
    return out


def _term_values(term: Mapping[str, Any], key: str) -> set[str] | None:
    """Values a term allows for `key` through `In`, or None when it does not restrict it."""
    allowed: set[str] | None = None
    for expr in term.get("matchExpressions") or []:
        if expr.get("key") == key and expr.get("operator") == "In":
            values = {str(v) for v in expr.get("values") or []}
            allowed = values if allowed is None else allowed & values
    return allowed


def _required_values(spec: Mapping[str, Any], key: str) -> set[str] | None:
    """Values of label `key` that nodeSelector and required affinity allow; None: any."""
    allowed: set[str] | None = None
    selector = spec.get("nodeSelector") or {}
    if key in selector:
        allowed = {str(selector[key])}
    terms = scheduling.required_terms(spec)
    if terms:
        per_term = [_term_values(t, key) for t in terms]
        if all(v is not None for v in per_term):
            union: set[str] = set().union(*(v for v in per_term if v is not None))
            allowed = union if allowed is None else allowed & union
    return allowed


def target_os(spec: Mapping[str, Any], nodes: Sequence[NodeFacts]) -> str | None:
    """'windows', 'linux', or None when nothing in the pod says.

    `nodes` are those the pod may be on (Context.candidates), or every node.

    Explicit signals first (spec.os.name, then the kubernetes.io/os label
    required by nodeSelector or every affinity term, or a build pin, which only
    Windows nodes carry); then the placement: a pod constrained to nodes that
    are all Windows is a Windows pod.
    """
    os_name = (spec.get("os") or {}).get("name")
    if os_name in ("windows", "linux"):
        return str(os_name)
    wanted = _required_values(spec, c.LABEL_OS)
    if wanted is not None and len(wanted) == 1:
        return next(iter(wanted))
    if _required_values(spec, c.LABEL_WINDOWS_BUILD):
        return "windows"
    constrained = (
        spec.get("nodeName") or spec.get("nodeSelector") or scheduling.required_terms(spec)
    )
    if constrained:
        matching = [n for n in nodes if scheduling.node_matches(spec, n)]
        if matching and all(n.os == "windows" for n in matching):
            return "windows"
    return None


def may_target_windows(pod: Mapping[str, Any]) -> bool:
    """Cheap pre-filter without node facts: False only for pods that cannot be Windows pods."""
    spec = _spec(pod)
    if (spec.get("os") or {}).get("name") == "linux":
        return False
    if (spec.get("nodeSelector") or {}).get(c.LABEL_OS) == "linux":
        return False
    return bool(
        (spec.get("os") or {}).get("name") == "windows"
        or spec.get("nodeSelector")
        or scheduling.required_terms(spec)
        or spec.get("nodeName")
        or spec.get("runtimeClassName")
    )


def _guaranteed(spec: Mapping[str, Any]) -> bool:
    containers = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    if not containers:
        return False
    for ct in containers:
        res = ct.get("resources") or {}
        limits = res.get("limits") or {}
        requests = {**limits, **(res.get("requests") or {})}
        for name in ("cpu", "memory"):
            if name not in limits or str(requests.get(name)) != str(limits[name]):
                return False
    return True


def _security_context(spec: Mapping[str, Any]) -> dict[str, Any] | None:
    """The first app container's restrictions, so Pod Security admits ours as it did theirs.

    Its identity is not copied: the user must exist in our image, and every
    nanoserver and servercore image has ContainerUser.
    """
    containers = spec.get("containers") or []
    first = (containers[0].get("securityContext") if containers else None) or {}
    if not first:
        return None
    out = copy.deepcopy(dict(first))
    windows = dict(out.pop("windowsOptions", None) or {})
    windows.pop("runAsUserName", None)
    windows.pop("hostProcess", None)
    nonroot = out.get("runAsNonRoot") or (spec.get("securityContext") or {}).get("runAsNonRoot")
    if nonroot:
        windows["runAsUserName"] = "ContainerUser"
    if windows:
        out["windowsOptions"] = windows
    return out or None


# Where the API server's ServiceAccount admission mounts a pod's token, from
# a projected volume it names kube-api-access-<random>.
TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_VOLUME_PREFIX = "kube-api-access-"


def _token_mount(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The token mount ServiceAccount admission gave the pod's containers, for ours too.

    That admission runs again after a webhook changed the pod, and would add
    the mount to our container then; a change after our answer makes the API
    server call us a second time (reinvocationPolicy IfNeeded), doubling what
    we add to every pod's creation. With the mount already there, it changes
    nothing. None when the pod mounts no token (automount off).
    """
    for ct in spec.get("containers") or []:
        for mount in (ct or {}).get("volumeMounts") or []:
            if mount.get("mountPath") == TOKEN_MOUNT_PATH and str(mount.get("name", "")).startswith(
                TOKEN_VOLUME_PREFIX
            ):
                return [{"name": mount["name"], "readOnly": True, "mountPath": TOKEN_MOUNT_PATH}]
    return []


def init_container(decision: Decision, spec: Mapping[str, Any]) -> dict[str, Any]:
    """Our init container for a pod with this spec."""
    resources: dict[str, Any] = (
        {"requests": dict(GUARANTEED), "limits": dict(GUARANTEED)}
        if _guaranteed(spec)
        else {"requests": dict(REQUESTS)}
    )
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": decision.image,
        "imagePullPolicy": decision.pull_policy,
        "command": list(COMMAND),
        "env": [
            {"name": ENV_TIMEOUT, "value": str(decision.timeout_seconds)},
            {"name": ENV_FILE, "value": f"{MOUNT_DIR}\\{ANNOTATIONS_FILE}"},
        ],
        "volumeMounts": [
            {"name": VOLUME_NAME, "mountPath": MOUNT_DIR, "readOnly": True},
            *_token_mount(spec),
        ],
        "resources": resources,
        # The timeout message (stderr) becomes the container's termination
        # message, so `kubectl describe pod` says why the pod is stuck.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    security = _security_context(spec)
    if security:
        container["securityContext"] = security
    return container


def _missing_secrets(spec: Mapping[str, Any], decision: Decision) -> list[dict[str, str]]:
    """The decision's pull secrets the pod does not list already, in their order."""
    listed = {s.get("name") for s in spec.get("imagePullSecrets") or []}
    return [{"name": n} for n in decision.pull_secrets if n not in listed]


def volume() -> dict[str, Any]:
    """The downward-API volume with the pod's own annotations (kubelet refreshes it)."""
    return {
        "name": VOLUME_NAME,
        "downwardAPI": {
            "items": [{"path": ANNOTATIONS_FILE, "fieldRef": {"fieldPath": "metadata.annotations"}}]
        },
    }


def decide(
    pod: Mapping[str, Any], namespace_labels: Mapping[str, str] | None, ctx: Context
) -> Decision:
    """What the webhook does with a pod being created.

    `namespace_labels` None means the namespace is not in the cache yet; the
    webhook then trusts its namespaceSelector, which already matched.
    """
    meta, spec = _meta(pod), _spec(pod)
    labels = meta.get("labels") or {}
    ns_labels = namespace_labels or {}
    if opted_out(pod):
        return _skip(AdmissionReason.OPTED_OUT, f"the pod has {ANNOTATION}={OPT_OUT_VALUE}")
    if spec.get("hostNetwork"):
        return _skip(AdmissionReason.HOST_NETWORK, "host-network pods are never enrolled")
    mode = labels.get(c.LABEL_DATAPLANE_MODE)
    if mode == "none":
        return _skip(
            AdmissionReason.DATAPLANE_MODE_NONE, f"the pod has {c.LABEL_DATAPLANE_MODE}=none"
        )
    if sidecar(pod, ns_labels):
        return _skip(
            AdmissionReason.SIDECAR, "the pod gets an Istio sidecar, which wins over ambient"
        )
    if mode != "ambient" and namespace_labels is not None and not namespace_enrolled(ns_labels):
        return _skip(AdmissionReason.NOT_ENROLLED, "neither the pod nor its namespace is ambient")
    if ctx.mesh is None:
        return _skip(AdmissionReason.NO_AMBIENT_MESH, ctx.mesh_problem)
    workaround = ctx.mesh.spec.new_pod_workaround
    if not workaround.enabled:
        return _skip(AdmissionReason.WORKAROUND_DISABLED, "spec.newPodWorkaround.enabled is false")

    names = _names(spec.get("initContainers"))
    if CONTAINER_NAME in names:
        ours = str((meta.get("annotations") or {}).get(ANNOTATION, "")).startswith(INJECTED)
        if ours and names[0] != CONTAINER_NAME:
            # Another webhook put an init container ahead of ours on a
            # reinvocation; its traffic would leave before redirection.
            return Decision(
                "reorder", AdmissionReason.NOT_FIRST, "moved back to the first init container"
            )
        return _skip(
            AdmissionReason.ALREADY_PRESENT, f"the pod already has init container {CONTAINER_NAME}"
        )

    eff = effective_spec(spec, ctx.runtime_classes)
    os_name = target_os(eff, ctx.candidates(eff))
    if os_name != "windows":
        return _skip(AdmissionReason.NOT_WINDOWS, "the pod does not target Windows nodes")
    served = ctx.mesh.served_builds

    node_name = eff.get("nodeName")
    node = ctx.by_name.get(str(node_name)) if node_name else None
    if node is not None:
        if node.build in served and node in ctx.mesh.capable_nodes:
            return ctx.mesh.inject(
                AdmissionReason.SCHEDULED_ON_PRE_WS2025_NODE,
                f"bound to node {node.name} (build {node.build})",
                node.build,
            )
        return _skip(
            AdmissionReason.NO_PRE_WS2025_NODE,
            f"bound to node {node.name}, which needs no workaround",
        )

    pinned = _required_values(eff, c.LABEL_WINDOWS_BUILD)
    if pinned is not None:
        hits = sorted(b for b in pinned if b in served)
        if not hits:
            return _skip(
                AdmissionReason.NO_PRE_WS2025_BUILD,
                f"pinned to build(s) {', '.join(sorted(pinned))}; none is a pre-WS2025 build "
                "that has ambient agents",
            )
        # Pinned to several builds, the image must run on all of them.
        build = next(iter(pinned)) if len(pinned) == 1 else None
        return ctx.mesh.inject(
            AdmissionReason.PINNED_TO_PRE_WS2025_BUILD,
            f"pinned to build(s) {', '.join(sorted(pinned))}",
            build,
        )

    candidates = [n for n in ctx.mesh.capable_nodes if scheduling.schedulable(eff, n)]
    if not candidates:
        return _skip(
            AdmissionReason.NO_PRE_WS2025_NODE,
            f"none of the {len(ctx.mesh.capable_nodes)} pre-WS2025 node(s) with ambient agents "
            "matches the pod's node selection and tolerations",
        )
    shown = ", ".join(n.name for n in candidates[:3])
    more = f" and {len(candidates) - 3} more" if len(candidates) > 3 else ""
    return ctx.mesh.inject(
        AdmissionReason.MAY_LAND_ON_PRE_WS2025_NODE,
        f"no build pinned; it can land on {shown}{more}",
        None,
    )


def mutate_in_place(pod: dict[str, Any], decision: Decision) -> None:
    """Apply a decision to a pod body (the admission object)."""
    if decision.action == "none":
        return
    if decision.action == "withheld":
        pod.setdefault("metadata", {}).setdefault("annotations", {})[ANNOTATION] = (
            decision.annotation()
        )
        return
    spec = pod.setdefault("spec", {})
    inits: list[dict[str, Any]] = spec.setdefault("initContainers", [])
    if decision.action == "reorder":
        ours = [ct for ct in inits if ct.get("name") == CONTAINER_NAME]
        spec["initContainers"] = ours[:1] + [ct for ct in inits if ct.get("name") != CONTAINER_NAME]
        return
    inits.insert(0, init_container(decision, spec))
    secrets = _missing_secrets(spec, decision)
    if secrets:
        spec.setdefault("imagePullSecrets", []).extend(secrets)
    volumes: list[dict[str, Any]] = spec.setdefault("volumes", [])
    if VOLUME_NAME not in _names(volumes):
        volumes.append(volume())
    annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
    annotations[ANNOTATION] = decision.annotation()


def mutated(pod: Mapping[str, Any], decision: Decision) -> dict[str, Any]:
    """A copy of the pod with the decision applied."""
    out = copy.deepcopy(dict(pod))
    mutate_in_place(out, decision)
    return out


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _injection_ops(spec: Mapping[str, Any], decision: Decision) -> list[dict[str, Any]]:
    """The operations that add the init container, its pull secrets and its volume."""
    ops: list[dict[str, Any]] = []
    container = init_container(decision, spec)
    if spec.get("initContainers"):
        ops.append({"op": "add", "path": "/spec/initContainers/0", "value": container})
    else:
        ops.append({"op": "add", "path": "/spec/initContainers", "value": [container]})
    secrets = _missing_secrets(spec, decision)
    if secrets and not spec.get("imagePullSecrets"):
        ops.append({"op": "add", "path": "/spec/imagePullSecrets", "value": secrets})
    else:
        ops += [{"op": "add", "path": "/spec/imagePullSecrets/-", "value": s} for s in secrets]
    volumes = spec.get("volumes") or []
    if not volumes:
        ops.append({"op": "add", "path": "/spec/volumes", "value": [volume()]})
    elif VOLUME_NAME not in _names(volumes):
        ops.append({"op": "add", "path": "/spec/volumes/-", "value": volume()})
    return ops


def json_patch(pod: Mapping[str, Any], decision: Decision) -> list[dict[str, Any]]:
    """RFC 6902 operations that do to the admission object what `mutate_in_place` does.

    Written out rather than diffed: the webhook answers many pods, and a diff
    of the whole pod costs more than everything else it does.
    """
    if decision.action == "none":
        return []
    spec = _spec(pod)
    inits = list(spec.get("initContainers") or [])
    if decision.action == "reorder":
        ours = [ct for ct in inits if ct.get("name") == CONTAINER_NAME]
        rest = [ct for ct in inits if ct.get("name") != CONTAINER_NAME]
        return [{"op": "replace", "path": "/spec/initContainers", "value": ours[:1] + rest}]
    ops: list[dict[str, Any]] = []
    if decision.action == "inject":
        ops += _injection_ops(spec, decision)
    if not _meta(pod).get("annotations"):
        ops.append(
            {
                "op": "add",
                "path": "/metadata/annotations",
                "value": {ANNOTATION: decision.annotation()},
            }
        )
    else:
        ops.append(
            {
                "op": "add",
                "path": f"/metadata/annotations/{_pointer(ANNOTATION)}",
                "value": decision.annotation(),
            }
        )
    if "metadata" not in pod:
        ops.insert(0, {"op": "add", "path": "/metadata", "value": {}})
    return ops
