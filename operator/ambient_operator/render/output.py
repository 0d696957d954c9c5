"""Text forms of rendered objects: multi-document YAML and a JSON List."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    """Block style, key order kept, multi-line strings as literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Iterable[dict[str, Any]]) -> str:
    """Objects as multi-document YAML, each document starting with `---`."""
    return yaml.dump_all(
        list(objects),
        Dumper=_Dumper,
        sort_keys=False,
        explicit_start=True,
        default_flow_style=False,
        # Never fold long strings: the text should diff line by line.
        width=1 << 16,
        allow_unicode=True,
    )


def to_json(objects: Iterable[dict[str, Any]]) -> str:
    """Objects as one indented JSON `List`, as `kubectl get -o json` prints several."""
    doc = {"apiVersion": "v1", "kind": "List", "metadata": {}, "items": list(objects)}
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"
