"""The objects of one waypoint, and our GatewayClass, from decisions made before.

Names, listeners, settings and scaling come in decided; what is decided here
is only what the objects say about themselves and about istiod: labels, the
proxy's identity and how it reaches istiod.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.render.placement import pod_os
from ambient_operator.render.templating import render_object
from ambient_operator.render.values import linux_istiod
from ambient_operator.render.waypoints.fields import meta_of, spec_of, str_map
from ambient_operator.render.waypoints.listeners import ListenerCheck, service_ports
from ambient_operator.render.waypoints.names import COMPONENT, NOT_COPIED_ANNOTATIONS, Names
from ambient_operator.render.waypoints.settings import Scaling, Settings

# Gateway API allows 64 characters here.
CLASS_DESCRIPTION = "Istio ambient waypoints on Linux nodes, by ambient-operator"
# Envoy and the Go agent name log levels differently from the AmbientMesh.
_PROXY_LEVELS = {
    "trace": "trace",
    "debug": "debug",
    "info": "info",
    "warn": "warning",
    "error": "error",
}
_AGENT_LEVELS = {
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "warn": "warn",
    "error": "error",
}


def infrastructure_labels(spec: AmbientMeshSpec, gateway: Mapping[str, Any]) -> dict[str, str]:
    """The labels a Gateway's objects get from it, the network label as istiod decides it.

    istiod (its deployment controller's setLabelOverrides) labels a
    waypoint's objects with its global.network unless the Gateway's own labels
    name a network; it copies the Gateway's own labels only when the Gateway
    has no spec.infrastructure.labels. We copy no other own label.
    """
    infra = spec_of(gateway).get("infrastructure") or {}
    labels = str_map(infra.get("labels"))
    own = str_map(meta_of(gateway).get("labels")).get(c.LABEL_NETWORK)
    if own is None:
        if spec.network:
            labels[c.LABEL_NETWORK] = spec.network
    elif infra.get("labels") is None:
        labels[c.LABEL_NETWORK] = own
    return labels


def waypoint_objects(
    spec: AmbientMeshSpec,
    gateway: Mapping[str, Any],
    class_name: str,
    names: Names,
    listeners: Sequence[ListenerCheck],
    settings: Settings,
    waypoint: str | None,
    *,
    own_service_account: bool,
    scaling: Scaling,
) -> tuple[dict[str, Any], ...]:
    """The objects of one accepted Gateway's waypoint, in the order they are written.

    Its ServiceAccount (unless it runs as a borrowed one), Deployment and
    Service, then the autoscaler and the disruption budget its parameters ask for.
    """
    meta = meta_of(gateway)
    namespace = str(meta.get("namespace", ""))
    gateway_name = str(meta.get("name", ""))
    infra = spec_of(gateway).get("infrastructure") or {}
    infra_labels = infrastructure_labels(spec, gateway)
    infra_annotations = {
        k: v
        for k, v in str_map(infra.get("annotations")).items()
        if k not in NOT_COPIED_ANNOTATIONS
    }
    # Ours are applied last: a user's infrastructure label cannot unpin or
    # unselect the waypoint.
    reserved = {
        c.LABEL_NAME: names.deployment,
        c.LABEL_COMPONENT: COMPONENT,
        c.LABEL_PART_OF: c.PART_OF,
        c.LABEL_GATEWAY_NAME: gateway_name,
        c.LABEL_GATEWAY_CLASS_NAME: class_name,
        # istiod's deployment controller puts this on every waypoint object it
        # writes; ours are waypoints too and must be read as such.
        c.LABEL_GATEWAY_MANAGED: c.GATEWAY_MANAGED_MESH,
    }
    if waypoint is not None:
        reserved[c.LABEL_WAYPOINT_FOR] = waypoint
    labels = {**infra_labels, **reserved}
    pod_labels = {
        **infra_labels,
        **reserved,
        c.LABEL_MANAGED_BY: c.MANAGED_BY,
        "sidecar.istio.io/inject": "false",
        c.LABEL_DATAPLANE_MODE: "none",
        "service.istio.io/canonical-name": names.deployment,
        "service.istio.io/canonical-revision": "latest",
    }
    pod_annotations = {
        **infra_annotations,
        "istio.io/rev": spec.istiod.revision or "default",
        "prometheus.io/path": "/stats/prometheus",
        "prometheus.io/port": str(c.PORT_METRICS),
        "prometheus.io/scrape": "true",
    }
    common = {
        "names": names,
        "namespace": namespace,
        "labels": labels,
        "annotations": infra_annotations,
    }
    selector = {c.LABEL_GATEWAY_NAME: gateway_name}
    istiod = linux_istiod(spec)
    objects: list[dict[str, Any]] = []
    if own_service_account:
        objects.append(render_object("waypoint-serviceaccount.yaml.j2", **common))
    objects.append(
        render_object(
            "waypoint-deployment.yaml.j2",
            **common,
            # The autoscaler's to set: a count we applied would undo its every change.
            replicas=None if scaling.autoscaler is not None else settings.replicas,
            selector=selector,
            pod_labels=pod_labels,
            pod_annotations=pod_annotations,
            os=pod_os(settings.node_selector),
            node_selector=settings.node_selector,
            tolerations=settings.tolerations,
            image=settings.image,
            resources=settings.resources,
            cluster_domain=spec.cluster_domain,
            trust_domain=spec.trust_domain,
            proxy_log_level=_PROXY_LEVELS[spec.log_level],
            agent_log_level=_AGENT_LEVELS[spec.log_level],
            # As istiod's template: the chart's global.imagePullSecrets and
            # imagePullPolicy, the cluster ID, and the network the labels name.
            pull_secrets=[{"name": name} for name in spec.images.pull_secrets or []],
            pull_policy=spec.images.pull_policy,
            cluster_id=spec.multi_cluster.cluster_name or c.DEFAULT_CLUSTER_ID,
            network=infra_labels.get(c.LABEL_NETWORK) or spec.network,
            # Pods resolve istiod's Service as the Linux agents do (kube-dns);
            # caAddress and xdsAddress each beat address, which beats the Service.
            ca_address=istiod.ca_address,
            proxy_config=json.dumps(
                {"discoveryAddress": istiod.xds_address}, separators=(",", ":")
            ),
            owner=f"kubernetes://apis/apps/v1/namespaces/{namespace}/deployments/"
            f"{names.deployment}",
            ports={
                "metrics": c.PORT_METRICS,
                "status": c.PORT_READINESS,
                "envoy_stats": c.PORT_ENVOY_STATS,
            },
        )
    )
    objects.append(
        render_object(
            "waypoint-service.yaml.j2",
            **common,
            # istiod asks ztunnel to prefer waypoint endpoints close to the
            # client; the user's own infrastructure annotation may override it.
            service_annotations={
                "networking.istio.io/traffic-distribution": "PreferClose",
                **infra_annotations,
            },
            selector=selector,
            ports=service_ports(listeners),
        )
    )
    if scaling.autoscaler is not None:
        target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": names.deployment}
        objects.append(
            render_object(
                "waypoint-autoscaler.yaml.j2",
                **common,
                spec={**scaling.autoscaler, "scaleTargetRef": target},
            )
        )
    if scaling.budget is not None:
        objects.append(
            render_object(
                "waypoint-disruption-budget.yaml.j2",
                **common,
                spec={**scaling.budget, "selector": {"matchLabels": selector}},
            )
        )
    return tuple(objects)


def render_gateway_class(spec: AmbientMeshSpec) -> dict[str, Any]:
    """The GatewayClass this operator keeps for its waypoints."""
    return render_object(
        "gatewayclass.yaml.j2",
        name=spec.waypoints.class_name,
        controller_name=spec.waypoints.controller_name,
        labels={c.LABEL_PART_OF: c.PART_OF, c.LABEL_COMPONENT: COMPONENT},
        description=CLASS_DESCRIPTION,
    )
