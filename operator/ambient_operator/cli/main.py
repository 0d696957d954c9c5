"""`ambient-operator` command line: crd, render, run, waypoint, precheck, status, import-values,
completion."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ambient_operator.api import crdgen
from ambient_operator.api.v1alpha1 import Images
from ambient_operator.cli import completion as completion_command
from ambient_operator.cli import import_values as import_values_command
from ambient_operator.cli import precheck as precheck_command
from ambient_operator.cli import render as render_command
from ambient_operator.cli import status as status_command
from ambient_operator.cli import waypoint as waypoint_command
from ambient_operator.kube.credentials import CredentialsError

EXIT_USAGE = 2
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _cmd_crd(args: argparse.Namespace) -> int:
    files = crdgen.all_crds()
    if args.output is None:
        sys.stdout.write("---\n".join(crdgen.dump(obj) for obj in files.values()))
        return 0
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    for name, obj in files.items():
        (out / name).write_text(crdgen.dump(obj))
    return 0


def _env(name: str, default: str) -> str:
    return os.environ.get(f"AMBIENT_OPERATOR_{name}", default)


def _env_flag(name: str) -> bool:
    """A switch from the environment: off unless it says 1, true or yes."""
    return _env(name, "false").lower() in ("1", "true", "yes")


def _agents_namespaces(flags: list[str] | None) -> tuple[str, ...]:
    """The --agents-namespace flags, else the comma-separated environment variable."""
    given = flags if flags else _env("AGENTS_NAMESPACES", "").split(",")
    names = tuple(dict.fromkeys(name.strip() for name in given if name.strip()))
    for name in names:
        if len(name) > 63 or not _DNS_LABEL.match(name):
            raise ValueError(f"--agents-namespace {name!r} is not a namespace name")
    return names


def _cmd_run(args: argparse.Namespace) -> int:
    # kopf imports the `kubernetes` package whenever it can, only to recognise
    # its model classes, which this operator never hands it: 10 MiB more
    # resident beside the operator's own imports (77 MiB against 67, measured).
    # The image does not ship the package; a development virtualenv has it for
    # the tests, and must run the operator as the image does.
    sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]
    # Imported here: `crd` and `render` must work without kopf's start-up cost.
    from ambient_operator.app.kopf_glue import configure_logging
    from ambient_operator.app.operator import Operator
    from ambient_operator.app.options import Options
    from ambient_operator.runtime import memory
    from ambient_operator.webhook.config import WebhookOptions

    try:
        agents_namespaces = _agents_namespaces(args.agents_namespace)
    except ValueError as exc:
        print(f"ambient-operator run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        webhook = WebhookOptions(
            url=args.webhook_url or None,
            service=args.webhook_service or None,
            listen_address=args.webhook_listen_address,
            port=args.webhook_port,
            cert_dir=args.webhook_cert_dir or None,
            secret_namespace=args.webhook_namespace or None,
        )
    except ValueError as exc:
        print(f"ambient-operator run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        default_registry = _default_registry(args.default_registry)
    except ValueError as exc:
        print(f"ambient-operator run: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(args.log_format, args.log_level)
    options = Options(
        kubeconfig=args.kubeconfig,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        log_format=args.log_format,
        log_level=args.log_level,
        leader_election=args.leader_election,
        lease_namespace=args.lease_namespace,
        lease_seconds=args.lease_seconds,
        resync_seconds=args.resync_seconds,
        webhook=webhook,
        agents_namespaces=agents_namespaces,
        cni_rbac=args.cni_rbac,
        istio_cni_may_delete_pods=args.istio_cni_may_delete_pods,
        network_attachments=args.network_attachments,
        default_registry=default_registry,
    )
    memory.install()
    memory.limit_arenas()
    Operator(options).run()
    return 0


def _default_registry(value: str) -> str | None:
    """--default-registry checked as spec.images.registry is; None when empty."""
    if not value:
        return None
    try:
        Images.model_validate({"registry": value})
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"]
        raise ValueError(f"--default-registry {value!r}: {problem}") from None
    return value


def _add_run(sub: Any) -> None:
    run = sub.add_parser("run", help="run the operator against the current cluster")
    run.add_argument(
        "--kubeconfig",
        metavar="FILE",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, else in-cluster)",
    )
    run.add_argument(
        "--metrics-port",
        type=int,
        default=int(_env("METRICS_PORT", "9090")),
        help="Prometheus /metrics port, 0 to disable [AMBIENT_OPERATOR_METRICS_PORT]",
    )
    run.add_argument(
        "--health-port",
        type=int,
        default=int(_env("HEALTH_PORT", "8080")),
        help="liveness /healthz port, 0 to disable [AMBIENT_OPERATOR_HEALTH_PORT]",
    )
    run.add_argument(
        "--log-format",
        choices=["text", "json"],
        default=_env("LOG_FORMAT", "text"),
        help="[AMBIENT_OPERATOR_LOG_FORMAT]",
    )
    run.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=_env("LOG_LEVEL", "info"),
        help="[AMBIENT_OPERATOR_LOG_LEVEL]",
    )
    run.add_argument(
        "--leader-election",
        action=argparse.BooleanOptionalAction,
        default=_env_flag("LEADER_ELECTION"),
        help="elect one active replica with a Lease [AMBIENT_OPERATOR_LEADER_ELECTION]",
    )
    run.add_argument(
        "--lease-namespace",
        default=_env("LEASE_NAMESPACE", "istio-system"),
        help="namespace of the leader Lease [AMBIENT_OPERATOR_LEASE_NAMESPACE]",
    )
    run.add_argument(
        "--lease-seconds",
        type=float,
        default=float(_env("LEASE_SECONDS", "15")),
        help="lease duration [AMBIENT_OPERATOR_LEASE_SECONDS]",
    )
    run.add_argument(
        "--resync-seconds",
        type=float,
        default=float(_env("RESYNC_SECONDS", "300")),
        help="periodic full reconcile [AMBIENT_OPERATOR_RESYNC_SECONDS]",
    )
    run.add_argument(
        "--agents-namespace",
        action="append",
        metavar="NAMESPACE",
        help="a namespace the AmbientMesh's spec.namespace may name (repeat for several; "
        "default: any). Another is refused with NamespaceNotAllowed, and nothing is written. "
        "The chart sets it from agents.namespaces, where it grants the operator a Role "
        "[AMBIENT_OPERATOR_AGENTS_NAMESPACES, comma-separated]",
    )
    run.add_argument(
        "--cni-rbac",
        choices=["operator", "chart"],
        default=_env("CNI_RBAC", "operator"),
        help="who keeps the istio-cni agent's ClusterRole and binding: the operator (applies "
        "them, which needs every permission they grant) or the chart (ships them; the operator "
        "neither writes nor watches RBAC) [AMBIENT_OPERATOR_CNI_RBAC]",
    )
    run.add_argument(
        "--istio-cni-may-delete-pods",
        action=argparse.BooleanOptionalAction,
        default=_env_flag("ISTIO_CNI_MAY_DELETE_PODS"),
        help="with --cni-rbac=chart: the chart grants istio-cni delete on every pod, for "
        "spec.istioCni.repairMode Delete (it sets this with istioCniRepair.deletePods). Without "
        "it a mesh asking for Delete is refused (RepairModeNotGranted) and nothing is written. "
        "With --cni-rbac=operator the operator grants it when it holds it itself, which it "
        "asks the API server [AMBIENT_OPERATOR_ISTIO_CNI_MAY_DELETE_PODS]",
    )
    run.add_argument(
        "--network-attachments",
        action=argparse.BooleanOptionalAction,
        default=_env_flag("NETWORK_ATTACHMENTS"),
        help="watch and write Multus's NetworkAttachmentDefinition for spec.istioCni.provider "
        "multus (needs list, watch across the cluster, and get, create, patch, delete in "
        "namespace default); the chart sets it with multus.enabled, which grants them. Without "
        "it such a mesh is Degraded (MultusNotAvailable) [AMBIENT_OPERATOR_NETWORK_ATTACHMENTS]",
    )
    run.add_argument(
        "--default-registry",
        metavar="HOST[:PORT]/PATH",
        default=_env("DEFAULT_REGISTRY", ""),
        help="the registry `make images REGISTRY=...` pushed the bundled images to "
        "(docs/images.md): spec.images.registry of an AmbientMesh that sets none. The chart "
        "sets it from its value registry [AMBIENT_OPERATOR_DEFAULT_REGISTRY]",
    )
    _add_webhook_flags(run)
    run.set_defaults(func=_cmd_run)


def _add_webhook_flags(run: Any) -> None:
    hook = run.add_argument_group(
        "redirection-wait webhook",
        "served only when --webhook-url or --webhook-service says how the API server reaches it",
    )
    hook.add_argument(
        "--webhook-url",
        default=_env("WEBHOOK_URL", ""),
        help="https://host:port[/prefix] the API server calls, e.g. https://127.0.0.1:9443 "
        "[AMBIENT_OPERATOR_WEBHOOK_URL]",
    )
    hook.add_argument(
        "--webhook-service",
        default=_env("WEBHOOK_SERVICE", ""),
        metavar="NS/NAME[:PORT]",
        help="Service the API server calls (port default 443) [AMBIENT_OPERATOR_WEBHOOK_SERVICE]",
    )
    hook.add_argument(
        "--webhook-listen-address",
        default=_env("WEBHOOK_LISTEN_ADDRESS", "0.0.0.0"),
        help="address the HTTPS server binds [AMBIENT_OPERATOR_WEBHOOK_LISTEN_ADDRESS]",
    )
    hook.add_argument(
        "--webhook-port",
        type=int,
        default=int(_env("WEBHOOK_PORT", "9443")),
        help="port the HTTPS server binds [AMBIENT_OPERATOR_WEBHOOK_PORT]",
    )
    hook.add_argument(
        "--webhook-cert-dir",
        metavar="DIR",
        default=_env("WEBHOOK_CERT_DIR", ""),
        help="use tls.crt, tls.key and ca.crt from this folder (e.g. a cert-manager Secret) "
        "instead of the operator's own Secret [AMBIENT_OPERATOR_WEBHOOK_CERT_DIR]",
    )
    hook.add_argument(
        "--webhook-namespace",
        default=_env("WEBHOOK_NAMESPACE", ""),
        help="namespace of the Secret ambient-operator-webhook-tls (default: the AmbientMesh's "
        "spec.namespace) [AMBIENT_OPERATOR_WEBHOOK_NAMESPACE]",
    )


def build_parser(prog: str = "ambient-operator") -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Istio ambient data plane for clusters mixing Linux and Windows nodes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    crd = sub.add_parser("crd", help="print or write the CRDs generated from the API models")
    crd.add_argument("--output", "-o", metavar="DIR", help="write one file per CRD into DIR")
    crd.set_defaults(func=_cmd_crd)

    render_command.add_parser(sub)
    _add_run(sub)
    waypoint_command.add_parser(sub)
    precheck_command.add_parser(sub)
    status_command.add_parser(sub)
    import_values_command.add_parser(sub)
    completion_command.add_parser(sub, root=parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str = "ambient-operator") -> int:
    """Entry point of the console script."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except CredentialsError as exc:
        print(f"{prog} {args.command}: {exc}", file=sys.stderr)
        return 1


KUBECTL_PLUGIN = "kubectl ambient"


def kubectl_main() -> int:
    """`kubectl ambient ...`: kubectl finds `kubectl-ambient` on PATH and hands it the
    arguments after `ambient` unchanged, `--kubeconfig`, `--context` and `-n` among them."""
    return main(prog=KUBECTL_PLUGIN)


def kubectl_complete() -> int:
    """`kubectl_complete-ambient`: kubectl (1.26+) runs it to complete `kubectl ambient ...`
    with the words after `ambient`, the last being the one completed, and reads one
    candidate a line, then `:<directive>` as cobra writes it."""
    tables = completion_command.tables(build_parser(KUBECTL_PLUGIN), KUBECTL_PLUGIN)
    offered, directive = completion_command.candidates(tables, sys.argv[1:])
    sys.stdout.write("".join(f"{word}\n" for word in offered) + f":{directive}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
