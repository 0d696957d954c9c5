"""The redirection-wait webhook through the real API server (admission, dry run, outages).

The operator runs as a subprocess serving HTTPS on a loopback port; the API
server calls it by URL. Every assertion reads the pod the API server stored.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster, create_nodes, delete_nodes
from ambient_devcluster.harness import (
    borrowed_mesh,
    create_namespace,
    get_mesh,
    ws2025_node,
)
from ambient_operator.api import constants as c
from ambient_operator.webhook import decide as d
from ambient_operator.webhook.config import CONFIG_NAME, SECRET_NAME
from checks import every
from conftest import unique_name, wait_for
from operator_harness import RunningOperator, free_port, webhook_args

AGENTS_NS = "istio-system"  # spec.namespace of the borrowed mesh (the default)
TIMEOUT = 45  # distinct from the default, so the test sees it travel from the spec
MULTI_IMAGE = "registry.example.com/ambient/redirection-wait:test"
WS2022_IMAGE = "mcr.microsoft.com/windows/nanoserver:ltsc2022"
TOLERATE_WINDOWS = [{"key": "os", "operator": "Equal", "value": "windows", "effect": "NoSchedule"}]
WORKAROUND = {"enabled": True, "timeoutSeconds": TIMEOUT, "multiBuildImage": MULTI_IMAGE}


@pytest.fixture(scope="module")
def mesh(k8s: client.ApiClient, sample_nodes: list[str], crds_installed: None) -> Iterator[None]:
    """The shared AmbientMesh with the workaround on; restored (or deleted) afterwards."""

    def spec_for(original: dict[str, Any] | None) -> dict[str, Any]:
        if original is None:
            return {"newPodWorkaround": WORKAROUND}
        spec = copy.deepcopy(original.get("spec") or {})
        spec["newPodWorkaround"] = WORKAROUND
        windows = spec.setdefault("platforms", {}).setdefault("windows", {})
        windows["enabled"] = True
        windows.pop("builds", None)
        return spec

    # The misses are counted in the status of a pass that writes; a pass refuses
    # (and counts nothing) while the agents' namespace is missing, which it is
    # when this module runs first on a fresh cluster.
    with contextlib.suppress(ApiException):
        client.CoreV1Api(k8s).create_namespace({"metadata": {"name": AGENTS_NS}})
    with borrowed_mesh(k8s, spec_for):
        yield


def _namespace(k8s: client.ApiClient, prefix: str, labels: dict[str, str]) -> str:
    return create_namespace(k8s, unique_name(prefix), labels)


@pytest.fixture(scope="module")
def namespaces(k8s: client.ApiClient) -> Iterator[dict[str, str]]:
    """An enrolled namespace, a plain one, and one for the TLS Secret."""
    names = {
        "enrolled": _namespace(k8s, "wh-enrolled", {c.LABEL_DATAPLANE_MODE: "ambient"}),
        "plain": _namespace(k8s, "wh-plain", {}),
        "tls": _namespace(k8s, "wh-tls", {}),
    }
    yield names
    core = client.CoreV1Api(k8s)
    for name in names.values():
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


@pytest.fixture(scope="module")
def ws2025_only(k8s: client.ApiClient) -> Iterator[str]:
    """A WS2025 node with a label no other node has: a pod selecting it sees a cluster
    whose only Windows nodes are WS2025."""
    pool = unique_name("ws2025-pool")
    node = ws2025_node(pool, {"ambient-test/pool": pool})
    create_nodes(k8s, [node], timeout=60)
    yield pool
    delete_nodes(k8s, [pool], wait=False)


@pytest.fixture(scope="module")
def runtime_class(k8s: client.ApiClient) -> Iterator[str]:
    """A RuntimeClass that schedules onto Windows nodes."""
    node_api = client.NodeV1Api(k8s)
    name = unique_name("windows-rc")
    node_api.create_runtime_class(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": name},
            "handler": "runhcs-wcow-process",
            "scheduling": {
                "nodeSelector": {c.LABEL_OS: "windows"},
                "tolerations": TOLERATE_WINDOWS,
            },
        }
    )
    yield name
    with contextlib.suppress(ApiException):
        node_api.delete_runtime_class(name)


class Hook:
    """The operator serving the webhook, and how to reach its pieces."""

    def __init__(self, op: RunningOperator, port: int, tls_namespace: str) -> None:
        self.op = op
        self.port = port
        self.tls_namespace = tls_namespace


def _probe(k8s: client.ApiClient, namespace: str) -> bool:
    """A dry-run create that the webhook mutates: it is up and its caches are warm."""
    pod = _pod("probe", nodeSelector={c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: c.BUILD_WS2022})
    out = client.CoreV1Api(k8s).create_namespaced_pod(namespace, pod, dry_run="All")
    return any(ct.name == d.CONTAINER_NAME for ct in out.spec.init_containers or [])


@pytest.fixture(scope="module")
def hook(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    mesh: None,
    namespaces: dict[str, str],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Hook]:
    """`ambient-operator run` with the webhook on a loopback port, reached by URL."""
    port = free_port()
    op = RunningOperator(
        cluster,
        tmp_path_factory.mktemp("webhook-operator"),
        extra_args=[*webhook_args(port, namespaces["tls"]), "--resync-seconds", "2"],
    )
    op.start()
    try:
        try:
            wait_for(lambda: _probe(k8s, namespaces["enrolled"]), 60, "the webhook to mutate")
        except TimeoutError as exc:
            raise AssertionError(f"webhook not up; operator log:\n{op.log_text()[-6000:]}") from exc
        yield Hook(op, port, namespaces["tls"])
    finally:
        op.stop()
        with contextlib.suppress(ApiException):
            client.AdmissionregistrationV1Api(k8s).delete_mutating_webhook_configuration(
                CONFIG_NAME
            )
    log = op.log_text()
    assert "Traceback" not in log, log[-4000:]


def _pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "app", "image": "example.com/app:1"}], **spec},
    }
    return body


def _create(k8s: client.ApiClient, namespace: str, pod: dict[str, Any]) -> dict[str, Any]:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_pod(namespace, pod)
    stored = core.read_namespaced_pod(pod["metadata"]["name"], namespace)
    out: dict[str, Any] = k8s.sanitize_for_serialization(stored)
    return out


def _ours(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [ct for ct in pod["spec"].get("initContainers") or [] if ct["name"] == d.CONTAINER_NAME]


def _assert_untouched(pod: dict[str, Any]) -> None:
    assert _ours(pod) == []
    assert d.VOLUME_NAME not in [v["name"] for v in pod["spec"].get("volumes") or []]
    annotations = pod["metadata"].get("annotations") or {}
    assert not str(annotations.get(d.ANNOTATION, "")).startswith("injected")


def _assert_injected(pod: dict[str, Any], image: str, build: str) -> None:
    inits = pod["spec"]["initContainers"]
    assert inits[0]["name"] == d.CONTAINER_NAME, "ours must run first"
    assert len(_ours(pod)) == 1
    ours = inits[0]
    assert ours["image"] == image
    assert ours["command"] == list(d.COMMAND)
    env = {e["name"]: e["value"] for e in ours["env"]}
    assert env == {d.ENV_TIMEOUT: str(TIMEOUT), d.ENV_FILE: "C:\\ambient\\podinfo\\annotations"}
    # The ServiceAccount plugin, re-run after webhooks, adds its token mount too.
    assert {"name": d.VOLUME_NAME, "mountPath": d.MOUNT_DIR, "readOnly": True} in ours[
        "volumeMounts"
    ]
    assert ours["resources"]["requests"] == d.REQUESTS
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == d.VOLUME_NAME)
    assert volume["downwardAPI"]["items"] == [
        {
            "path": "annotations",
            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.annotations"},
        }
    ]
    note = pod["metadata"]["annotations"][d.ANNOTATION]
    assert note.startswith(f"injected; build={build}; reason="), note


WIN = {"nodeSelector": {c.LABEL_OS: "windows"}, "tolerations": TOLERATE_WINDOWS}


def _pinned(build: str) -> dict[str, Any]:
    return {
        "nodeSelector": {c.LABEL_OS: "windows", c.LABEL_WINDOWS_BUILD: build},
        "tolerations": TOLERATE_WINDOWS,
    }


def test_configuration_never_blocks_and_tls_is_shared(k8s: client.ApiClient, hook: Hook) -> None:
    config = k8s.sanitize_for_serialization(
        client.AdmissionregistrationV1Api(k8s).read_mutating_webhook_configuration(CONFIG_NAME)
    )
    secret = client.CoreV1Api(k8s).read_namespaced_secret(SECRET_NAME, hook.tls_namespace)
    assert secret.type == "kubernetes.io/tls"
    assert set(secret.data) >= {"tls.crt", "tls.key", "ca.crt", "ca.key"}
    assert len(config["webhooks"]) == 2
    for entry in config["webhooks"]:
        assert entry["failurePolicy"] == "Ignore"
        assert entry["timeoutSeconds"] <= 5
        assert entry["sideEffects"] == "None"
        assert entry["reinvocationPolicy"] == "IfNeeded"
        assert entry["rules"][0]["operations"] == ["CREATE"]
        assert entry["clientConfig"]["url"] == f"https://127.0.0.1:{hook.port}/redirection-wait"
        assert entry["clientConfig"]["caBundle"] == secret.data["ca.crt"]
    by_name = {e["name"].split(".")[0]: e for e in config["webhooks"]}
    assert by_name["namespace"]["namespaceSelector"] == {
        "matchLabels": {c.LABEL_DATAPLANE_MODE: "ambient"}
    }
    assert by_name["pod"]["objectSelector"] == {"matchLabels": {c.LABEL_DATAPLANE_MODE: "ambient"}}


SHAPES: list[tuple[str, str, dict[str, Any], tuple[str, str] | None]] = [
    # (id, namespace key, pod kwargs, (image, build) when injected / None when untouched)
    ("linux", "enrolled", {"nodeSelector": {c.LABEL_OS: "linux"}}, None),
    ("windows-unpinned", "enrolled", WIN, (MULTI_IMAGE, "any")),
    ("windows-ws2022", "enrolled", _pinned(c.BUILD_WS2022), (WS2022_IMAGE, c.BUILD_WS2022)),
    ("windows-ws2025", "enrolled", _pinned(c.BUILD_WS2025), None),
    (
        "os-name-only",
        "enrolled",
        {"os": {"name": "windows"}, "tolerations": TOLERATE_WINDOWS},
        (MULTI_IMAGE, "any"),
    ),
    (
        "affinity-ws2022",
        "enrolled",
        {
            "tolerations": TOLERATE_WINDOWS,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": c.LABEL_WINDOWS_BUILD,
                                        "operator": "In",
                                        "values": [c.BUILD_WS2022],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        },
        (WS2022_IMAGE, c.BUILD_WS2022),
    ),
    (
        "opted-out",
        "enrolled",
        {**_pinned(c.BUILD_WS2022), "annotations": {d.ANNOTATION: "false"}},
        None,
    ),
    (
        "dataplane-mode-none",
        "enrolled",
        {**_pinned(c.BUILD_WS2022), "labels": {c.LABEL_DATAPLANE_MODE: "none"}},
        None,
    ),
    ("host-network", "enrolled", {**_pinned(c.BUILD_WS2022), "hostNetwork": True}, None),
    (
        "sidecar",
        "enrolled",
        {**_pinned(c.BUILD_WS2022), "labels": {"sidecar.istio.io/inject": "true"}},
        None,
    ),
    ("namespace-not-enrolled", "plain", _pinned(c.BUILD_WS2022), None),
    (
        "pod-enrolled-in-plain-namespace",
        "plain",
        {**_pinned(c.BUILD_WS2022), "labels": {c.LABEL_DATAPLANE_MODE: "ambient"}},
        (WS2022_IMAGE, c.BUILD_WS2022),
    ),
]


@pytest.mark.parametrize(
    ("namespace_key", "kwargs", "expected"),
    [pytest.param(ns, kw, exp, id=name) for name, ns, kw, exp in SHAPES],
)
def test_pod_shapes(
    k8s: client.ApiClient,
    hook: Hook,
    namespaces: dict[str, str],
    namespace_key: str,
    kwargs: dict[str, Any],
    expected: tuple[str, str] | None,
) -> None:
    stored = _create(k8s, namespaces[namespace_key], _pod(unique_name("shape"), **kwargs))
    if expected is None:
        _assert_untouched(stored)
    else:
        _assert_injected(stored, *expected)


def test_runtime_class_pod(
    k8s: client.ApiClient, hook: Hook, namespaces: dict[str, str], runtime_class: str
) -> None:
    # The RuntimeClass alone says Windows; its tolerations reach the tainted node.
    stored = _create(
        k8s, namespaces["enrolled"], _pod(unique_name("rc"), runtimeClassName=runtime_class)
    )
    _assert_injected(stored, MULTI_IMAGE, "any")


def test_cluster_with_only_ws2025_windows_nodes(
    k8s: client.ApiClient, hook: Hook, namespaces: dict[str, str], ws2025_only: str
) -> None:
    # Wait until the operator's node cache has the new node. The barrier is a pod
    # bound to that node yet pinned to WS2022: while the cache lacks the node only
    # the pin tells, and the pod gets the WS2022 container; once the node is known,
    # its binding decides, and a WS2025 node needs none (docs/troubleshooting.md,
    # NoPreWS2025Node: "bound to a node that needs no workaround").
    reviews = "ambient_operator_webhook_reviews_total"

    def known() -> bool:
        before = hook.op.metric(reviews, action="none", reason="NoPreWS2025Node")
        probe = _pod("probe-ws2025", nodeName=ws2025_only, **_pinned(c.BUILD_WS2022))
        out = client.CoreV1Api(k8s).create_namespaced_pod(
            namespaces["enrolled"], probe, dry_run="All"
        )
        untouched = _ours(k8s.sanitize_for_serialization(out)) == []
        # Answered, not ignored: failurePolicy Ignore leaves a pod untouched too.
        answered = hook.op.metric(reviews, action="none", reason="NoPreWS2025Node") > before
        return untouched and answered

    wait_for(known, 30, "the WS2025 node in the operator's cache")
    stored = _create(
        k8s,
        namespaces["enrolled"],
        _pod(
            unique_name("only-ws2025"),
            nodeSelector={c.LABEL_OS: "windows", "ambient-test/pool": ws2025_only},
            tolerations=TOLERATE_WINDOWS,
        ),
    )
    _assert_untouched(stored)


def test_existing_init_container_is_not_duplicated(
    k8s: client.ApiClient, hook: Hook, namespaces: dict[str, str]
) -> None:
    mine = {"name": d.CONTAINER_NAME, "image": "example.com/my-own-wait:1"}
    stored = _create(
        k8s,
        namespaces["enrolled"],
        _pod(unique_name("has-it"), initContainers=[mine], **_pinned(c.BUILD_WS2022)),
    )
    assert [ct["image"] for ct in _ours(stored)] == ["example.com/my-own-wait:1"]
    assert d.VOLUME_NAME not in [v["name"] for v in stored["spec"].get("volumes") or []]


def test_injected_container_runs_first(
    k8s: client.ApiClient, hook: Hook, namespaces: dict[str, str]
) -> None:
    other = {"name": "setup", "image": "example.com/setup:1"}
    stored = _create(
        k8s,
        namespaces["enrolled"],
        _pod(unique_name("first"), initContainers=[other], **_pinned(c.BUILD_WS2022)),
    )
    assert [ct["name"] for ct in stored["spec"]["initContainers"]] == [d.CONTAINER_NAME, "setup"]


def test_the_api_server_calls_the_webhook_once_per_pod(
    k8s: client.ApiClient, hook: Hook, namespaces: dict[str, str]
) -> None:
    """Our container carries the token mount ServiceAccount admission would add after us.

    Otherwise that admission's second run changes the pod after our answer,
    and the API server calls us again (reinvocationPolicy IfNeeded).
    """
    reviews = "ambient_operator_webhook_reviews_total"
    before = hook.op.metric(reviews)
    stored = _create(
        k8s, namespaces["enrolled"], _pod(unique_name("once"), **_pinned(c.BUILD_WS2022))
    )
    assert hook.op.metric(reviews) == before + 1
    (ours,) = _ours(stored)
    (app,) = stored["spec"]["containers"]
    token = [m for m in app["volumeMounts"] if m["name"].startswith("kube-api-access-")]
    assert len(token) == 1
    assert [m for m in ours["volumeMounts"] if m["name"].startswith("kube-api-access-")] == token


def _events_about(k8s: client.ApiClient, namespace: str, name: str) -> list[Any]:
    return list(
        client.CoreV1Api(k8s)
        .list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
        .items
    )


def _without_token_mount(containers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The token volume's name has a random suffix per pod.
    out = copy.deepcopy(containers)
    for ct in out:
        ct["volumeMounts"] = [
            m for m in ct["volumeMounts"] if not m["name"].startswith("kube-api-access-")
        ]
    return out


def test_dry_run_gets_the_same_mutation_and_writes_nothing(
    k8s: client.ApiClient, hook: Hook, namespaces: dict[str, str]
) -> None:
    core = client.CoreV1Api(k8s)
    ns = namespaces["enrolled"]
    secret_rv = core.read_namespaced_secret(
        SECRET_NAME, hook.tls_namespace
    ).metadata.resource_version
    name = unique_name("dry")
    out = k8s.sanitize_for_serialization(
        core.create_namespaced_pod(ns, _pod(name, **_pinned(c.BUILD_WS2022)), dry_run="All")
    )
    _assert_injected(out, WS2022_IMAGE, c.BUILD_WS2022)
    # The same shape created for real is mutated identically.
    real = _create(k8s, ns, _pod(unique_name("wet"), **_pinned(c.BUILD_WS2022)))
    assert _without_token_mount(_ours(real)) == _without_token_mount(_ours(out))
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod(name, ns)
    assert err.value.status == 404
    # A barrier before "no Event": the operator tells about pods from its pod watch,
    # so a pod made after the dry run that earns an Event (created before its
    # namespace was enrolled, so without the container) shows that one about the
    # dry-run pod would have been posted by now.
    later = _namespace(k8s, "wh-later", {})
    try:
        core.create_namespaced_pod(later, _pod("later", **_pinned(c.BUILD_WS2022)))
        core.patch_namespace(later, {"metadata": {"labels": {c.LABEL_DATAPLANE_MODE: "ambient"}}})
        wait_for(
            lambda: [
                e
                for e in _events_about(k8s, later, "later")
                if e.reason == "RedirectionWaitMissing"
            ],
            60,
            "the later pod's Warning Event",
        )
    finally:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod("later", later, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            core.delete_namespace(later)
    assert _events_about(k8s, ns, name) == []
    assert (
        core.read_namespaced_secret(SECRET_NAME, hook.tls_namespace).metadata.resource_version
        == secret_rv
    )
    wait_for(lambda: _workaround_misses(k8s) == 0, 60, "the later pod's miss to clear")


def _workaround_misses(k8s: client.ApiClient) -> int:
    mesh = get_mesh(k8s)
    return int(((mesh.get("status") or {}).get("enrollment") or {}).get("workaroundMisses", 0))


def test_outage_admits_pods_and_reports_the_miss(
    k8s: client.ApiClient, hook: Hook, namespaces: dict[str, str]
) -> None:
    core = client.CoreV1Api(k8s)
    ns = namespaces["enrolled"]
    secret_before = core.read_namespaced_secret(SECRET_NAME, hook.tls_namespace).data
    wait_for(lambda: _workaround_misses(k8s) == 0, 30, "no misses before the outage")
    hook.op.stop()
    try:
        name = unique_name("missed")
        started = time.monotonic()
        stored = _create(k8s, ns, _pod(name, **_pinned(c.BUILD_WS2022)))
        elapsed = time.monotonic() - started
        _assert_untouched(stored)
        assert elapsed < 5, f"pod creation took {elapsed:.1f}s with the webhook down"
    finally:
        hook.op.start()
    wait_for(lambda: _probe(k8s, ns), 60, "the webhook back")
    wait_for(lambda: _workaround_misses(k8s) >= 1, 60, "workaroundMisses in the status")
    wait_for(
        lambda: hook.op.metric("ambient_operator_webhook_misses_total") >= 1, 30, "miss metric"
    )
    assert hook.op.metric("ambient_operator_webhook_missed_pods") >= 1
    warning = wait_for(
        lambda: [e for e in _events_about(k8s, ns, name) if e.reason == "RedirectionWaitMissing"],
        30,
        "a Warning Event on the pod",
    )
    assert warning[0].type == "Warning"
    assert d.CONTAINER_NAME in warning[0].message
    # The restarted operator reused the stored certificate (no new CA).
    assert core.read_namespaced_secret(SECRET_NAME, hook.tls_namespace).data == secret_before
    # Deleting the pod clears the count.
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    wait_for(lambda: _workaround_misses(k8s) == 0, 60, "the miss to clear")


def test_ca_bundle_follows_the_secret(k8s: client.ApiClient, hook: Hook) -> None:
    """The MutatingWebhookConfiguration trusts the CA in the Secret (also after restart)."""
    secret = client.CoreV1Api(k8s).read_namespaced_secret(SECRET_NAME, hook.tls_namespace)
    config = client.AdmissionregistrationV1Api(k8s).read_mutating_webhook_configuration(CONFIG_NAME)
    ca = base64.b64decode(secret.data["ca.crt"])
    assert ca.startswith(b"-----BEGIN CERTIFICATE-----")
    every(
        config.webhooks,
        lambda w: w.client_config.ca_bundle == secret.data["ca.crt"],
        "webhooks",
        count=2,  # namespace- and pod-selected
    )


def test_operator_log_is_clean(hook: Hook) -> None:
    assert "redirection-wait webhook failed" not in hook.op.log_text()
