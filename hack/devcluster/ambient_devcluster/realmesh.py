"""Istio's Linux agents on the real node, installed the way a user installs them.

What the real-node tests (tests/test_realnode_mesh.py), the data-path
benchmark (bench/datapath.py) and the demo share: the images `make images`
built, loaded into the node's containerd; istiod (pilot-discovery on the
host) behind its own chart's Service; the operator by `helm install` of our
chart, as a pod on the real node; an AmbientMesh whose Linux agents are the
built ztunnel and install-cni, with the node's CNI folders. Then the sample
app's pods and ztunnel's own counters.
"""

from __future__ import annotations

import contextlib
import json
import re
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .harness import wait_for
from .istio import IstioControlPlane, helm
from .launcher import ClusterError, LocalCluster, repo_root
from .manifests import apply_objects
from .realnode import NODE_NAME, RealNode

# Where the node's containerd finds the pipeline's images (hack/images): the
# chart's value `registry` and the AmbientMesh's hub name them so.
REGISTRY = "localhost/ambient-devcluster"
IMAGES = ("ambient-operator", "ztunnel", "install-cni", "sample-app")
ISTIO_NS = "istio-system"
OPERATOR_NS = "ambient-operator"
RELEASE = "ao"
CHART = repo_root() / "charts" / "ambient-operator"
DATAPLANE_MODE = "istio.io/dataplane-mode"
REDIRECTION = "ambient.istio.io/redirection"
# ztunnel's stats port (shared DESIGN §1, ports).
ZTUNNEL_METRICS = 15020
_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\} (?P<value>\S+)$")
_LABEL = re.compile(r'([a-z_]+)="([^"]*)"')


@dataclass
class RealMesh:
    """A cluster with its real node, istiod and the operator installed by Helm."""

    cluster: LocalCluster
    node: RealNode
    istiod: IstioControlPlane
    api: client.ApiClient
    # Image name (as hack/images names it) -> the reference the node holds it under.
    images: dict[str, str] = field(default_factory=dict)

    @property
    def core(self) -> client.CoreV1Api:
        """The core API on the mesh's cluster."""
        return client.CoreV1Api(self.api)


def ambientmesh(node: RealNode) -> dict[str, Any]:
    """The AmbientMesh for the real node: the built images, the node's CNI folders."""
    return {
        "apiVersion": "ambientoperator.io/v1alpha1",
        "kind": "AmbientMesh",
        "metadata": {"name": "default"},
        "spec": {
            "images": {"hub": REGISTRY},
            # The node's containerd keeps its CNI folders and network
            # namespaces under the node's folder, not at the usual host paths.
            "platforms": {
                "linux": {
                    "cniBinDir": str(node.cni_plugin_dir),
                    "cniConfDir": str(node.cni_conf_dir),
                    "cniNetnsDir": str(node.netns_dir),
                }
            },
        },
    }


def _set_json(values: Mapping[str, Any]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set-json", f"{k}={json.dumps(v)}")]


@contextlib.contextmanager
def real_mesh(
    cluster: LocalCluster, node: RealNode, workdir: Path, bin_dir: Path, layouts: Path
) -> Iterator[RealMesh]:
    """Load the images, start istiod, `helm install` the operator and apply the
    AmbientMesh; on the way out, the agents leave the node and the release goes."""
    images = {}
    for name in IMAGES:
        layout = layouts / name
        if not (layout / "index.json").is_file():
            raise ClusterError(f"no {name} image at {layout}: run `make images`")
        images[name] = node.import_layout(layout, f"{REGISTRY}/{name}")
    # istiod's Deployment (the chart's, as a user installs it) runs on a kwok
    # node; the real istiod is the host process behind its Service.
    istiod = IstioControlPlane(
        cluster.kubeconfig,
        workdir / "istiod",
        bin_dir,
        values={"global.tag": "1.31.0", "nodeSelector.kubernetes\\.io/hostname": "linux-amd64-1"},
    )
    with istiod, cluster.api_client() as api:
        ports = istiod.ports
        node.serve_service_from_host(
            ISTIO_NS,
            "istiod",
            {"grpc-xds": ports.grpc, "https-dns": ports.secure_grpc, "https-webhook": ports.https},
        )
        core = client.CoreV1Api(api)
        with contextlib.suppress(ApiException):
            core.create_namespace(
                client.V1Namespace(metadata=client.V1ObjectMeta(name=OPERATOR_NS))
            )
        kube = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", OPERATOR_NS]
        values = {"registry": REGISTRY, "nodeSelector": {"kubernetes.io/hostname": NODE_NAME}}
        done = helm(
            bin_dir, "install", RELEASE, str(CHART), *kube, *_set_json(values),
            "--wait", "--timeout", "3m",
        )  # fmt: skip
        if done.returncode != 0:
            raise ClusterError(f"helm install of the chart failed: {done.stderr.strip()}")
        apply_objects(api, [ambientmesh(node)])
        try:
            yield RealMesh(cluster, node, istiod, api, images)
        finally:
            remove_agents(core)
            helm(bin_dir, "uninstall", RELEASE, *kube, "--wait", "--timeout", "2m")


def remove_agents(core: client.CoreV1Api) -> None:
    """Delete the AmbientMesh and wait for its agents to leave the real node, so
    that istio-cni, seeing its DaemonSet gone, takes its plugin out as on an uninstall."""
    custom = client.CustomObjectsApi(core.api_client)
    with contextlib.suppress(ApiException):
        custom.delete_cluster_custom_object(
            "ambientoperator.io", "v1alpha1", "ambientmeshes", "default"
        )
    with contextlib.suppress(TimeoutError):
        wait_for(
            lambda: (
                not core.list_namespaced_pod(
                    ISTIO_NS, field_selector=f"spec.nodeName={NODE_NAME}"
                ).items
            ),
            120,
            "the agents gone from the real node",
        )


def ready(pod: client.V1Pod | None) -> client.V1Pod | None:
    """The pod when it is Running and Ready."""
    if pod is None or pod.status is None or pod.status.phase != "Running":
        return None
    conditions = {c.type: c.status for c in pod.status.conditions or []}
    return pod if conditions.get("Ready") == "True" else None


def agent_pod(core: client.CoreV1Api, name: str) -> client.V1Pod | None:
    """The agent's (app.kubernetes.io/name=<name>) one live pod on the real node."""
    pods = core.list_namespaced_pod(
        ISTIO_NS,
        label_selector=f"app.kubernetes.io/name={name}",
        field_selector=f"spec.nodeName={NODE_NAME}",
    ).items
    live = [p for p in pods if p.metadata is not None and not p.metadata.deletion_timestamp]
    return live[0] if len(live) == 1 else None


def agents(core: client.CoreV1Api, timeout: float = 180) -> tuple[client.V1Pod, client.V1Pod]:
    """istio-cni's and ztunnel's Ready pods on the real node."""
    cni = wait_for(lambda: ready(agent_pod(core, "istio-cni")), timeout, "istio-cni Ready")
    ztunnel = wait_for(lambda: ready(agent_pod(core, "ztunnel")), timeout, "ztunnel Ready")
    return cni, ztunnel


def ztunnel_count(pod_ip: str, metric: str, **labels: str) -> float:
    """Sum of a counter from ztunnel's own /metrics over the series whose labels match."""
    with urllib.request.urlopen(f"http://{pod_ip}:{ZTUNNEL_METRICS}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or m["name"] != metric:
            continue
        have = dict(_LABEL.findall(m["labels"]))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m["value"])
    return total


def app_container(image: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The sample app's container, from the node's own image store."""
    return {"name": "app", "image": image, "imagePullPolicy": "Never", **(extra or {})}


def app_pod(name: str, image: str, args: list[str], **spec: Any) -> dict[str, Any]:
    """A sample-app pod on the real node, labelled app=<name>."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "nodeName": NODE_NAME,
            "terminationGracePeriodSeconds": 1,
            "containers": [app_container(image, {"args": args})],
            **spec,
        },
    }


def serve(core: client.CoreV1Api, namespace: str, image: str, timeout: float = 120) -> Any:
    """The sample app's server pod and its Service `server` (port 80) in `namespace`;
    the pod once Ready."""
    pod = app_pod("server", image, ["serve"])
    pod["metadata"]["namespace"] = namespace
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "server", "namespace": namespace},
        "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    apply_objects(core.api_client, [pod, service])
    return wait_for(
        lambda: ready(core.read_namespaced_pod("server", namespace)), timeout, "server Ready"
    )


def get_server(
    core: client.CoreV1Api, namespace: str, name: str, image: str, args: list[str]
) -> str:
    """Run a sample-app client pod `name` that GETs the Service `server` of its namespace
    (`args` before the URL, e.g. ["-count", "3"]) to its end; its phase, a newline, its log."""
    url = f"http://server.{namespace}.svc.cluster.local/"
    pod = app_pod(name, image, ["get", *args, url], restartPolicy="Never")
    pod["metadata"]["namespace"] = namespace
    apply_objects(core.api_client, [pod])
    return run_to_end(core, namespace, name)


def run_to_end(core: client.CoreV1Api, namespace: str, name: str, timeout: float = 120) -> str:
    """Wait for a `restartPolicy: Never` pod to finish; its phase, and its log after a newline."""

    def finished() -> str | None:
        status = core.read_namespaced_pod(name, namespace).status
        phase = status.phase if status is not None else None
        return str(phase) if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, timeout, f"{namespace}/{name} finished")
    return f"{phase}\n{core.read_namespaced_pod_log(name, namespace)}"
