"""The istiod facts a local cluster lacks: its Service, its Deployment, a DNS Service.

There is no real istiod here; the operator only reads these objects (the
Service ClusterIPs it renders for Windows, the CA_TRUSTED_NODE_ACCOUNTS it
checks), so their shape is all that matters.
"""

from __future__ import annotations

from typing import Any

from .manifests import apply_objects


def istiod_objects(namespace: str = "istio-system") -> list[dict[str, Any]]:
    """Namespace, istiod Service and Deployment (zero replicas), kube-dns Service."""
    trusted = f"{namespace}/ztunnel,{namespace}/ztunnel-windows"

    def service(ns: str, name: str, port: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"app": name}, "ports": [{"name": "main", "port": port}]},
        }

    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        service(namespace, "istiod", 15012),
        service("kube-system", "kube-dns", 53),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "istiod", "namespace": namespace},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": "istiod"}},
                "template": {
                    "metadata": {"labels": {"app": "istiod"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "discovery",
                                "image": "docker.io/istio/pilot:1.28.0",
                                "env": [{"name": "CA_TRUSTED_NODE_ACCOUNTS", "value": trusted}],
                            }
                        ]
                    },
                },
            },
        },
    ]


def install_istiod_facts(api_client: Any, namespace: str = "istio-system") -> None:
    """Apply :func:`istiod_objects` (idempotent: server-side apply)."""
    apply_objects(api_client, istiod_objects(namespace), field_manager="devcluster-istio")
