"""The kubectl flags every command that reads the cluster takes, in one place.

`--kubeconfig` and `--context` read as kubectl reads them, so that
`kubectl ambient ...` (the plugin, cli/main.py's kubectl_main) passes them
through unchanged.
"""

from __future__ import annotations

import argparse
import os

from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials


def add_kube_flags(parser: argparse.ArgumentParser) -> None:
    """Add --kubeconfig and --context to a command."""
    parser.add_argument(
        "--kubeconfig",
        metavar="FILE",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default: $KUBECONFIG, else in-cluster)",
    )
    parser.add_argument(
        "--context", default=None, help="the kubeconfig context to use (default: its current)"
    )


def kube_for(args: argparse.Namespace, field_manager: str | None = None) -> Kube:
    """A client for the cluster the command's flags name."""
    credentials = load_credentials(args.kubeconfig, context=args.context)
    if field_manager is None:
        return Kube(credentials)
    return Kube(credentials, field_manager=field_manager)
