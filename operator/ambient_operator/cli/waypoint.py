"""`ambient-operator waypoint apply`: a Gateway of our class, as `istioctl waypoint apply` makes."""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import GatewayCondition
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.writer import apply_requested
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.resources import KINDS

CLI_FIELD_MANAGER = "ambient-operator-cli"
DEFAULT_NAME = "waypoint"
MESH = KINDS[("ambientoperator.io/v1alpha1", "AmbientMesh")]
NAMESPACE = KINDS[("v1", "Namespace")]
GATEWAY = KINDS[(c.GATEWAY_API_VERSION, "Gateway")]
EXIT_FAILED = 1


def waypoint_gateway(
    namespace: str, name: str, class_name: str, waypoint_for: str | None
) -> dict[str, Any]:
    """The Gateway `waypoint apply` writes: one HBONE listener on 15008."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if waypoint_for:
        meta["labels"] = {c.LABEL_WAYPOINT_FOR: waypoint_for}
    return {
        "apiVersion": c.GATEWAY_API_VERSION,
        "kind": "Gateway",
        "metadata": meta,
        "spec": {
            "gatewayClassName": class_name,
            "listeners": [{"name": "mesh", "port": c.PORT_HBONE, "protocol": c.PROTOCOL_HBONE}],
        },
    }


def class_name(kube: Kube) -> str:
    """Our GatewayClass name, from the AmbientMesh when it can be read."""
    try:
        mesh = kube.get(MESH, c.MESH_NAME)
    except KubeError:
        mesh = None
    try:
        spec = AmbientMeshSpec.model_validate((mesh or {}).get("spec") or {})
    except ValidationError:
        spec = AmbientMeshSpec()
    return spec.waypoints.class_name


def _programmed(gateway: dict[str, Any] | None) -> bool:
    generation = ((gateway or {}).get("metadata") or {}).get("generation")
    return any(
        cond.get("type") == GatewayCondition.PROGRAMMED
        and cond.get("status") == "True"
        and cond.get("observedGeneration") == generation
        for cond in ((gateway or {}).get("status") or {}).get("conditions") or []
    )


def _cmd_apply(args: argparse.Namespace) -> int:
    kube = Kube(load_credentials(args.kubeconfig), field_manager=CLI_FIELD_MANAGER)
    namespace, name = args.namespace, args.name
    try:
        if kube.get(NAMESPACE, namespace) is None:
            print(f"error: namespace {namespace} not found", file=sys.stderr)
            return EXIT_FAILED
        gateway = waypoint_gateway(namespace, name, class_name(kube), args.waypoint_for)
        apply_requested(kube, gateway)
        print(f"waypoint {namespace}/{name} applied (class {gateway['spec']['gatewayClassName']})")
        if args.enroll_namespace:
            apply_requested(
                kube,
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {"name": namespace, "labels": {c.LABEL_DATAPLANE_MODE: "ambient"}},
                },
            )
            print(f"namespace {namespace} labelled {c.LABEL_DATAPLANE_MODE}=ambient")
        if args.wait:
            deadline = time.monotonic() + args.timeout
            while not _programmed(kube.get(GATEWAY, name, namespace)):
                if time.monotonic() > deadline:
                    print(
                        f"error: waypoint {namespace}/{name} not Programmed after {args.timeout}s",
                        file=sys.stderr,
                    )
                    return EXIT_FAILED
                time.sleep(0.5)
            print(f"waypoint {namespace}/{name} is Programmed")
    except KubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def add_parser(sub: Any) -> None:
    """Add `waypoint apply` to the top-level subcommands."""
    waypoint = sub.add_parser("waypoint", help="manage waypoint Gateways of the operator's class")
    actions = waypoint.add_subparsers(dest="waypoint_command", required=True)
    apply = actions.add_parser(
        "apply", help="create or update a waypoint Gateway (listener mesh, 15008, HBONE)"
    )
    apply.add_argument("--namespace", "-n", required=True, help="namespace of the waypoint")
    apply.add_argument(
        "--name", default=DEFAULT_NAME, help=f"Gateway name (default {DEFAULT_NAME})"
    )
    apply.add_argument(
        "--enroll-namespace",
        action="store_true",
        help=f"also label the namespace {c.LABEL_DATAPLANE_MODE}=ambient",
    )
    apply.add_argument(
        "--for",
        dest="waypoint_for",
        choices=c.WAYPOINT_FOR_VALUES,
        help=f"traffic the waypoint serves ({c.LABEL_WAYPOINT_FOR}; default service)",
    )
    apply.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, else in-cluster)",
    )
    apply.add_argument("--wait", action="store_true", help="wait until the Gateway is Programmed")
    apply.add_argument(
        "--timeout", type=float, default=120.0, help="seconds --wait waits (default 120)"
    )
    apply.set_defaults(func=_cmd_apply)
