"""What spec.waypoints.policy refuses of a Gateway and of its parameters."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec, WaypointPolicy
from ambient_operator.kube.resources import shown
from ambient_operator.render.waypoints.fields import meta_of, spec_of, str_map
from ambient_operator.render.waypoints.names import NOT_COPIED_ANNOTATIONS, Names
from ambient_operator.render.waypoints.parameters import Layer

_POLICY = "spec.waypoints.policy"


def image_prefixes(spec: AmbientMeshSpec) -> list[str]:
    """Where images set by parameters may come from."""
    policy = spec.waypoints.policy
    return list(policy.image_prefixes) if policy.image_prefixes is not None else [spec.images.hub]


def image_allowed(image: str, prefixes: Sequence[str]) -> bool:
    """Whether `image` is under one of `prefixes`, matched up to a '/', ':' or '@'.

    `docker.io/istio` must not admit `docker.io/istio-evil/proxyv2`.
    References are compared as written: `istio/proxyv2` is not under
    `docker.io/istio`.
    """
    for prefix in prefixes:
        if image == prefix or (prefix.endswith(("/", ":", "@")) and image.startswith(prefix)):
            return True
        if image.startswith(prefix) and image[len(prefix)] in "/:@":
            return True
    return False


def annotation_allowed(key: str, allowed: Sequence[str]) -> bool:
    """Whether an annotation key is an exact entry of `allowed`, or under a `prefix/*` one."""
    return any(
        key == entry or (entry.endswith("/*") and key.startswith(entry[:-1])) for entry in allowed
    )


def _layer_problem(spec: AmbientMeshSpec, layer: Layer) -> str | None:
    """Why the policy refuses what one parametersRef asks for, naming the policy field.

    Values are named only where they are the policy's own (a denied key).
    """
    policy = spec.waypoints.policy
    params, where = layer.parameters, layer.where
    if params.image is not None and params.image != spec.waypoints.image:
        prefixes = image_prefixes(spec)
        if not image_allowed(params.image, prefixes):
            return (
                f"{where} key image: not under an image prefix {_POLICY}.imagePrefixes allows "
                f"({', '.join(prefixes)})"
            )
    for index, toleration in enumerate(params.tolerations or []):
        if not toleration.key and not policy.allow_keyless_tolerations:
            return (
                f"{where} key tolerations[{index}]: a toleration without a key tolerates every "
                f"taint, and {_POLICY}.allowKeylessTolerations is false"
            )
        if toleration.key in policy.denied_node_keys:
            return (
                f"{where} key tolerations[{index}]: tolerates {toleration.key}, which "
                f"{_POLICY}.deniedNodeKeys denies"
            )
    for key in sorted(params.node_selector or {}):
        if key in policy.denied_node_keys:
            return f"{where} key nodeSelector: selects {key}, which {_POLICY}.deniedNodeKeys denies"
    return None


def _labels_allow(labels: Mapping[str, str], policy: WaypointPolicy) -> bool:
    return all(labels.get(k) == v for k, v in policy.service_account_labels.items())


def policy_problem(
    spec: AmbientMeshSpec,
    gateway: Mapping[str, Any],
    layers: Sequence[Layer | None],
    names: Names,
    foreign_service_account: Mapping[str, Any] | None,
) -> str | None:
    """Why spec.waypoints.policy refuses this Gateway, or None.

    `foreign_service_account` is the live account the service-account
    annotation names when it exists and is not this Gateway's own.
    """
    policy = spec.waypoints.policy
    if foreign_service_account is not None:
        labels = str_map(meta_of(foreign_service_account).get("labels"))
        if not _labels_allow(labels, policy):
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(policy.service_account_labels.items()))
            return (
                f"annotation {c.ANNOTATION_GATEWAY_SERVICE_ACCOUNT} names ServiceAccount "
                f"{names.service_account}, which exists and is not this Gateway's own; waypoint "
                f"pods run only as accounts labelled {wanted} "
                f"({_POLICY}.serviceAccountLabels)"
            )
    infra = str_map((spec_of(gateway).get("infrastructure") or {}).get("annotations"))
    for key in sorted(infra):
        if key in NOT_COPIED_ANNOTATIONS or annotation_allowed(key, policy.pod_annotations):
            continue
        return (
            f"spec.infrastructure.annotations {shown(key)} would be copied to the waypoint's "
            f"pods, and {_POLICY}.podAnnotations allows only {', '.join(policy.pod_annotations)}"
        )
    for layer in layers:
        if layer is not None and (problem := _layer_problem(spec, layer)):
            return problem
    return None
