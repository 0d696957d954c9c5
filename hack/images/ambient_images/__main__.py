"""`python -m ambient_images`: build the bundled images, and push them (make images)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ambient_images import bases, builds, recipes
from ambient_images.registry import Reference, is_loopback, push_layout
from ambient_images.sources import SourceRefusedError


def store() -> Path:
    """The per-user cache the upstream programs share (hack/build-binaries.sh's)."""
    root = os.environ.get("AMBIENT_BIN_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ambient-operator"
    )
    return Path(root) / "images"


def push(out: Path, names: list[str], registry: str) -> int:
    """Push built layouts (as images.json records them) under `<registry>/<name>:<tag>`."""
    record = recipes.read_record(out)
    missing = [n for n in names if n not in record]
    if missing:
        print(f"images: not built yet: {', '.join(missing)} (run make images)", file=sys.stderr)
        return 2
    prefix = registry.rstrip("/")
    for name in names:
        entry = record[name]
        target = Reference.parse(f"{prefix}/{name}:{entry['tag']}")
        if entry["standIn"] and not is_loopback(target.host):
            print(
                f"images: not pushing {name}: it is built on stand-in bases "
                f"({bases.ENV_MODE}={bases.STAND_IN}), which only a registry on loopback "
                "may receive; build with the pinned bases to ship it",
                file=sys.stderr,
            )
            return 4
        digest = push_layout(out / name, target)
        print(f"pushed {target}@{digest}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Build the images asked for (all by default) into --out; push them with --registry.

    `push` pushes what was built, without building.
    """
    parser = argparse.ArgumentParser(prog="make images", description=__doc__)
    parser.add_argument("command", nargs="?", choices=("build", "push"), default="build")
    parser.add_argument("--out", type=Path, default=recipes.REPO / ".cache" / "images")
    parser.add_argument("--only", default="", help="comma-separated image names")
    parser.add_argument("--registry", default="", help="host[:port]/prefix to push to")
    parser.add_argument(
        "--longest-first",
        action="store_true",
        help="build the slowest images first (make test, which builds them beside other work)",
    )
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(recipes.RECIPES)
    unknown = sorted(set(names) - set(recipes.RECIPES))
    if unknown:
        parser.error(f"unknown image(s) {', '.join(unknown)}; known: {', '.join(recipes.RECIPES)}")
    if args.longest_first:
        # RECIPES runs quick to slow; the Rust builds, which need no Go build
        # cache, then start while hack/build-binaries.sh fills it for the Go ones.
        names.sort(key=list(recipes.RECIPES).index, reverse=True)
    if args.command == "push":
        if not args.registry:
            parser.error("push needs --registry host[:port]/prefix")
        return push(args.out, names, args.registry)
    builds.ensure_packages()
    args.out.mkdir(parents=True, exist_ok=True)
    ctx = recipes.context(store())
    done = []
    try:
        for name in names:
            builds.log(f"building {name}")
            built = recipes.RECIPES[name](ctx, args.out)
            done.append(built)
            builds.log(f"built {recipes.describe(built)}")
    except SourceRefusedError as err:
        print(f"images: refused: {err}", file=sys.stderr)
        return 3
    finally:
        if done:
            recipes.record(args.out, done)
    for built in done:
        print(recipes.describe(built))
    if args.registry:
        return push(args.out, names, args.registry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
