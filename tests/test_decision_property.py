"""The webhook's decision and the AmbientMesh status, judged by models written from the docs.

The decision model follows docs/troubleshooting.md ("The redirection-wait
webhook", whose table lists the reasons in the order they are checked) and
docs/windows-redirection-wait.md (images, timeout, resources); the status
model follows docs/troubleshooting.md and the shared DESIGN's readiness rule
for DaemonSets. Neither reads the operator's code: tests/oracle.py supplies
node verdicts and pod scheduling.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import oracle
from ambient_operator.api.conditions import Problem, Verdict
from ambient_operator.api.v1alpha1 import AmbientMeshStatus, ComponentStatus, Condition
from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.status.components import (
    daemonset_ready,
    degraded_verdict,
    merge_conditions,
    ready_verdict,
    transitions,
)
from ambient_operator.webhook import decide as d
from conftest import examples

OUR_ANNOTATION = "ambientoperator.io/redirection-wait"
OUR_CONTAINER = "ambient-redirection-wait"
MODE = "istio.io/dataplane-mode"
TAINT = {"key": "os", "value": "windows", "effect": "NoSchedule"}


def _node(name: str, os_name: str, build: str | None, taint: bool, **labels: str) -> dict[str, Any]:
    all_labels = {oracle.OS_LABEL: os_name, oracle.ARCH_LABEL: "amd64", **labels}
    if build:
        all_labels[oracle.BUILD_LABEL] = build
    return {
        "metadata": {"name": name, "labels": all_labels},
        "spec": {"taints": [TAINT] if taint else []},
        "status": {"nodeInfo": {"operatingSystem": os_name}},
    }


NODES = [
    _node("l1", "linux", None, False),
    _node("w22", "windows", oracle.WS2022, True),
    _node("w22-gpu", "windows", oracle.WS2022, False, pool="gpu"),
    _node("w25", "windows", oracle.WS2025, True),
    _node("w19", "windows", oracle.WS2019, True),
]
JUDGED = {n["metadata"]["name"]: oracle.Node.of(n) for n in NODES}
FACTS = [NodeFacts.from_node(n) for n in NODES]

WINDOWS_TOLERATION = {"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"}
# (id, pod spec fields); every shape says one consistent thing about its OS.
PLACEMENTS: list[tuple[str, dict[str, Any]]] = [
    ("unconstrained", {}),
    ("os-linux", {"os": {"name": "linux"}}),
    ("selector-linux", {"nodeSelector": {oracle.OS_LABEL: "linux"}}),
    ("os-windows", {"os": {"name": "windows"}}),
    ("selector-windows", {"nodeSelector": {oracle.OS_LABEL: "windows"}}),
    *(
        (f"pinned-{b}", {"nodeSelector": {oracle.OS_LABEL: "windows", oracle.BUILD_LABEL: b}})
        for b in (oracle.WS2019, oracle.WS2022, oracle.WS2025)
    ),
    ("build-only", {"nodeSelector": {oracle.BUILD_LABEL: oracle.WS2022}}),
    (
        "affinity-two-builds",
        {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": oracle.BUILD_LABEL,
                                        "operator": "In",
                                        "values": [oracle.WS2022, oracle.WS2025],
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        },
    ),
    ("gpu-pool", {"nodeSelector": {"pool": "gpu"}}),
    *((f"bound-{n}", {"nodeName": n}) for n in JUDGED),
]
TOLERATIONS = [None, [WINDOWS_TOLERATION], [{"operator": "Exists"}]]
RESOURCES = [
    None,
    {"limits": {"cpu": "1", "memory": "1Gi"}},  # requests default to limits: Guaranteed
    {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
    {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
    {"limits": {"cpu": "1"}},
]
INIT_CONTAINERS = ["none", "other", "ours-first", "ours-second"]


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    labels: dict[str, str] = {}
    mode = draw(st.sampled_from([None, None, "ambient", "ambient", "ambient", "none"]))
    if mode:
        labels[MODE] = mode
    inject = draw(st.sampled_from([None] * 6 + ["true", "false"]))
    if inject:
        labels["sidecar.istio.io/inject"] = inject
    annotations: dict[str, str] = {}
    opt = draw(st.sampled_from([None] * 9 + ["false", "False", "true"]))
    if opt:
        annotations[OUR_ANNOTATION] = opt
    if draw(st.integers(0, 15)) == 0:
        annotations["sidecar.istio.io/status"] = "{}"
    _, placement = draw(st.sampled_from(PLACEMENTS))
    spec: dict[str, Any] = {
        "containers": [{"name": "app", "image": "app:1"}],
        **placement,
    }
    tolerations = draw(st.sampled_from(TOLERATIONS))
    if tolerations is not None:
        spec["tolerations"] = tolerations
    resources = draw(st.sampled_from(RESOURCES))
    if resources is not None:
        spec["containers"][0]["resources"] = resources
    if draw(st.integers(0, 11)) == 0:
        spec["hostNetwork"] = True
    inits = draw(st.sampled_from(INIT_CONTAINERS[:1] * 5 + INIT_CONTAINERS))
    other = {"name": "setup", "image": "setup:1"}
    ours = {"name": OUR_CONTAINER, "image": "x"}
    if inits == "other":
        spec["initContainers"] = [other]
    elif inits == "ours-first":
        spec["initContainers"] = [ours, other]
    elif inits == "ours-second":
        spec["initContainers"] = [other, ours]
    if inits.startswith("ours") and draw(st.booleans()):
        annotations[OUR_ANNOTATION] = "injected; build=any; reason=MayLandOnPreWS2025Node"
    return {
        "metadata": {"name": "p", "namespace": "ns", "labels": labels, "annotations": annotations},
        "spec": spec,
    }


NAMESPACE_LABELS = [
    None,  # not in the webhook's cache yet
    {},
    {MODE: "ambient"},
    {MODE: "ambient"},
    {MODE: "ambient"},
    {MODE: "ambient", "istio-injection": "enabled"},
    {MODE: "ambient", "istio.io/rev": "canary"},
    {MODE: "none"},
]


@st.composite
def meshes(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.integers(0, 9)) == 0:
        return None
    workaround: dict[str, Any] = {"enabled": draw(st.integers(0, 7)) != 0}
    timeout = draw(st.sampled_from([None, 1, 45, 3600]))
    if timeout is not None:
        workaround["timeoutSeconds"] = timeout
    if draw(st.booleans()):
        workaround["multiBuildImage"] = "registry.example.com/wait:multi"
    if draw(st.booleans()):
        workaround["images"] = {oracle.WS2022: "registry.example.com/wait:ltsc2022"}
    windows: dict[str, Any] = {"enabled": draw(st.integers(0, 5)) != 0}
    builds = draw(st.sampled_from([None, [oracle.WS2022], [oracle.WS2025], []]))
    if builds is not None:
        windows["builds"] = builds
    if draw(st.integers(0, 4)) == 0:
        windows["nodeSelector"] = {"pool": "gpu"}
    spec: dict[str, Any] = {"newPodWorkaround": workaround, "platforms": {"windows": windows}}
    if draw(st.booleans()):
        spec["images"] = {"hub": "mirror.example.com/istio", "tag": "1.30.9"}
    registry = draw(st.sampled_from([None, "mirror.example.com/ambient", oracle.UPSTREAM_HUB]))
    if registry is not None:
        spec.setdefault("images", {})["registry"] = registry
    return {"metadata": {"name": "default", "uid": "u"}, "spec": spec}


DEFAULT_REGISTRIES = [None, "chart.example.com:5000/ambient"]


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return default
        obj = obj[part]
    return obj


def _sidecar(pod: dict[str, Any], ns_labels: dict[str, str]) -> bool:
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    if "sidecar.istio.io/status" in annotations or labels.get("sidecar.istio.io/inject") == "true":
        return True
    injecting = ns_labels.get("istio-injection") == "enabled" or "istio.io/rev" in ns_labels
    return injecting and labels.get("sidecar.istio.io/inject") != "false"


def _windows_pod(spec: dict[str, Any]) -> bool:
    if _get(spec, "os", "name") in ("windows", "linux"):
        return bool(spec["os"]["name"] == "windows")
    selector = spec.get("nodeSelector") or {}
    if oracle.OS_LABEL in selector:
        return bool(selector[oracle.OS_LABEL] == "windows")
    if oracle.BUILD_LABEL in selector or spec.get("affinity"):
        return True  # only Windows nodes carry a build
    if spec.get("nodeName") or selector:
        matching = [n for n in JUDGED.values() if oracle.selects(spec, n)]
        return bool(matching) and all(n.os == "windows" for n in matching)
    return False


def _pinned(spec: dict[str, Any]) -> set[str] | None:
    selector = spec.get("nodeSelector") or {}
    if oracle.BUILD_LABEL in selector:
        return {selector[oracle.BUILD_LABEL]}
    terms = _get(
        spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms", default=None,
    )  # fmt: skip
    if terms:
        return {v for t in terms for e in t["matchExpressions"] for v in e["values"]}
    return None


def _guaranteed(spec: dict[str, Any]) -> bool:
    """Every container has cpu and memory limits, and requests (defaulting to them) equal."""
    for ct in [*spec.get("containers", []), *spec.get("initContainers", [])]:
        limits = _get(ct, "resources", "limits", default={})
        requests = {**limits, **_get(ct, "resources", "requests", default={})}
        if any(r not in limits or requests[r] != limits[r] for r in ("cpu", "memory")):
            return False
    return True


def expected_decision(
    pod: dict[str, Any],
    ns_labels: dict[str, str] | None,
    mesh: dict[str, Any] | None,
    default_registry: str | None = None,
) -> tuple[str, str, str | None, str | None, int]:
    """(action, reason, build or None, image or None, timeout) as the docs describe them."""
    meta, spec = pod["metadata"], pod["spec"]
    labels, annotations = meta["labels"], meta["annotations"]
    known = ns_labels or {}
    if str(annotations.get(OUR_ANNOTATION, "")).lower() == "false":
        return "none", "OptedOut", None, None, 0
    if spec.get("hostNetwork"):
        return "none", "HostNetwork", None, None, 0
    if labels.get(MODE) == "none":
        return "none", "DataplaneModeNone", None, None, 0
    if _sidecar(pod, known):
        return "none", "Sidecar", None, None, 0
    if labels.get(MODE) != "ambient" and ns_labels is not None and known.get(MODE) != "ambient":
        return "none", "NotEnrolled", None, None, 0
    if mesh is None:
        return "none", "NoAmbientMesh", None, None, 0
    mspec = mesh["spec"]
    if not _get(mspec, "newPodWorkaround", "enabled", default=True):
        return "none", "WorkaroundDisabled", None, None, 0
    inits = [ct["name"] for ct in spec.get("initContainers", [])]
    if OUR_CONTAINER in inits:
        if str(annotations.get(OUR_ANNOTATION, "")).startswith("injected") and inits[0] != (
            OUR_CONTAINER
        ):
            return "reorder", "NotFirst", None, None, 0
        return "none", "AlreadyPresent", None, None, 0
    if not _windows_pod(spec):
        return "none", "NotWindows", None, None, 0

    timeout = int(_get(mspec, "newPodWorkaround", "timeoutSeconds", default=120))
    windows = _get(mspec, "platforms", "windows", default={})
    builds = windows.get("builds")
    served = windows.get("enabled", True) and (builds is None or oracle.WS2022 in builds)
    capable = [
        n for n in JUDGED.values() if served and oracle.verdict(n, mspec)[0] == oracle.WS2022
    ]
    per_build = _get(mspec, "newPodWorkaround", "images", default=None) or {
        oracle.WS2022: "mcr.microsoft.com/windows/nanoserver:ltsc2022"
    }
    multi = oracle.redirection_wait_image(mspec, default_registry)

    def inject(reason: str, build: str | None) -> tuple[str, str, str | None, str | None, int]:
        chosen = (per_build.get(build) or multi) if build else multi
        if chosen is None:
            return "withheld", "ImageUnavailable", build, None, 0
        return "inject", reason, build, chosen, timeout

    if spec.get("nodeName"):
        node = JUDGED[spec["nodeName"]]
        if node in capable:
            return inject("ScheduledOnPreWS2025Node", node.build)
        return "none", "NoPreWS2025Node", None, None, 0
    pinned = _pinned(spec)
    if pinned is not None:
        if not (served and oracle.WS2022 in pinned):
            return "none", "NoPreWS2025Build", None, None, 0
        build = next(iter(pinned)) if len(pinned) == 1 else None
        return inject("PinnedToPreWS2025Build", build)
    tolerations = spec.get("tolerations") or []
    if not any(
        oracle.selects(spec, n) and oracle.tolerates_all(tolerations, n.taints) for n in capable
    ):
        return "none", "NoPreWS2025Node", None, None, 0
    return inject("MayLandOnPreWS2025Node", None)


@settings(max_examples=examples(5600))
@given(
    pod=pods(),
    ns_labels=st.sampled_from(NAMESPACE_LABELS),
    mesh=meshes(),
    default_registry=st.sampled_from(DEFAULT_REGISTRIES),
)
def test_decision_matches_the_documented_rules(
    pod: dict[str, Any],
    ns_labels: dict[str, str] | None,
    mesh: dict[str, Any] | None,
    default_registry: str | None,
) -> None:
    ctx = d.Context.build(mesh, FACTS, default_registry=default_registry)
    decision = d.decide(pod, ns_labels, ctx)
    action, reason, build, image, timeout = expected_decision(
        pod, ns_labels, mesh, default_registry
    )
    assert (decision.action, decision.reason) == (action, reason)
    if action == "withheld":
        # Admitted unchanged but for the annotation that says why.
        out = d.mutated(pod, decision)
        assert out["spec"] == pod["spec"]
        assert out["metadata"]["annotations"][OUR_ANNOTATION] == (
            f"withheld; build={build or 'any'}; reason=ImageUnavailable"
        )
        return
    if action != "inject":
        return
    assert (decision.build, decision.image, decision.timeout_seconds) == (build, image, timeout)
    out = d.mutated(pod, decision)
    first = out["spec"]["initContainers"][0]
    assert first["name"] == OUR_CONTAINER and first["image"] == image
    assert {e["name"]: e["value"] for e in first["env"]} == {
        "REDIRECTION_WAIT_TIMEOUT_SECONDS": str(timeout),
        "REDIRECTION_WAIT_FILE": "C:\\ambient\\podinfo\\annotations",
    }
    # docs/windows-redirection-wait.md: 10m/32Mi requested; 100m/128Mi as requests
    # and limits when the pod is Guaranteed, so that it stays Guaranteed.
    if _guaranteed(pod["spec"]):
        big = {"cpu": "100m", "memory": "128Mi"}
        assert first["resources"] == {"requests": big, "limits": big}
    else:
        assert first["resources"] == {"requests": {"cpu": "10m", "memory": "32Mi"}}
    note = f"injected; build={build or 'any'}; reason={reason}"
    assert out["metadata"]["annotations"][OUR_ANNOTATION] == note
    assert d.decide(out, ns_labels, ctx).reason == "AlreadyPresent"


# -- status ------------------------------------------------------------------------------------


@st.composite
def daemonset_states(draw: st.DrawFn) -> tuple[dict[str, Any] | None, int]:
    """A live DaemonSet (or None: not created yet) and how many nodes should run it."""
    expected = draw(st.integers(0, 4))
    if draw(st.integers(0, 9)) == 0:
        return None, expected
    generation = draw(st.integers(1, 4))
    desired = draw(st.integers(0, 4))
    status = {
        "observedGeneration": draw(st.integers(max(0, generation - 2), generation)),
        "desiredNumberScheduled": desired,
        "currentNumberScheduled": draw(st.integers(0, desired)),
        "updatedNumberScheduled": draw(st.integers(0, desired)),
        "numberReady": draw(st.integers(0, desired)),
        "numberAvailable": draw(st.integers(0, desired)),
    }
    return {"metadata": {"generation": generation}, "status": status}, expected


def ready_by_the_rule(live: dict[str, Any] | None, expected: int) -> bool:
    """DESIGN §4: nothing scheduled where nodes should run it, or ready < scheduled: not ready."""
    if live is None:
        return False
    st_ = live["status"]
    if st_["observedGeneration"] < live["metadata"]["generation"]:
        return False  # the controller has not seen our latest spec
    desired = st_["desiredNumberScheduled"]
    if desired == 0 and expected > 0:
        return False
    return st_["updatedNumberScheduled"] >= desired and st_["numberReady"] >= desired


@settings(max_examples=examples(2000))
@given(states=st.lists(daemonset_states(), max_size=6))
def test_ready_condition_follows_the_readiness_rule(
    states: list[tuple[dict[str, Any] | None, int]],
) -> None:
    judged = []
    for i, (live, expected) in enumerate(states):
        ok, why = daemonset_ready(live, expected)
        assert ok == ready_by_the_rule(live, expected), (live, expected, why)
        assert why  # the message says why, ready or not
        judged.append(
            (ComponentStatus(name=f"ds{i}", component="ztunnel", platform="linux"), ok, why)
        )
    verdict = ready_verdict(judged)
    if not states:
        assert (verdict.status, verdict.reason) == ("False", "NoAgents")
    elif all(ok for _, ok, _ in judged):
        assert (verdict.status, verdict.reason) == ("True", "AgentsReady")
    else:
        assert (verdict.status, verdict.reason) == ("False", "DaemonSetNotReady")
        for cs, ok, why in judged:
            assert (f"{cs.name}: {why}" in verdict.message) != ok


# Most severe first, as docs/troubleshooting.md lists them.
DEGRADING = ["IstiodNotFound", "IstiodTrustMissing", "UnsupportedNodes", "RenderWarning"]


@settings(max_examples=examples(1100))
@given(
    problems=st.lists(
        st.tuples(st.sampled_from(DEGRADING), st.text("abcdef ", min_size=1, max_size=8)),
        max_size=5,
    ),
    previous=st.lists(
        st.tuples(
            st.sampled_from(["Reconciled", "Ready", "Degraded"]),
            st.sampled_from(["True", "False"]),
            st.sampled_from(["Reconciled", "AgentsReady", "AsExpected", *DEGRADING]),
        ),
        max_size=3,
        unique_by=lambda x: x[0],
    ),
    generation=st.integers(1, 9),
)
def test_degraded_condition_and_transitions(
    problems: list[tuple[str, str]], previous: list[tuple[str, str, str]], generation: int
) -> None:
    ordered = sorted(problems, key=lambda p: DEGRADING.index(p[0]))
    verdict = degraded_verdict([Problem(r, m) for r, m in ordered])
    if not ordered:
        assert (verdict.status, verdict.reason) == ("False", "AsExpected")
    else:
        # The first problem in the documented order names the reason; all are listed.
        assert (verdict.status, verdict.reason) == ("True", ordered[0][0])
        assert verdict.message == "; ".join(m for _, m in ordered)

    then = datetime(2026, 1, 1, tzinfo=UTC)
    now = (then + timedelta(hours=generation)).strftime("%Y-%m-%dT%H:%M:%SZ")
    old = [
        Condition(
            type=t,
            status=s,
            observed_generation=generation - 1,
            last_transition_time="2026-01-01T00:00:00Z",
            reason=r,
            message="",
        )
        for t, s, r in previous
    ]
    verdicts = [Verdict("Ready", "True", "AgentsReady", "ok"), verdict]
    merged = merge_conditions(old, verdicts, generation, now)
    before = {c.type: c for c in old}
    for cond in merged:
        assert cond.observed_generation == generation
        kept = cond.type in before and before[cond.type].status == cond.status
        assert cond.last_transition_time == ("2026-01-01T00:00:00Z" if kept else now)

    told = transitions(
        AmbientMeshStatus(conditions=old) if old else None, AmbientMeshStatus(conditions=merged)
    )
    expected = [
        c.type
        for c in merged
        if c.type not in before
        or (before[c.type].status, before[c.type].reason) != (c.status, c.reason)
    ]
    assert [c.type for c in told] == expected
