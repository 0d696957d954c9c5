"""`ambient-operator import-values`: an AmbientMesh from Istio's Helm values files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ambient_operator.api import bundled
from ambient_operator.api.helm_values import RefusedValueError, import_values
from ambient_operator.api.v1alpha1 import Images

EXIT_REFUSED = 2
# Istio's charts have no field for the images only this project builds: said
# on top of the YAML, where it stays with the AmbientMesh it explains.
REGISTRY_NOTE = (
    "# spec.images.hub and tag name Istio's Linux images, as your values did. Istio\n"
    "# publishes no Windows agents and no redirection-wait image: "
    f"`{bundled.BUILD_COMMAND}`\n"
    f"# builds and pushes them (docs/images.md); set {bundled.REGISTRY_FIELD} to that registry\n"
    f"# (or the operator chart's value {bundled.CHART_REGISTRY_VALUE}, or pass --registry).\n"
)


def _read(path: Path | None, what: str) -> Any:
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise RefusedValueError(what, "(file)", f"cannot read {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RefusedValueError(what, "(file)", f"{path} is not YAML: {exc}") from exc
    # An empty file sets nothing, as for helm -f.
    return {} if data is None else data


def run(args: argparse.Namespace) -> int:
    """Print the AmbientMesh, or the first refusal's chart, path and reason on stderr (exit 2)."""
    if not (args.ztunnel or args.istio_cni or args.istiod):
        print(
            "ambient-operator import-values: give --ztunnel, --istio-cni or --istiod",
            file=sys.stderr,
        )
        return EXIT_REFUSED
    try:
        mesh = import_values(
            _read(args.ztunnel, "ztunnel"),
            _read(args.istio_cni, "istio-cni"),
            _read(args.istiod, "istiod"),
            args.namespace,
        )
    except RefusedValueError as exc:
        print(f"ambient-operator import-values: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if args.registry:
        try:
            Images.model_validate({"registry": args.registry})
        except ValidationError as exc:
            print(
                f"ambient-operator import-values: --registry {args.registry!r}: "
                f"{exc.errors()[0]['msg']}",
                file=sys.stderr,
            )
            return EXIT_REFUSED
        mesh.setdefault("spec", {}).setdefault("images", {})["registry"] = args.registry
    if args.adopt:
        # Consent by name: the releases these values came from are taken over
        # as they run (docs/migration.md).
        mesh.setdefault("spec", {})["adopt"] = {"helmReleases": list(dict.fromkeys(args.adopt))}
    if args.output == "json":
        sys.stdout.write(json.dumps(mesh, indent=2, sort_keys=True) + "\n")
    else:
        if not args.registry:
            sys.stdout.write(REGISTRY_NOTE)
        sys.stdout.write(yaml.safe_dump(mesh, sort_keys=False, default_flow_style=False))
    return 0


def add_parser(sub: Any) -> None:
    """Register the `import-values` subcommand on the CLI's subparsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "import-values",
        help="print the AmbientMesh that renders what Istio's ztunnel and istio-cni charts "
        "render with your values files",
        description="Read the values files of Istio's ztunnel and istio-cni charts (as "
        "`helm template --set profile=ambient -f FILE` does) and print an AmbientMesh named "
        "default. A value that cannot be carried over is refused: exit code 2, with its "
        "dotted path and the reason on stderr, and nothing on stdout. "
        "docs/coming-from-helm.md has every value and its field. The Windows agents and the "
        "redirection-wait image are not Istio's: they come from spec.images.registry "
        "(--registry), where `make images` pushes them.",
    )
    parser.add_argument("--ztunnel", type=Path, metavar="FILE", help="values of the ztunnel chart")
    parser.add_argument(
        "--istio-cni", type=Path, metavar="FILE", help="values of the istio-cni (cni) chart"
    )
    parser.add_argument(
        "--istiod",
        type=Path,
        metavar="FILE",
        help="values of the istiod chart: only what the agents must agree with is read "
        "(revision, trust and cluster domain, cluster name, network, namespace, trusted ztunnel)",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        default="istio-system",
        help="the namespace the charts were installed in (helm --namespace), where the "
        "agents and istiod run (default istio-system)",
    )
    parser.add_argument(
        "--adopt",
        action="append",
        metavar="RELEASE",
        default=[],
        help="a Helm release (in --namespace) for the AmbientMesh to take over as it runs, "
        "without restarting its agents: spec.adopt.helmReleases (repeat for each release; "
        "docs/migration.md)",
    )
    parser.add_argument(
        "--registry",
        metavar="HOST[:PORT]/PATH",
        help="where `make images REGISTRY=...` pushed this project's images (docs/images.md): "
        "spec.images.registry, the source of the Windows agents and the redirection-wait image. "
        "Istio's charts have no such value: their hub and tag stay Istio's, for the Linux "
        "agents. Without it the YAML says so on top",
    )
    parser.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    parser.set_defaults(func=run)
