"""The redirection-wait image the webhook hands out, through the real API server (issue 41).

A Windows pod whose build is not fixed gets the multi-build image. With no
`spec.newPodWorkaround.multiBuildImage` and no registry that image is
`<hub>/redirection-wait:<tag>`, which nobody publishes: the webhook must not
hand it over. The pod is admitted unchanged but for the annotation that says
why (ImageUnavailable), the operator posts a Warning Event on it and counts it
in `status.enrollment`, and Degraded names the field to set. With
`spec.images.registry`, or the operator's `--default-registry` (the chart's
value `registry`), the pod gets `<registry>/redirection-wait:<operator version>`,
what `make images` pushed. Every assertion reads what the API server stored.
"""

from __future__ import annotations

import contextlib
import copy
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import oracle
from ambient_devcluster import LocalCluster
from ambient_devcluster.harness import (
    borrowed_mesh,
    condition,
    create_namespace,
    get_mesh,
    set_mesh_spec,
)
from ambient_operator.api import constants as c
from ambient_operator.webhook import decide as d
from ambient_operator.webhook.config import CONFIG_NAME
from conftest import unique_name, wait_for
from operator_harness import RunningOperator, free_port, webhook_args

AGENTS_NS = "istio-system"
TOLERATE_WINDOWS = [{"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"}]
# No build fixed: the multi-build image.
WIN = {"nodeSelector": {c.LABEL_OS: "windows"}, "tolerations": TOLERATE_WINDOWS}
PINNED_WS2022 = {
    "nodeSelector": {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: c.BUILD_WS2022},
    "tolerations": TOLERATE_WINDOWS,
}
NANOSERVER_2022 = "mcr.microsoft.com/windows/nanoserver:ltsc2022"
SPEC_REGISTRY = "registry.example.com:5000/ambient"
CHART_REGISTRY = "chart.example.com/bundled"
WITHHELD = "withheld; build=any; reason=ImageUnavailable"


def _spec_for(original: dict[str, Any] | None) -> dict[str, Any]:
    """The mesh with the workaround on and no image for pods whose build is not fixed."""
    spec = copy.deepcopy((original or {}).get("spec") or {})
    spec["newPodWorkaround"] = {"enabled": True}
    images = spec.setdefault("images", {})
    images.pop("registry", None)
    windows = spec.setdefault("platforms", {}).setdefault("windows", {})
    windows["enabled"] = True
    windows.pop("builds", None)
    return spec


@pytest.fixture(scope="module")
def mesh(k8s: client.ApiClient, sample_nodes: list[str], crds_installed: None) -> Iterator[None]:
    # A pass refuses (and counts nothing) while the agents' namespace is missing.
    with contextlib.suppress(ApiException):
        client.CoreV1Api(k8s).create_namespace({"metadata": {"name": AGENTS_NS}})
    with borrowed_mesh(k8s, _spec_for):
        yield


@pytest.fixture(scope="module")
def namespaces(k8s: client.ApiClient) -> Iterator[dict[str, str]]:
    names = {
        "enrolled": create_namespace(
            k8s, unique_name("whi-enrolled"), {c.LABEL_DATAPLANE_MODE: "ambient"}
        ),
        "tls": create_namespace(k8s, unique_name("whi-tls"), {}),
    }
    yield names
    for name in names.values():
        with contextlib.suppress(ApiException):
            client.CoreV1Api(k8s).delete_namespace(name)


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}], **spec},
    }


def _dry_run(k8s: client.ApiClient, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    out = client.CoreV1Api(k8s).create_namespaced_pod(
        namespace, _pod(unique_name("probe"), **spec), dry_run="All"
    )
    stored: dict[str, Any] = k8s.sanitize_for_serialization(out)
    return stored


def _ours(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [ct for ct in pod["spec"].get("initContainers") or [] if ct["name"] == d.CONTAINER_NAME]


def _wait_image(k8s: client.ApiClient, namespace: str, spec: dict[str, Any], image: str) -> None:
    """Until a dry-run pod gets the init container with `image` (the caches caught up)."""

    def given() -> bool:
        return [ct["image"] for ct in _ours(_dry_run(k8s, namespace, spec))] == [image]

    wait_for(given, 60, f"a dry-run pod to get {image}")


def _operator(
    cluster: LocalCluster, workdir: Any, tls_namespace: str, *extra: str
) -> RunningOperator:
    return RunningOperator(
        cluster,
        workdir,
        extra_args=[*webhook_args(free_port(), tls_namespace), "--resync-seconds", "2", *extra],
    )


@pytest.fixture(scope="module")
def op(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: None,
    namespaces: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    """`ambient-operator run` serving the webhook, with no --default-registry."""
    running = _operator(cluster, tmp_path_factory.mktemp("webhook-images"), namespaces["tls"])
    running.start()
    try:
        # A pinned pod gets nanoserver, a real public image: the webhook is up.
        _wait_image(k8s, namespaces["enrolled"], PINNED_WS2022, NANOSERVER_2022)
        yield running
    finally:
        running.stop()
        with contextlib.suppress(ApiException):
            client.AdmissionregistrationV1Api(k8s).delete_mutating_webhook_configuration(
                CONFIG_NAME
            )
    log = running.log_text()
    assert "Traceback" not in log, log[-4000:]


def _enrollment(k8s: client.ApiClient) -> dict[str, Any]:
    enrollment: dict[str, Any] = (get_mesh(k8s).get("status") or {}).get("enrollment") or {}
    return enrollment


def _counts(k8s: client.ApiClient) -> tuple[int, int]:
    enrollment = _enrollment(k8s)
    return (
        int(enrollment.get("workaroundMisses", 0)),
        int(enrollment.get("workaroundImageUnavailable", 0)),
    )


def _events(k8s: client.ApiClient, namespace: str, name: str, reason: str) -> list[Any]:
    items = (
        client.CoreV1Api(k8s)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        .items
    )
    return [e for e in items if e.reason == reason]


def test_an_unavailable_image_is_withheld_told_and_counted_then_given_from_the_registry(
    cluster: LocalCluster, k8s: client.ApiClient, op: RunningOperator, namespaces: dict[str, str]
) -> None:
    core = client.CoreV1Api(k8s)
    ns = namespaces["enrolled"]
    wait_for(lambda: _counts(k8s) == (0, 0), 60, "no misses before the test")
    name = unique_name("unresolvable")
    # Kept unbound (no scheduler answers to this name): bound to a kwok node, the
    # pod would be judged by that node's build, WS2022's nanoserver or WS2025's
    # no-wait, and whether the scheduler got there first would decide the counts.
    core.create_namespaced_pod(ns, _pod(name, **WIN, schedulerName="ambient-test-unscheduled"))
    stored: dict[str, Any] = k8s.sanitize_for_serialization(core.read_namespaced_pod(name, ns))
    # Admitted, without the init container or its volume, with the reason on the pod.
    assert _ours(stored) == []
    assert d.VOLUME_NAME not in [v["name"] for v in stored["spec"].get("volumes") or []]
    assert stored["metadata"]["annotations"][d.ANNOTATION] == WITHHELD
    assert (
        op.metric(
            "ambient_operator_webhook_reviews_total", action="withheld", reason="ImageUnavailable"
        )
        == 1
    )
    # The pass that judges the pod counts it in status and tells about it on the
    # pod; under load the loop's spacing may hold that pass for a while.
    wait_for(lambda: _counts(k8s) == (1, 1), 180, "workaroundImageUnavailable 1 in the status")
    # The operator tells about it on the pod: the risk, and what to build and set.
    event = wait_for(
        lambda: _events(k8s, ns, name, "RedirectionWaitImageUnavailable"),
        180,
        "a RedirectionWaitImageUnavailable Event on the pod",
    )
    assert len(event) == 1 and event[0].type == "Warning"
    for fragment in (
        "admitted without the ambient-redirection-wait init container",
        "(ImageUnavailable)",
        "bypasses ztunnel",
        "Run `make images REGISTRY=<registry>` (docs/images.md), set spec.images.registry",
    ):
        assert fragment in event[0].message, event[0].message
    # And counts it in status, told apart from pods the webhook never answered for.
    wait_for(lambda: _counts(k8s) == (1, 1), 60, "workaroundImageUnavailable 1 in the status")
    # `ambient-operator status` says why.
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ambient-operator"), "status"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
    )
    assert (
        "Webhook misses: 1 Windows pod(s) admitted without the redirection-wait init container "
        "(1 because no redirection-wait image is known: run `make images REGISTRY=<registry>` "
        "and set spec.images.registry)\n"
    ) in done.stdout, done.stdout + done.stderr
    degraded = condition(get_mesh(k8s), "Degraded")
    assert degraded["status"] == "True", degraded
    assert (
        "spec.newPodWorkaround.multiBuildImage is unset, and so is spec.images.registry"
        in degraded["message"]
    ), degraded

    # A registry makes the image known: new pods get what `make images` pushed there.
    spec = copy.deepcopy(get_mesh(k8s)["spec"])
    spec.setdefault("images", {})["registry"] = SPEC_REGISTRY
    set_mesh_spec(k8s, spec)
    image = f"{SPEC_REGISTRY}/redirection-wait:{oracle.OPERATOR_VERSION}"
    _wait_image(k8s, ns, WIN, image)
    given = unique_name("given")
    core.create_namespaced_pod(ns, _pod(given, **WIN))
    stored = k8s.sanitize_for_serialization(core.read_namespaced_pod(given, ns))
    assert [ct["image"] for ct in stored["spec"]["initContainers"]] == [image]
    assert stored["metadata"]["annotations"][d.ANNOTATION] == (
        "injected; build=any; reason=MayLandOnPreWS2025Node"
    )
    # The pod admitted before still lacks it, for want of the image then. The given pod
    # is the barrier: the pass that saw it also judged the first one.
    wait_for(
        lambda: (
            "spec.newPodWorkaround.multiBuildImage"
            not in condition(get_mesh(k8s), "Degraded").get("message", "")
        ),
        60,
        "Degraded to stop naming the redirection-wait image",
    )
    assert _counts(k8s) == (1, 1)
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for(lambda: _counts(k8s) == (0, 0), 60, "the withheld pod's count to clear")
    core.delete_namespaced_pod(given, ns, grace_period_seconds=0)


def test_the_operators_default_registry_stands_in_for_the_spec(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    op: RunningOperator,
    namespaces: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # The chart hands its value `registry` to the operator as --default-registry.
    spec = copy.deepcopy(get_mesh(k8s)["spec"])
    spec.setdefault("images", {}).pop("registry", None)
    set_mesh_spec(k8s, spec)
    ns = namespaces["enrolled"]
    op.stop()
    other = _operator(
        cluster,
        tmp_path_factory.mktemp("webhook-images-default"),
        namespaces["tls"],
        "--default-registry",
        CHART_REGISTRY,
    )
    other.start()
    try:
        _wait_image(k8s, ns, WIN, f"{CHART_REGISTRY}/redirection-wait:{oracle.OPERATOR_VERSION}")
        # The spec's own registry wins over the operator's.
        spec["images"]["registry"] = SPEC_REGISTRY
        set_mesh_spec(k8s, spec)
        _wait_image(k8s, ns, WIN, f"{SPEC_REGISTRY}/redirection-wait:{oracle.OPERATOR_VERSION}")
    finally:
        other.stop()
        op.start()
    assert "Traceback" not in other.log_text(), other.log_text()[-4000:]
