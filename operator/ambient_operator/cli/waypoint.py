"""`ambient-operator waypoint`: apply, list and delete waypoints, as `istioctl waypoint` does.

`istioctl waypoint list` and `delete` keep only Gateways of istiod's class
(`istio-waypoint`); these cover both it and the operator's class, and say
whose each waypoint is and on which OS its pods may run (the operator pins
its waypoints to Linux; istiod's Deployments carry no OS pin).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import yaml
from pydantic import ValidationError

from ambient_operator.api import constants as c
from ambient_operator.api.conditions import GatewayCondition
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.writer import apply_requested, delete_requested
from ambient_operator.cli.kubeargs import add_kube_flags, kube_for
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.credentials import CredentialsError
from ambient_operator.kube.resources import KINDS

CLI_FIELD_MANAGER = "ambient-operator-cli"
DEFAULT_NAME = "waypoint"
MESH = KINDS[("ambientoperator.io/v1alpha1", "AmbientMesh")]
NAMESPACE = KINDS[("v1", "Namespace")]
GATEWAY = KINDS[(c.GATEWAY_API_VERSION, "Gateway")]
DEPLOYMENT = KINDS[("apps/v1", "Deployment")]
EXIT_FAILED = 1
# Who deploys the waypoints of each class (the WHOSE column).
OURS, ISTIOD = "ambient-operator", "istiod"
# `list -A`'s columns; without -A, all but NAMESPACE.
LIST_COLUMNS = ["NAMESPACE", "NAME", "REVISION", "TRAFFIC TYPE", "PROGRAMMED", "WHOSE", "OS"]


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
    return class_of(mesh)


def class_of(mesh: dict[str, Any] | None) -> str:
    """The GatewayClass an AmbientMesh names for its waypoints (the default without one)."""
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
    kube = kube_for(args, CLI_FIELD_MANAGER)
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


def _label(obj: dict[str, Any], key: str) -> str | None:
    value = ((obj.get("metadata") or {}).get("labels") or {}).get(key)
    return str(value) if value else None


def waypoint_rows(
    gateways: list[dict[str, Any]],
    deployments: dict[tuple[str, str], dict[str, Any]],
    our_class: str,
) -> list[dict[str, str]]:
    """One row per waypoint Gateway (ours and istiod's), by namespace and name.

    REVISION and TRAFFIC TYPE read as istioctl reads them (`istio.io/rev`,
    else `default`; `istio.io/waypoint-for`, else `none`); OS is the pin of
    the waypoint's Deployment: `linux`, `any` without one, `-` before it exists.
    """
    whose = {our_class: OURS, c.ISTIO_WAYPOINT_CLASS: ISTIOD}
    rows = []
    for gw in gateways:
        meta = gw.get("metadata") or {}
        owner = whose.get(str((gw.get("spec") or {}).get("gatewayClassName")))
        if owner is None:
            continue
        namespace, name = str(meta.get("namespace")), str(meta.get("name"))
        deployment = deployments.get((namespace, name))
        pod = (((deployment or {}).get("spec") or {}).get("template") or {}).get("spec") or {}
        pinned = (pod.get("nodeSelector") or {}).get(c.LABEL_OS)
        programmed = next(
            (
                str(cond.get("status"))
                for cond in (gw.get("status") or {}).get("conditions") or []
                if cond.get("type") == GatewayCondition.PROGRAMMED
            ),
            "False",
        )
        rows.append(
            {
                "NAMESPACE": namespace,
                "NAME": name,
                "REVISION": _label(gw, c.LABEL_REVISION) or "default",
                "TRAFFIC TYPE": _label(gw, c.LABEL_WAYPOINT_FOR) or "none",
                "PROGRAMMED": programmed,
                "WHOSE": owner,
                "OS": "-" if deployment is None else str(pinned or "any"),
            }
        )
    return sorted(rows, key=lambda r: (r["NAMESPACE"], r["NAME"]))


def table(rows: list[dict[str, str]], columns: list[str]) -> str:
    """Rows as a table with istioctl's spacing (columns padded, five spaces apart)."""
    widths = [max([len(col), *(len(r[col]) for r in rows)]) for col in columns]
    lines = [
        "     ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()
        for cells in [columns, *([r[col] for col in columns] for r in rows)]
    ]
    return "\n".join(lines) + "\n"


def _gateways(kube: Kube, namespace: str | None) -> list[dict[str, Any]]:
    return kube.list(GATEWAY, namespace)


def listed_rows(
    gateways: list[dict[str, Any]], deployments: list[dict[str, Any]], our_class: str
) -> list[dict[str, str]]:
    """`waypoint_rows` of listed Gateways and Deployments (`list`, and `status`'s section)."""
    by_key = {
        (str(d["metadata"].get("namespace")), str(d["metadata"]["name"])): d for d in deployments
    }
    return waypoint_rows(gateways, by_key, our_class)


def _cmd_list(args: argparse.Namespace) -> int:
    kube = kube_for(args)
    namespace = None if args.all_namespaces else args.namespace
    try:
        gateways = _gateways(kube, namespace)
        rows = listed_rows(gateways, kube.list(DEPLOYMENT, namespace), class_name(kube))
    except KubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if not rows:
        print("No waypoints found.")
        return 0
    columns = LIST_COLUMNS if args.all_namespaces else LIST_COLUMNS[1:]
    sys.stdout.write(table(rows, columns))
    return 0


def _cmd_delete(args: argparse.Namespace) -> int:
    kube = kube_for(args, CLI_FIELD_MANAGER)
    namespace = args.namespace
    if bool(args.names) == bool(args.all):
        print("error: name one or more waypoints, or give --all", file=sys.stderr)
        return EXIT_FAILED
    failed = False
    try:
        ours = class_name(kube)
        if args.all:
            # Only waypoints: a Gateway of another class is deleted only by name.
            waypoint_classes = {ours, c.ISTIO_WAYPOINT_CLASS}
            chosen = [
                gw
                for gw in _gateways(kube, namespace)
                if (gw.get("spec") or {}).get("gatewayClassName") in waypoint_classes
            ]
        else:
            chosen = []
            for name in args.names:
                found = kube.get(GATEWAY, name, namespace)
                if found is None:
                    print(f"waypoint {namespace}/{name} not found")
                    failed = True
                    continue
                chosen.append(found)
        for gw in sorted(chosen, key=lambda g: str(g["metadata"]["name"])):
            name = gw["metadata"]["name"]
            deleted = delete_requested(kube, gw)
            print(f"waypoint {namespace}/{name} {'deleted' if deleted else 'not found'}")
    except KubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_FAILED if failed else 0


def programmed_condition(gateway: dict[str, Any]) -> tuple[str, str, str]:
    """(status, reason, message) of a Gateway's Programmed condition; Unknown when absent."""
    for cond in (gateway.get("status") or {}).get("conditions") or []:
        if cond.get("type") == GatewayCondition.PROGRAMMED:
            return (
                str(cond.get("status", "Unknown")),
                str(cond.get("reason", "")),
                str(cond.get("message", "")),
            )
    return ("Unknown", "", "no Programmed condition yet")


def _status_line(gateway: dict[str, Any]) -> str:
    status, reason, message = programmed_condition(gateway)
    return f"{gateway['metadata']['name']}  {status}  Programmed  {reason or '-'}  {message}"


def _waypoints_to_watch(kube: Kube, namespace: str, name: str | None) -> list[dict[str, Any]]:
    if name is not None:
        found = kube.get(GATEWAY, name, namespace)
        return [] if found is None else [found]
    classes = {class_name(kube), c.ISTIO_WAYPOINT_CLASS}
    return sorted(
        (
            g
            for g in _gateways(kube, namespace)
            if (g.get("spec") or {}).get("gatewayClassName") in classes
        ),
        key=lambda g: str(g["metadata"]["name"]),
    )


def _cmd_status(args: argparse.Namespace) -> int:
    kube = kube_for(args)
    namespace = args.namespace
    try:
        gateways = _waypoints_to_watch(kube, namespace, args.name)
        if not gateways:
            print(
                f"waypoint {namespace}/{args.name} not found"
                if args.name
                else "No waypoints found."
            )
            return EXIT_FAILED if args.name else 0
        print("NAME  STATUS  TYPE  REASON  MESSAGE")
        shown = {}
        for gw in gateways:
            shown[gw["metadata"]["name"]] = _status_line(gw)
            print(shown[gw["metadata"]["name"]], flush=True)
        if not args.wait:
            return 0
        deadline = time.monotonic() + args.timeout
        while True:
            waiting = []
            for gw in gateways:
                name = gw["metadata"]["name"]
                live = kube.get(GATEWAY, name, namespace)
                if live is None:
                    print(f"{name}  deleted", flush=True)
                    return EXIT_FAILED
                line = _status_line(live)
                if line != shown[name]:
                    # One line per change, so a wait never hides why it waits.
                    shown[name] = line
                    print(line, flush=True)
                if not _programmed(live):
                    waiting.append(live)
            if not waiting:
                return 0
            if time.monotonic() > deadline:
                for live in waiting:
                    status, reason, message = programmed_condition(live)
                    print(
                        f"error: waypoint {namespace}/{live['metadata']['name']} not Programmed "
                        f"after {args.timeout:g}s: Programmed={status} {reason}: {message}",
                        file=sys.stderr,
                    )
                return EXIT_FAILED
            time.sleep(0.5)
    except KubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _cmd_generate(args: argparse.Namespace) -> int:
    try:
        klass = class_name(kube_for(args))
    except (CredentialsError, KubeError, OSError):  # no cluster: the default class
        klass = AmbientMeshSpec().waypoints.class_name
    gateway = waypoint_gateway(args.namespace, args.name, klass, args.waypoint_for)
    sys.stdout.write(yaml.safe_dump(gateway, sort_keys=False))
    return 0


def _namespace_flag(parser: Any) -> None:
    parser.add_argument("--namespace", "-n", default="default", help="namespace (default default)")


def _gateway_flags(parser: argparse.ArgumentParser) -> None:
    """--name and --for: what `apply` and `generate` put in the Gateway."""
    parser.add_argument(
        "--name", default=DEFAULT_NAME, help=f"Gateway name (default {DEFAULT_NAME})"
    )
    parser.add_argument(
        "--for",
        dest="waypoint_for",
        choices=c.WAYPOINT_FOR_VALUES,
        help=f"traffic the waypoint serves ({c.LABEL_WAYPOINT_FOR}; default service)",
    )


def add_parser(sub: Any) -> None:
    """Add `waypoint apply`, `list` and `delete` to the top-level subcommands."""
    waypoint = sub.add_parser("waypoint", help="manage waypoint Gateways of the operator's class")
    actions = waypoint.add_subparsers(dest="waypoint_command", required=True)
    apply = actions.add_parser(
        "apply", help="create or update a waypoint Gateway (listener mesh, 15008, HBONE)"
    )
    apply.add_argument("--namespace", "-n", required=True, help="namespace of the waypoint")
    _gateway_flags(apply)
    apply.add_argument(
        "--enroll-namespace",
        action="store_true",
        help=f"also label the namespace {c.LABEL_DATAPLANE_MODE}=ambient",
    )
    add_kube_flags(apply)
    apply.add_argument("--wait", action="store_true", help="wait until the Gateway is Programmed")
    apply.add_argument(
        "--timeout", type=float, default=120.0, help="seconds --wait waits (default 120)"
    )
    apply.set_defaults(func=_cmd_apply)

    listing = actions.add_parser(
        "list", help="list the waypoints of the operator's class and of istiod's (istio-waypoint)"
    )
    where = listing.add_mutually_exclusive_group()
    _namespace_flag(where)
    where.add_argument(
        "--all-namespaces", "-A", action="store_true", help="list waypoints in all namespaces"
    )
    add_kube_flags(listing)
    listing.set_defaults(func=_cmd_list)

    delete = actions.add_parser(
        "delete",
        help="delete waypoint Gateways by name, or every waypoint of the namespace with --all "
        "(what they own goes with them, by the garbage collector)",
    )
    delete.add_argument("names", nargs="*", metavar="NAME", help="Gateways to delete")
    delete.add_argument(
        "--all",
        action="store_true",
        help="every Gateway of the operator's class and of istio-waypoint in the namespace; "
        "a Gateway of another class is deleted only when named",
    )
    _namespace_flag(delete)
    add_kube_flags(delete)
    delete.set_defaults(func=_cmd_delete)

    status = actions.add_parser(
        "status",
        help="the Programmed condition of one waypoint or every waypoint of the namespace; "
        "with --wait, a line per change until all are Programmed",
    )
    status.add_argument("name", nargs="?", metavar="NAME", help="one waypoint (default: all)")
    _namespace_flag(status)
    status.add_argument("--wait", action="store_true", help="wait until Programmed")
    status.add_argument(
        "--timeout", type=float, default=60.0, help="seconds --wait waits (default 60)"
    )
    add_kube_flags(status)
    status.set_defaults(func=_cmd_status)

    generate = actions.add_parser(
        "generate", help="print the waypoint Gateway `apply` would write, as YAML"
    )
    _namespace_flag(generate)
    _gateway_flags(generate)
    add_kube_flags(generate)
    generate.set_defaults(func=_cmd_generate)
