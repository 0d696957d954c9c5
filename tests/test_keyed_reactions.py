"""A namespace's labels and a node's platform are answered at once under churn (issue 44).

While pods come and go (status news, which the loop batches and spaces out
under churn: runtime/pacing.py) and a Linux node's labels keep changing, a
namespace label change and a new node of another platform are keyed
(cluster/state.py, ClusterState.poke): the first pass that begins after the
change is a keyed one, and it is the pass that answers it.

The operator counts the passes its loop begins, keyed or not
(ambient_operator_loop_passes_total{loop="reconcile",keyed}), as each one
begins. Read when the change is made and again when its answer is seen:
one keyed pass began in between, and no unkeyed one. Two cases tell
nothing, and the change is made again with a new key, up to three times: a
pass already running when the change came answered it (its namespace
checks had not run yet; no pass began in between), or a keyed pass of the
churn's own node began after the answer, before it was read. Spaced out,
the change would be answered by an unkeyed pass.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster, to_kwok_node
from ambient_devcluster.harness import get_mesh
from conftest import namespaces_settled, unique_name, wait_for
from operator_harness import RunningOperator, sample_mesh_operator

PASSES = "ambient_operator_loop_passes_total"
MODE = "istio.io/dataplane-mode"
ATTEMPTS = 3


@pytest.fixture(scope="module")
def operator(
    cluster: LocalCluster,
    k8s: client.ApiClient,
    sample_nodes: list[str],
    crds_installed: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    """The operator, with the sample mesh Reconciled."""
    with sample_mesh_operator(cluster, k8s, tmp_path_factory.mktemp("operator"), 60) as op:
        yield op


def _node(name: str, os_name: str, build: str | None = None) -> dict[str, Any]:
    """A kwok node, created whole in one request (status included, as Nodes allow)."""
    labels = {"kubernetes.io/os": os_name, "kubernetes.io/arch": "amd64"}
    if build:
        labels["node.kubernetes.io/windows-build"] = build
    return to_kwok_node(
        {
            "metadata": {"name": name, "labels": labels},
            "status": {
                "nodeInfo": {
                    "operatingSystem": os_name,
                    "architecture": "amd64",
                    "kernelVersion": f"{build}.2314" if build else "6.8.0",
                }
            },
        }
    )


@contextlib.contextmanager
def churn(k8s: client.ApiClient, operator: RunningOperator) -> Iterator[None]:
    """Pods created and deleted in an enrolled namespace, and a Linux node relabelled,
    until the block ends; entered once the loop has run three unkeyed passes of it."""
    core = client.CoreV1Api(k8s)
    ns, linux = unique_name("keyed-churn"), unique_name("keyed-churn-linux")
    core.create_namespace({"metadata": {"name": ns, "labels": {MODE: "ambient"}}})
    core.create_node(_node(linux, "linux"))
    wait_for(lambda: core.read_namespaced_service_account("default", ns), 30, "its account")
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        pod = {"spec": {"containers": [{"name": "app", "image": "docker.io/library/nginx:1"}]}}
        i = 0
        try:
            while not stop.is_set():
                name = f"p-{i}"
                core.create_namespaced_pod(ns, {"metadata": {"name": name}, **pod})
                if i >= 5:
                    core.delete_namespaced_pod(f"p-{i - 5}", ns, grace_period_seconds=0)
                if i % 3 == 0:
                    labels = {"test/churn": str(i)}
                    core.patch_node(linux, {"metadata": {"labels": labels}})
                i += 1
                stop.wait(0.05)
        except BaseException as exc:  # told to the test below
            errors.append(exc)

    worker = threading.Thread(target=run, name="churn", daemon=True)
    worker.start()
    try:
        unkeyed = operator.metric(PASSES, loop="reconcile", keyed="false")
        wait_for(
            lambda: operator.metric(PASSES, loop="reconcile", keyed="false") >= unkeyed + 3,
            60,
            "three unkeyed passes of the churn",
        )
        yield
        assert not errors, errors
        assert worker.is_alive(), "the churn stopped early"
    finally:
        stop.set()
        worker.join(30)
        with contextlib.suppress(ApiException):
            core.delete_namespace(ns)
        with contextlib.suppress(ApiException):
            core.delete_node(linux)
        # Its pods, enrolled, would count in a later module's cluster-wide totals.
        namespaces_settled(k8s)


def answered_by_a_keyed_pass(
    operator: RunningOperator,
    change: Callable[[int], Callable[[], bool]],
    what: str,
) -> list[tuple[int, int]]:
    """Make `change(attempt)`, which returns the test of its answer, until an answer is
    seen after passes began in between; the (keyed, unkeyed) passes begun, per attempt."""
    seen: list[tuple[int, int]] = []
    for attempt in range(ATTEMPTS):
        keyed = operator.metric(PASSES, loop="reconcile", keyed="true")
        unkeyed = operator.metric(PASSES, loop="reconcile", keyed="false")
        answered = change(attempt)
        wait_for(answered, 30, f"{what} answered", interval=0.02)
        began = (
            int(operator.metric(PASSES, loop="reconcile", keyed="true") - keyed),
            int(operator.metric(PASSES, loop="reconcile", keyed="false") - unkeyed),
        )
        seen.append(began)
        # (0, 0): a pass running when the change came answered it; (n > 1, 0): a
        # keyed pass of the churn's node followed the answer before it was read.
        # Neither tells which pass answered: the change is made again.
        if began[1] or began[0] == 1:
            break
    return seen


def test_a_namespace_label_is_answered_by_a_keyed_pass_under_churn(
    k8s: client.ApiClient, operator: RunningOperator
) -> None:
    core = client.CoreV1Api(k8s)
    names = [unique_name(f"keyed-{i}") for i in range(ATTEMPTS)]
    for name in names:
        core.create_namespace({"metadata": {"name": name, "labels": {MODE: "ambient"}}})

    def warned(name: str) -> bool:
        events = core.list_event_for_all_namespaces(
            field_selector=f"involvedObject.kind=Namespace,involvedObject.name={name}"
        ).items
        return any(e.reason == "InvalidDataplaneMode" for e in events)

    def flip(attempt: int) -> Callable[[], bool]:
        name = names[attempt]
        core.patch_namespace(name, {"metadata": {"labels": {MODE: "ambinet"}}})
        return lambda: warned(name)

    try:
        with churn(k8s, operator):
            seen = answered_by_a_keyed_pass(operator, flip, "the label's Warning")
    finally:
        for name in names:
            with contextlib.suppress(ApiException):
                core.delete_namespace(name)
        namespaces_settled(k8s)
    assert seen[-1] == (1, 0), (seen, operator.log_tail())


def test_a_node_of_a_new_platform_is_answered_by_a_keyed_pass_under_churn(
    k8s: client.ApiClient, operator: RunningOperator
) -> None:
    core = client.CoreV1Api(k8s)
    # One Windows build per attempt: each a platform no change touched lately.
    builds = ["10.0.26100", "10.0.20348", "10.0.17763"]
    names = [unique_name(f"keyed-ws-{i}") for i in range(ATTEMPTS)]

    def nodes_of(build: str) -> int:
        counts = get_mesh(k8s)["status"]["nodes"].get("windowsBuilds") or []
        return sum(int(b["nodes"]) for b in counts if b["build"] == build)

    def join(attempt: int) -> Callable[[], bool]:
        build = builds[attempt]
        before = nodes_of(build)
        core.create_node(_node(names[attempt], "windows", build))
        return lambda: nodes_of(build) == before + 1

    try:
        with churn(k8s, operator):
            seen = answered_by_a_keyed_pass(operator, join, "the node counted")
    finally:
        for name in names:
            with contextlib.suppress(ApiException):
                core.delete_node(name)
    assert seen[-1] == (1, 0), (seen, operator.log_tail())
