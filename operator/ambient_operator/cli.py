"""`ambient-operator` command line: crd, render, run."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ambient_operator.api import crdgen

EXIT_USAGE = 2


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="ambient-operator",
        description="Istio ambient data plane for clusters mixing Linux and Windows nodes.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    crd = sub.add_parser("crd", help="print or write the CRDs generated from the API models")
    crd.add_argument("--output", "-o", metavar="DIR", help="write one file per CRD into DIR")
    crd.set_defaults(func=_cmd_crd)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
