"""Versions offline: reading them, Istio's skew rule, and the order of a version change.

Every expected value is written out here, or comes from upstream's istiod
chart rendered by the real helm (the Deployment a user's install makes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from ambient_devcluster import render_istiod_chart
from ambient_operator.api import constants as c
from ambient_operator.api.conditions import MeshReason
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts, Taint
from ambient_operator.cluster.versions import (
    RunningAgent,
    Version,
    agent_tag,
    image_tag,
    image_version,
    istiod_version,
    parse_version,
    skew_problem,
)
from ambient_operator.render import RenderResult, render_dataplane
from ambient_operator.render.rollout import decide
from ambient_operator.status.components import daemonset_settled, mesh_problems
from ambient_operator.status.versions import (
    older_patch,
    rollout_message,
    version_skew,
    version_status,
)
from conftest import BIN_DIR

DIGEST = "sha256:" + "ab" * 32
WS2022, WS2025 = "10.0.20348", "10.0.26100"

# -- reading a version ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "tag", "version"),
    [
        ("docker.io/istio/pilot:1.30.4", "1.30.4", (1, 30, 4, None)),
        ("docker.io/istio/pilot:1.30.4-distroless", "1.30.4-distroless", (1, 30, 4, "distroless")),
        ("gcr.io/istio-release/pilot:1.29.2@" + DIGEST, "1.29.2", (1, 29, 2, None)),
        ("docker.io/istio/pilot@" + DIGEST, None, None),
        ("localhost:5000/istio/pilot:1.31.0", "1.31.0", (1, 31, 0, None)),
        ("localhost:5000/istio/pilot", None, None),
        ("pilot:v1.28.1", "v1.28.1", (1, 28, 1, None)),
        # Istio's development builds: the line, then alpha and the commit.
        (
            "gcr.io/istio-testing/pilot:1.31-alpha.eed52ebb66ad6fe7bd1f2e1d0a26a7d1e1c7e2f0",
            "1.31-alpha.eed52ebb66ad6fe7bd1f2e1d0a26a7d1e1c7e2f0",
            (1, 31, None, "alpha.eed52ebb66ad6fe7bd1f2e1d0a26a7d1e1c7e2f0"),
        ),
        ("gcr.io/istio-testing/pilot:1.31-dev", "1.31-dev", (1, 31, None, "dev")),
        ("docker.io/istio/pilot:1.30.0-rc.1", "1.30.0-rc.1", (1, 30, 0, "rc.1")),
        (
            "registry.example.com/istio/pilot:1.30.4-solo-distroless",
            "1.30.4-solo-distroless",
            (1, 30, 4, "solo-distroless"),
        ),
        ("registry.istio.io/testing/pilot:latest", "latest", None),
        ("docker.io/istio/pilot:master", "master", None),
        ("docker.io/istio/pilot:1", "1", None),
        ("", None, None),
    ],
)
def test_image_versions(
    image: str, tag: str | None, version: tuple[int, int, int | None, str | None] | None
) -> None:
    assert image_tag(image) == tag
    assert image_version(image) == (None if version is None else Version(*version))


def test_version_text_and_line() -> None:
    assert str(Version(1, 30, 4)) == "1.30.4"
    assert str(Version(1, 31, None, "dev")) == "1.31-dev"
    assert Version(1, 30, 4, "distroless").line == (1, 30)
    assert parse_version(" 1.30.4 ") == Version(1, 30, 4)
    assert parse_version("01.30.4") is None


def _deployment(image: str | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    containers = [{"name": "discovery", "image": image}] if image is not None else []
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "istiod", "namespace": "istio-system", "labels": labels or {}},
        "spec": {"template": {"spec": {"containers": containers}}},
    }


def test_istiod_version_prefers_the_image_then_istioctl_then_the_chart() -> None:
    both = {"operator.istio.io/version": "1.29.0", "app.kubernetes.io/version": "1.28.0"}
    assert istiod_version(_deployment("docker.io/istio/pilot:1.30.4", both)) == Version(1, 30, 4)
    pinned = "docker.io/istio/pilot@" + DIGEST
    assert istiod_version(_deployment(pinned, both)) == Version(1, 29, 0)
    chart = {"app.kubernetes.io/version": "1.28.0"}
    assert istiod_version(_deployment(pinned, chart)) == Version(1, 28, 0)
    # The appVersion of charts built from Istio's source is a placeholder.
    assert istiod_version(_deployment(pinned, {"app.kubernetes.io/version": "1.0.0"})) is None
    # A revision name is not a version, however much it looks like one.
    assert istiod_version(_deployment(pinned, {"istio.io/rev": "1-30-4"})) is None
    assert istiod_version(_deployment("docker.io/istio/pilot:latest")) is None


def test_istiod_version_of_malformed_objects_is_none() -> None:
    assert istiod_version(None) is None
    assert istiod_version({}) is None
    assert istiod_version({"spec": {"template": {"spec": {"containers": "x"}}}}) is None
    assert istiod_version({"metadata": {"labels": ["x"]}}) is None
    assert istiod_version(_deployment(None)) is None


def _chart_deployment(values: dict[str, str]) -> dict[str, Any]:
    rendered = render_istiod_chart(BIN_DIR, "istio-system", values)
    (found,) = [o for o in rendered if o["kind"] == "Deployment"]
    return found


@pytest.mark.parametrize(
    ("values", "image", "version"),
    [
        # profile=ambient picks the distroless variant.
        (
            {"global.tag": "1.29.3"},
            "registry.istio.io/testing/pilot:1.29.3-distroless",
            Version(1, 29, 3, "distroless"),
        ),
        (
            {"global.hub": "docker.io/istio", "tag": "1.30.4", "global.variant": "distroless"},
            "docker.io/istio/pilot:1.30.4-distroless",
            Version(1, 30, 4, "distroless"),
        ),
        # The chart's own default (master's charts): `latest`, and appVersion 1.0.0.
        ({}, "registry.istio.io/testing/pilot:latest-distroless", None),
        ({"image": "docker.io/istio/pilot@" + DIGEST}, "docker.io/istio/pilot@" + DIGEST, None),
    ],
)
def test_istiod_version_of_upstreams_chart(
    values: dict[str, str], image: str, version: Version | None
) -> None:
    deployment = _chart_deployment(values)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [(c["name"], c["image"]) for c in containers] == [("discovery", image)]
    assert deployment["metadata"]["labels"]["app.kubernetes.io/version"] == "1.0.0"
    assert istiod_version(deployment) == version


# -- Istio's support rule ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("control_plane", "data_plane", "fragments"),
    [
        ("1.30.4", "1.30.4", None),
        ("1.30.0", "1.30.9", None),  # patches do not count
        ("1.30.4", "1.29.0", None),  # one minor ahead is supported
        ("1.31-alpha.abc", "1.30.4-distroless", None),
        ("1.30.4", "1.28.5", ["istiod 1.30.4 is 2 minors ahead", "1.28.5", "1.29 or later"]),
        ("1.32.0", "1.28.0", ["4 minors ahead"]),
        ("1.30.4", "1.31.0", ["1.31.0 is newer than istiod 1.30.4", "upgrade istiod to 1.31"]),
        ("1.29.0", "1.31.2", ["newer than istiod 1.29.0", "back to 1.29 or older"]),
        ("1.30.4", "2.0.0", ["different major versions", "1.30.4", "2.0.0"]),
        ("2.1.0", "1.30.4", ["different major versions"]),
    ],
)
def test_skew_rule(control_plane: str, data_plane: str, fragments: list[str] | None) -> None:
    cp, dp = parse_version(control_plane), parse_version(data_plane)
    assert cp is not None and dp is not None
    problem = skew_problem(cp, dp)
    if fragments is None:
        assert problem is None
        return
    assert problem is not None
    for fragment in fragments:
        assert fragment in problem
    # Every problem names the safe order.
    assert "istiod first, then istio-cni and ztunnel" in problem


# -- the order of a version change -------------------------------------------------------

ORDER = ["linux", WS2022, WS2025]
OLD, NEW = "1.30.4", "1.31.0"


def _images(tag: str) -> dict[str, dict[Any, str]]:
    return {
        p: {"istio-cni": f"hub/install-cni:{tag}", "ztunnel": f"hub/ztunnel:{tag}"} for p in ORDER
    }


def _running(tags: dict[str, str], unsettled: tuple[str, ...] = ()) -> dict[Any, RunningAgent]:
    out = {}
    for platform, tag in tags.items():
        for comp, name in (("istio-cni", "install-cni"), ("ztunnel", "ztunnel")):
            ok = platform not in unsettled
            progress = "3/3 updated, 3/3 available" if ok else "1/3 updated, 2/3 available"
            out[(platform, comp)] = RunningAgent(f"hub/{name}:{tag}", ok, not ok, progress)
    return out


def _states(rollout: Any) -> list[tuple[str, str, str]]:
    return [(p.platform, p.state, p.images["ztunnel"]) for p in rollout.platforms]


def test_a_new_version_goes_to_linux_first() -> None:
    rollout = decide(ORDER, _images(NEW), _running({p: OLD for p in ORDER}))
    assert _states(rollout) == [
        ("linux", "rolling", "hub/ztunnel:1.31.0"),
        (WS2022, "waiting", "hub/ztunnel:1.30.4"),
        (WS2025, "waiting", "hub/ztunnel:1.30.4"),
    ]
    assert [p.why for p in rollout.waiting()] == ["linux", "linux"]


def test_windows_waits_while_linux_is_not_ready_at_the_new_version() -> None:
    running = _running({"linux": NEW, WS2022: OLD, WS2025: OLD}, unsettled=("linux",))
    rollout = decide(ORDER, _images(NEW), running)
    assert _states(rollout) == [
        ("linux", "rolling", "hub/ztunnel:1.31.0"),
        (WS2022, "waiting", "hub/ztunnel:1.30.4"),
        (WS2025, "waiting", "hub/ztunnel:1.30.4"),
    ]
    assert "1/3 updated, 2/3 available" in rollout.platforms[0].why


def test_each_windows_build_waits_for_the_one_before() -> None:
    ready_linux = decide(ORDER, _images(NEW), _running({"linux": NEW, WS2022: OLD, WS2025: OLD}))
    assert _states(ready_linux) == [
        ("linux", "current", "hub/ztunnel:1.31.0"),
        (WS2022, "rolling", "hub/ztunnel:1.31.0"),
        (WS2025, "waiting", "hub/ztunnel:1.30.4"),
    ]
    assert ready_linux.waiting()[0].why == WS2022
    running = _running({"linux": NEW, WS2022: NEW, WS2025: OLD}, unsettled=(WS2022,))
    assert _states(decide(ORDER, _images(NEW), running))[2] == (
        WS2025,
        "waiting",
        "hub/ztunnel:1.30.4",
    )
    done = decide(ORDER, _images(NEW), _running({"linux": NEW, WS2022: NEW, WS2025: OLD}))
    assert _states(done)[2] == (WS2025, "rolling", "hub/ztunnel:1.31.0")
    settled = decide(ORDER, _images(NEW), _running({p: NEW for p in ORDER}))
    assert [p.state for p in settled.platforms] == ["current"] * 3


def test_nothing_waits_without_live_agents_or_without_a_change() -> None:
    fresh = decide(ORDER, _images(NEW), {})
    assert [p.state for p in fresh.platforms] == ["current"] * 3
    assert {p.images["ztunnel"] for p in fresh.platforms} == {"hub/ztunnel:1.31.0"}
    # Pods starting on a new Linux node hold nothing back when nothing changes.
    starting = {
        **_running({p: NEW for p in ORDER}),
        ("linux", "ztunnel"): RunningAgent("hub/ztunnel:1.31.0", False, False, "2/3 available"),
    }
    assert [p.state for p in decide(ORDER, _images(NEW), starting).platforms] == ["current"] * 3


def test_a_held_platform_keeps_only_the_images_that_changed() -> None:
    wanted = _images(NEW)
    wanted[WS2022] = {"istio-cni": "hub/install-cni:1.30.4", "ztunnel": "hub/ztunnel:1.31.0"}
    running = _running({"linux": NEW, WS2022: OLD}, unsettled=("linux",))
    rollout = decide(["linux", WS2022], wanted, running)
    held = rollout.platforms[1]
    assert held.state == "waiting"
    assert dict(held.images) == {
        "istio-cni": "hub/install-cni:1.30.4",
        "ztunnel": "hub/ztunnel:1.30.4",
    }


# -- through the render and the status ---------------------------------------------------


def _linux(name: str) -> NodeFacts:
    return NodeFacts(name, "linux", "amd64", None, False, {c.LABEL_OS: "linux"})


def _windows(name: str, build: str) -> NodeFacts:
    labels = {c.LABEL_OS: "windows", c.LABEL_ARCH: "amd64", c.LABEL_WINDOWS_BUILD: build}
    taint = (Taint("os", "windows", "NoSchedule"),)
    return NodeFacts(name, "windows", "amd64", build, True, labels, taint)


NODES = (_linux("l1"), _windows("w22", WS2022), _windows("w25", WS2025))


def _spec(tag: str) -> AmbientMeshSpec:
    windows = {"windows": f"registry.example.com/istio/ztunnel-windows:{tag}"}
    cni = {"windows": f"registry.example.com/istio/install-cni-windows:{tag}"}
    # The registry names the redirection-wait image; the agents are set in full.
    registry = "registry.example.com/ambient"
    return AmbientMeshSpec.model_validate(
        {"images": {"tag": tag, "registry": registry, "ztunnel": windows, "istioCni": cni}}
    )


def _live(tag: str, ready: bool = True) -> dict[Any, RunningAgent]:
    out: dict[Any, RunningAgent] = {}
    for platform in ("linux", WS2022, WS2025):
        win = "" if platform == "linux" else "-windows"
        hub = "docker.io/istio" if platform == "linux" else "registry.example.com/istio"
        progress = "1/1 updated, 1/1 available" if ready else "0/1 updated, 1/1 available"
        for comp, name in (("ztunnel", "ztunnel"), ("istio-cni", "install-cni")):
            out[(platform, comp)] = RunningAgent(
                f"{hub}/{name}{win}:{tag}", ready, not ready, progress
            )
    return out


def _render(tag: str, agents: dict[Any, RunningAgent]) -> RenderResult:
    facts = ClusterFacts(NODES, "10.96.0.20", "10.96.0.10", agents=agents)
    return render_dataplane(_spec(tag), facts)


def _daemonset_images(result: RenderResult) -> dict[str, str]:
    return {
        o["metadata"]["name"]: o["spec"]["template"]["spec"]["containers"][0]["image"]
        for o in result.objects
        if o["kind"] == "DaemonSet"
    }


def test_render_holds_the_windows_images_while_linux_rolls() -> None:
    result = _render(NEW, _live(OLD))
    assert _daemonset_images(result) == {
        "istio-cni-node": "docker.io/istio/install-cni:1.31.0",
        "ztunnel": "docker.io/istio/ztunnel:1.31.0",
        "istio-cni-node-windows-ltsc2022": "registry.example.com/istio/install-cni-windows:1.30.4",
        "ztunnel-windows-ltsc2022": "registry.example.com/istio/ztunnel-windows:1.30.4",
        "istio-cni-node-windows-ltsc2025": "registry.example.com/istio/install-cni-windows:1.30.4",
        "ztunnel-windows-ltsc2025": "registry.example.com/istio/ztunnel-windows:1.30.4",
    }
    # The Windows ztunnel's DNS-rule init container runs the same image, held too.
    (ws2022,) = [o for o in result.objects if o["metadata"]["name"] == "ztunnel-windows-ltsc2022"]
    inits = ws2022["spec"]["template"]["spec"]["initContainers"]
    assert [i["image"] for i in inits] == ["registry.example.com/istio/ztunnel-windows:1.30.4"]
    message = rollout_message(result.rollout)
    assert message is not None
    assert message.startswith("the agents on Linux are being replaced (istio-cni: new image")
    assert (
        "Windows Server 2022 (10.0.20348), Windows Server 2025 (10.0.26100) keep the images "
        "they run until Linux is Ready"
    ) in message
    assert "SO_REUSEPORT" not in message  # no Windows node restarts yet
    status = version_status(_spec(NEW), result.rollout, None)
    assert (status.control_plane, status.data_plane) == (None, "1.31.0")
    assert (status.rolling, status.waiting) == ("linux", [WS2022, WS2025])


def test_a_rolling_windows_build_says_what_its_nodes_lose() -> None:
    agents = _live(OLD)
    agents.update({k: v for k, v in _live(NEW).items() if k[0] == "linux"})
    result = _render(NEW, agents)
    images = _daemonset_images(result)
    assert images["ztunnel-windows-ltsc2022"].endswith(":1.31.0")
    assert images["ztunnel-windows-ltsc2025"].endswith(":1.30.4")
    message = rollout_message(result.rollout)
    assert message is not None
    assert message.startswith("the agents on Windows Server 2022 (10.0.20348) are being replaced")
    assert "no SO_REUSEPORT; INPOD_PORT_REUSE=false" in message
    assert "spec.ztunnel.terminationGracePeriodSeconds" in message
    assert version_status(_spec(NEW), result.rollout, None).rolling == WS2022


def test_when_all_are_ready_nothing_rolls() -> None:
    result = _render(NEW, _live(NEW))
    assert set(_daemonset_images(result).values()) == {
        "docker.io/istio/install-cni:1.31.0",
        "docker.io/istio/ztunnel:1.31.0",
        "registry.example.com/istio/install-cni-windows:1.31.0",
        "registry.example.com/istio/ztunnel-windows:1.31.0",
    }
    assert rollout_message(result.rollout) is None
    status = version_status(_spec(NEW), result.rollout, _deployment("x/pilot:1.31.2"))
    assert (status.control_plane, status.rolling, status.waiting) == ("1.31.2", None, [])


def _skew(result: RenderResult, istiod_image: str) -> list[tuple[str, str]]:
    problems = mesh_problems(
        _spec(OLD), result, {("istio-system", "istiod")}, _deployment(istiod_image)
    )
    return [(p.reason, p.message) for p in problems if p.reason == MeshReason.VERSION_SKEW]


def test_skew_names_the_daemonsets_and_both_versions() -> None:
    steady = _render(OLD, _live(OLD))
    assert _skew(steady, "docker.io/istio/pilot:1.31.0") == []
    assert _skew(steady, "docker.io/istio/pilot:latest") == []
    ((_, ahead),) = _skew(steady, "docker.io/istio/pilot:1.32.1")
    assert ahead.startswith("istio-cni-node, istio-cni-node-windows-ltsc2022, ")
    assert "istiod 1.32.1 is 2 minors ahead of the agents' 1.30.4" in ahead
    ((_, behind),) = _skew(steady, "docker.io/istio/pilot:1.29.9-distroless")
    assert "the agents' 1.30.4 is newer than istiod 1.29.9-distroless" in behind


def test_skew_counts_the_old_version_still_running() -> None:
    # istiod 1.32: the agents at 1.31 are fine, the Windows ones still at 1.30 are not.
    result = _render(NEW, _live(OLD))
    ((_, message),) = _skew(result, "docker.io/istio/pilot:1.32.0")
    assert message.startswith(
        "istio-cni-node, istio-cni-node-windows-ltsc2022, istio-cni-node-windows-ltsc2025, "
        "ztunnel, ztunnel-windows-ltsc2022, ztunnel-windows-ltsc2025 at 1.30.4: "
    )
    assert "at 1.31.0" not in message


def test_skew_comes_after_trust_and_before_unsupported_nodes() -> None:
    ws2019 = NodeFacts("w19", "windows", "amd64", "10.0.17763", True, {c.LABEL_OS: "windows"})
    facts = ClusterFacts((*NODES, ws2019), "10.96.0.20", "10.96.0.10")
    result = render_dataplane(_spec(OLD), facts)
    istiod = _deployment("docker.io/istio/pilot:1.29.0")
    reasons = [p.reason for p in mesh_problems(_spec(OLD), result, set(), istiod)]
    assert reasons == [
        MeshReason.ISTIOD_NOT_FOUND,
        MeshReason.ISTIOD_TRUST_MISSING,
        MeshReason.VERSION_SKEW,
        MeshReason.UNSUPPORTED_NODES,
    ]


def _ds(generation: int, observed: int, desired: int, updated: int, available: int) -> Any:
    return {
        "metadata": {"generation": generation},
        "status": {
            "observedGeneration": observed,
            "desiredNumberScheduled": desired,
            "updatedNumberScheduled": updated,
            "numberAvailable": available,
        },
    }


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        (_ds(2, 1, 3, 3, 3), (False, True, "rollout not observed yet")),
        (_ds(2, 2, 3, 1, 3), (False, True, "1/3 updated, 3/3 available")),
        (_ds(2, 2, 3, 3, 2), (False, False, "3/3 updated, 2/3 available")),
        (_ds(2, 2, 3, 3, 3), (True, False, "3/3 updated, 3/3 available")),
        (_ds(1, 1, 0, 0, 0), (True, False, "0/0 updated, 0/0 available")),
    ],
)
def test_a_daemonset_settles_when_every_pod_is_updated_and_available(
    live: Any, expected: tuple[bool, bool, str]
) -> None:
    assert daemonset_settled(live) == expected


# -- the agents follow istiod (spec.images.tag unset) ---------------------------------------


def _rolled(image: str, *, done: bool) -> dict[str, Any]:
    """istiod's Deployment at `image`, its rollout done or half way (kubectl's reading)."""
    dep = _deployment(image)
    dep["metadata"]["generation"] = 4
    dep["spec"]["replicas"] = 2
    dep["status"] = {
        "observedGeneration": 4,
        "replicas": 2 if done else 3,
        "updatedReplicas": 2 if done else 1,
        "availableReplicas": 2,
    }
    return dep


@pytest.mark.parametrize(
    ("spec_tag", "istiod", "running", "expected"),
    [
        # A set tag is never overridden.
        ("1.30.4", _rolled("x/pilot:1.31.0-distroless", done=True), None, ("1.30.4", "spec")),
        # Unset: istiod's release, without its variant, once its rollout is done.
        (None, _rolled("x/pilot:1.31.0-distroless", done=True), "1.30.4", ("1.31.0", "istiod")),
        # Half way: the agents keep what they run.
        (None, _rolled("x/pilot:1.31.0", done=False), "1.30.4", ("1.30.4", "istiod")),
        # Half way, and nothing runs yet: nothing to keep.
        (None, _rolled("x/pilot:1.31.0", done=False), None, ("1.31.0", "istiod")),
        # A pre-release's agents carry its suffix.
        (None, _rolled("x/pilot:1.32.0-beta.1", done=True), None, ("1.32.0-beta.1", "istiod")),
        # No version to follow: no istiod, or a development line without a patch.
        (None, None, "1.30.4", ("1.31.0", "default")),
        (None, _rolled("x/pilot:1.31-dev", done=True), None, ("1.31.0", "default")),
    ],
    ids=["set", "follows", "istiod-rolling", "rolling-nothing-runs", "pre-release", "none", "dev"],
)
def test_the_agents_tag_follows_istiod_unless_set(
    spec_tag: str | None,
    istiod: dict[str, Any] | None,
    running: str | None,
    expected: tuple[str, str],
) -> None:
    chosen = agent_tag(spec_tag, "1.31.0", istiod, running)
    assert (chosen.tag, chosen.source) == expected


def test_an_unset_tag_is_told_apart_from_a_set_one() -> None:
    assert AmbientMeshSpec().images.tag_if_set() is None
    assert AmbientMeshSpec.model_validate({"images": {"hub": "x"}}).images.tag_if_set() is None
    set_tag = AmbientMeshSpec.model_validate({"images": {"tag": "1.31.0"}})
    assert set_tag.images.tag_if_set() == "1.31.0"


@pytest.mark.parametrize(
    ("control_plane", "agents", "expected"),
    [
        ("1.30.5", "1.30.4", "1.30.7"),
        ("1.30.5", "1.30.7", None),
        ("1.31.0", "1.30.4", None),  # another minor: the skew rule's business
        ("1.28.3", "1.28.1", None),  # a line the operator has no row for
    ],
)
def test_an_older_patch_of_istiods_minor_names_the_newest_known(
    control_plane: str, agents: str, expected: str | None
) -> None:
    assert older_patch(parse_version(control_plane), parse_version(agents)) == expected


def test_skew_names_the_newest_known_patch_of_istiods_minor() -> None:
    result = _render("1.29.4", {})
    problem = version_skew(result.rollout, _deployment("x/pilot:1.31.0"))
    assert problem is not None
    assert problem.message.endswith("the newest patch of 1.31 this operator knows is 1.31.1")


def _tagged(tag: str) -> AmbientMeshSpec:
    return AmbientMeshSpec.model_validate({"images": {"tag": tag}})


def test_returning_the_tag_to_its_previous_value_is_a_rollback_in_the_same_order() -> None:
    # 1.30.4 -> 1.31.0: Linux rolled, the Windows builds still run 1.30.4.
    forward = decide(
        ORDER, _images(NEW), _running({"linux": NEW, WS2022: OLD, WS2025: OLD}, ("linux",))
    )
    settled = version_status(_tagged(OLD), decide(ORDER, _images(OLD), _running({})), None)
    upgrading = version_status(_tagged(NEW), forward, None, before=settled)
    assert (upgrading.previous, upgrading.rollback) == ("1.30.4", None)
    upgraded = version_status(_tagged(NEW), forward, None, before=upgrading)
    # Back to 1.30.4: only Linux runs 1.31.0, so only Linux rolls, and first.
    back = decide(ORDER, _images(OLD), _running({"linux": NEW, WS2022: OLD, WS2025: OLD}))
    assert _states(back) == [
        ("linux", "rolling", "hub/ztunnel:1.30.4"),
        (WS2022, "current", "hub/ztunnel:1.30.4"),
        (WS2025, "current", "hub/ztunnel:1.30.4"),
    ]
    status = version_status(_tagged(OLD), back, None, before=upgraded)
    assert (status.previous, status.rollback) == ("1.31.0", "from 1.31.0 to 1.30.4")
    assert rollout_message(back, None, status) == (
        "rolling the agents back from 1.31.0 to 1.30.4, in the same order as a change: Linux, "
        "then each Windows build; the agents on Linux are being replaced (istio-cni: new image; "
        "ztunnel: new image)"
    )
    # Still one on the next pass, and no more once every platform runs it.
    assert version_status(_tagged(OLD), back, None, before=status).rollback == (
        "from 1.31.0 to 1.30.4"
    )
    done = decide(ORDER, _images(OLD), _running({p: OLD for p in ORDER}))
    after = version_status(_tagged(OLD), done, None, before=status)
    assert (after.previous, after.rollback) == ("1.31.0", None)


def test_a_change_to_an_older_version_than_runs_is_a_rollback() -> None:
    running = _running({p: NEW for p in ORDER})
    before = version_status(_tagged(NEW), decide(ORDER, _images(NEW), running), None)
    status = version_status(
        _tagged("1.30.9"), decide(ORDER, _images("1.30.9"), running), None, before=before
    )
    assert (status.previous, status.rollback) == ("1.31.0", "from 1.31.0 to 1.30.9")
    newer = version_status(
        _tagged("1.31.1"), decide(ORDER, _images("1.31.1"), running), None, before=before
    )
    assert (newer.previous, newer.rollback) == ("1.31.0", None)


def _at(revision: str | None) -> dict[Any, RunningAgent]:
    """Every platform settled at OLD, ztunnel serving `revision`."""
    return {
        key: dataclasses.replace(agent, revision=revision if key[1] == "ztunnel" else None)
        for key, agent in _running({p: OLD for p in ORDER}).items()
    }


def test_a_new_istiod_revision_moves_linux_first() -> None:
    rollout = decide(ORDER, _images(OLD), _at("stable"), "canary")
    assert [(p.platform, p.state, p.revision) for p in rollout.platforms] == [
        ("linux", "rolling", "canary"),
        (WS2022, "waiting", "stable"),
        (WS2025, "waiting", "stable"),
    ]
    assert rollout.platforms[0].why == "ztunnel: new istiod revision"
    assert rollout_message(rollout) == (
        "the agents on Linux are being replaced (ztunnel: new istiod revision); Windows Server "
        "2022 (10.0.20348), Windows Server 2025 (10.0.26100) keep the istiod revision and "
        "images they run until Linux is Ready (a change of the agents' images or istiod "
        "revision rolls one platform at a time: Linux, then each Windows build)"
    )
    # Nothing moves when the revision is the one they serve.
    same = decide(ORDER, _images(OLD), _at("canary"), "canary")
    assert [p.state for p in same.platforms] == ["current"] * 3


def test_a_waiting_windows_build_keeps_its_revisions_istiod() -> None:
    spec = _revised("canary")
    facts = ClusterFacts(
        NODES,
        "10.96.0.22",
        "10.96.0.10",
        agents=_at("stable"),
        istiod_ips={"istiod-stable": "10.96.0.21", "istiod-canary": "10.96.0.22"},
    )
    result = render_dataplane(spec, facts)
    ztunnels = {
        o["metadata"]["name"]: o
        for o in result.objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"].startswith("ztunnel")
    }
    revisions = {
        name: ds["spec"]["template"]["metadata"]["annotations"].get("istio.io/rev")
        for name, ds in ztunnels.items()
    }
    assert revisions == {
        "ztunnel": "canary",
        "ztunnel-windows-ltsc2022": "stable",
        "ztunnel-windows-ltsc2025": "stable",
    }
    env = {
        e["name"]: e.get("value")
        for e in ztunnels["ztunnel-windows-ltsc2022"]["spec"]["template"]["spec"]["containers"][0][
            "env"
        ]
    }
    assert env["XDS_ADDRESS"] == "10.96.0.21:15012", env


def test_returning_the_revision_is_a_rollback() -> None:
    moved = decide(ORDER, _images(OLD), _at("canary"), "canary")
    start = version_status(_tagged(OLD), moved, None)
    at_canary = version_status(_revised("canary"), moved, None, before=start)
    assert (at_canary.revision, at_canary.previous_revision) == ("canary", "default")
    back = decide(ORDER, _images(OLD), _at("canary"), None)
    status = version_status(_tagged(OLD), back, None, before=at_canary)
    assert (status.revision, status.previous_revision, status.rollback) == (
        "default",
        "canary",
        "from istiod revision canary to default",
    )


def _revised(revision: str) -> AmbientMeshSpec:
    return AmbientMeshSpec.model_validate(
        {"images": {"tag": OLD}, "istiod": {"revision": revision}}
    )
