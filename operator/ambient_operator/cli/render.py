"""`ambient-operator render`: the renderer on files, for review and GitOps.

Bad input ends with exit status 2 and one line that names the file and the
field, never a traceback: the user fixes YAML, not Python.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMesh, AmbientMeshSpec
from ambient_operator.cluster.facts import ClusterFacts, NodeFacts
from ambient_operator.cluster.platform import choice_warning, detect_platform, effective_platform
from ambient_operator.render import output
from ambient_operator.render.dataplane import render_dataplane

EXIT_BAD_INPUT = 2
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_CAMEL_WORD = re.compile(r"^([a-z]+[A-Z][A-Za-z0-9]*)\b")
_KUBE_VERSION = re.compile(r"^v?(1\.[0-9]{1,3})(?:\.[0-9]+)?$")
_MESH_API_VERSION = f"{c.API_GROUP}/{c.API_VERSION}"


class InputError(Exception):
    """Input the renderer cannot use; `str()` is the one line to show."""

    def __init__(self, source: str, field: str | None, message: str) -> None:
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {message}")


def _path(parts: Sequence[int | str]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif _IDENTIFIER.match(part):
            text += f".{part}" if text else part
        else:
            text += f'["{part}"]'
    return text


def pydantic_location(error: ValidationError) -> tuple[str, str]:
    """(dotted camelCase path, message) of the first error, e.g. `spec.ztunnel.rollout.maxSurge`."""
    first = error.errors()[0]
    loc: list[int | str] = list(first["loc"])
    message = str(first["msg"]).removeprefix("Value error, ")
    if loc and loc[-1] == "[key]":
        loc.pop()
        message = f"invalid key: {message}"
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    elif first["type"] != "value_error" and "input" in first:
        message = f"{message} (got {first['input']!r})"
    named = _CAMEL_WORD.match(message)
    if first["type"] == "value_error" and named and loc:
        # A rule across fields of one object (rollout, say) is reported on
        # the object; name the field the message starts with instead.
        loc.append(named.group(1))
    if not loc and ": " in message:
        field, _, rest = message.partition(": ")
        return field, rest
    return _path(loc), message


def _read(path: Path) -> list[Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise InputError(str(path), None, f"cannot read: {reason}") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise InputError(str(path), where, f"invalid YAML: {problem}") from None


def load_mesh(path: Path) -> AmbientMeshSpec:
    """The spec of the one AmbientMesh in a YAML file, defaults applied."""
    docs = _read(path)
    if len(docs) != 1:
        raise InputError(str(path), None, f"expected one AmbientMesh document, found {len(docs)}")
    doc = docs[0]
    if not isinstance(doc, Mapping):
        raise InputError(str(path), None, f"expected a mapping, got {type(doc).__name__}")
    if doc.get("kind") != c.KIND:
        raise InputError(str(path), "kind", f"expected {c.KIND}, got {doc.get('kind')!r}")
    if doc.get("apiVersion") != _MESH_API_VERSION:
        got = doc.get("apiVersion")
        raise InputError(str(path), "apiVersion", f"expected {_MESH_API_VERSION}, got {got!r}")
    try:
        return AmbientMesh.model_validate(doc).spec
    except ValidationError as err:
        field, message = pydantic_location(err)
        raise InputError(str(path), field, message) from None


def _items(doc: Any, where: str, source: str) -> list[tuple[str, Any]]:
    if not isinstance(doc, Mapping):
        raise InputError(source, where or None, f"expected a mapping, got {type(doc).__name__}")
    prefix = f"{where}." if where else ""
    kind = doc.get("kind")
    if kind in ("List", "NodeList"):
        items = doc.get("items")
        if items is None:
            return []
        if not isinstance(items, list):
            raise InputError(source, f"{prefix}items", "expected a list")
        return [(f"{prefix}items[{i}]", item) for i, item in enumerate(items)]
    if kind == "Node":
        return [(where, doc)]
    raise InputError(source, f"{prefix}kind", f"expected Node, NodeList or List, got {kind!r}")


def load_nodes(path: Path) -> list[NodeFacts]:
    """Node facts from `kubectl get nodes -o yaml` output or multi-document YAML of Nodes."""
    docs = _read(path)
    source = str(path)
    entries: list[tuple[str, Any]] = []
    for index, doc in enumerate(docs):
        entries.extend(_items(doc, f"documents[{index}]" if len(docs) > 1 else "", source))
    nodes: list[NodeFacts] = []
    seen: set[str] = set()
    for where, item in entries:
        prefix = f"{where}." if where else ""
        if not isinstance(item, Mapping):
            raise InputError(source, where, f"expected a Node, got {type(item).__name__}")
        if item.get("kind", "Node") != "Node":
            raise InputError(source, f"{prefix}kind", f"expected Node, got {item.get('kind')!r}")
        try:
            node = NodeFacts.from_node(item)
        except ValueError as err:
            field, _, message = str(err).partition(": ")
            raise InputError(source, f"{prefix}{field}", message) from None
        if node.name in seen:
            raise InputError(source, f"{prefix}metadata.name", f"duplicate node {node.name!r}")
        seen.add(node.name)
        nodes.append(node)
    return nodes


def load_node_objects(path: Path) -> list[Mapping[str, Any]]:
    """The Nodes of a file as they are, for what NodeFacts does not keep (the platform's marks).

    Call load_nodes first: it reports what is malformed.
    """
    docs = _read(path)
    entries: list[tuple[str, Any]] = []
    for index, doc in enumerate(docs):
        entries.extend(_items(doc, f"documents[{index}]" if len(docs) > 1 else "", str(path)))
    return [item for _, item in entries if isinstance(item, Mapping)]


def _ip(option: str, text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        raise InputError(option, None, f"{text!r} is not an IP address") from None


def _kube_version(text: str) -> str:
    match = _KUBE_VERSION.match(text)
    if not match:
        raise InputError("--kube-version", None, f"expected MAJOR.MINOR like 1.34, got {text!r}")
    return match.group(1)


def add_parser(sub: Any) -> None:
    """Register the `render` subcommand on the CLI's subparsers."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "render",
        help="print the data-plane objects for an AmbientMesh and a node inventory",
        description="Render the ztunnel and istio-cni objects the operator would apply. "
        "Objects go to stdout; nodes that get no agent, and other warnings, to stderr.",
    )
    parser.add_argument(
        "--mesh",
        type=Path,
        metavar="FILE",
        help="AmbientMesh YAML (default: an AmbientMesh with every default)",
    )
    parser.add_argument(
        "--nodes",
        type=Path,
        metavar="FILE",
        help="Nodes: `kubectl get nodes -o yaml` output or multi-document YAML",
    )
    parser.add_argument(
        "--kube-version",
        default="1.37",
        metavar="X.Y",
        help="Kubernetes version of the target cluster (default 1.37)",
    )
    parser.add_argument(
        "--istiod-ip", metavar="IP", help="ClusterIP of the istiod Service, for Windows agents"
    )
    parser.add_argument(
        "--dns-ip", metavar="IP", help="ClusterIP of the cluster DNS Service, for Windows nodes"
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=("yaml", "json"),
        default="yaml",
        help="output format (default yaml)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Render from files; exit status 0, or 2 on bad input."""
    try:
        spec = load_mesh(args.mesh) if args.mesh is not None else AmbientMeshSpec()
        nodes = load_nodes(args.nodes) if args.nodes is not None else []
        objects = load_node_objects(args.nodes) if args.nodes is not None else []
        platform = effective_platform(spec.platform, detect_platform(objects))
        facts = ClusterFacts(
            nodes=tuple(nodes),
            istiod_ip=_ip("--istiod-ip", args.istiod_ip),
            dns_ip=_ip("--dns-ip", args.dns_ip),
            kube_version=_kube_version(args.kube_version),
            platform=platform.name,
            platform_warning=choice_warning(platform),
        )
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    result = render_dataplane(spec, facts)
    dump = output.to_json if args.output == "json" else output.to_yaml
    sys.stdout.write(dump(result.objects))
    for verdict in result.unsupported():
        print(f"warning: node {verdict.node}: {verdict.reason}: {verdict.message}", file=sys.stderr)
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
