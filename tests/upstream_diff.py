"""Field-by-field comparison of our objects with Istio's, judged by the table of differences.

Shared by the tests that compare what the operator writes with what Istio's
own programs write or render: upstream's charts (test_upstream_conformance),
the Windows experiment (test_windows_reference) and the real istiod
(test_istiod). It shares no code with the operator's render, so it can judge
it.

Objects become comparable views that change their shape, never their
content: lists whose items have a key become maps by that key (containers
and env by name, ports by name, volumeMounts by mountPath); in a pod, each
volumeMount carries the volume it mounts (`.volume`), and volumes no
container mounts stay under `volumes[name]`; null, and an empty label or
annotation map, count as absent (the API server stores them so). The
comparison is a flat list of differences, and :func:`check_table` fails
unless that list is exactly the rows of one table in
tests/data/upstream-differences/ (see hack/gen_upstream_differences.py),
each side's value as the row states it. Where a value varies from run to
run, the row writes a placeholder of :data:`PLACEHOLDERS` in its place
(`<hash>`), and the rest of the value must match exactly.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
ABSENT = "(absent)"
KEYED_LISTS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "ports": "name",
    "volumeMounts": "mountPath",
}
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What a row may write for the part of a value that changes from run to run.
PLACEHOLDERS = {
    # A content hash, e.g. ambientoperator.io/desired-hash, which covers the namespace.
    "<hash>": "[0-9a-f]{8,64}",
}
_PLACEHOLDER = re.compile("|".join(re.escape(p) for p in PLACEHOLDERS))


@cache
def generator() -> ModuleType:
    """hack/gen_upstream_differences.py, which loads and checks the tables."""
    path = REPO / "hack" / "gen_upstream_differences.py"
    spec = importlib.util.spec_from_file_location("gen_upstream_differences", path)
    assert spec is not None and spec.loader is not None, f"{path} cannot be imported"
    module = importlib.util.module_from_spec(spec)
    # dataclasses look their module up by name while the class is made.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True, order=True)
class Difference:
    """One field that differs: where, and the value on each side as printed."""

    object: str
    field: str
    upstream: str
    ours: str


class Keyed(dict[str, Any]):
    """A list turned into a map by its items' key; its paths print as `[key]`."""


class _Missing:
    def __repr__(self) -> str:
        return ABSENT


MISSING = _Missing()


def pruned(value: Any) -> Any:
    """Nulls, and empty label and annotation maps, dropped; other empties mean something."""
    if isinstance(value, dict):
        out = {k: pruned(v) for k, v in value.items() if v is not None}
        return type(value)(
            {k: v for k, v in out.items() if not (k in ("labels", "annotations") and not v)}
        )
    if isinstance(value, list):
        return [pruned(v) for v in value]
    return value


def _keyed(items: Iterable[Mapping[str, Any]], key: str, where: str) -> Keyed:
    out = Keyed()
    for item in items:
        assert key in item, f"{where}: item without {key}: {item}"
        name = str(item[key])
        assert name not in out, f"{where}: {key} {name} appears twice"
        out[name] = {k: v for k, v in item.items() if k != key}
    return out


def key_lists(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        return type(value)(
            {
                k: _keyed([key_lists(i, where) for i in v], KEYED_LISTS[k], f"{where}.{k}")
                if k in KEYED_LISTS and isinstance(v, list)
                else key_lists(v, where)
                for k, v in value.items()
            }
        )
    if isinstance(value, list):
        return [key_lists(v, where) for v in value]
    return value


def pod_view(pod: dict[str, Any], where: str) -> dict[str, Any]:
    pod = dict(pod)
    volumes = {
        v["name"]: {k: x for k, x in v.items() if k != "name"} for v in pod.pop("volumes", [])
    }
    mounted: set[str] = set()
    for kind in ("initContainers", "containers"):
        containers = []
        for container in pod.get(kind, []):
            mounts = []
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{where}: mount of unknown volume {mount}"
                mounted.add(mount["name"])
                mounts.append({**mount, "volume": volumes[mount["name"]]})
            containers.append({**container, "volumeMounts": mounts})
        if kind in pod:
            pod[kind] = containers
    unmounted = {name: v for name, v in volumes.items() if name not in mounted}
    if unmounted:
        pod["volumes"] = Keyed(unmounted)
    return pod


def shown(value: Any) -> str:
    """A value as the comparison prints it: strings as they are, the rest as JSON."""
    if value is MISSING:
        return ABSENT
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)


def _child(path: str, key: str, keyed: bool) -> str:
    if keyed:
        return f"{path}[{key}]"
    if _PLAIN_KEY.match(key):
        return f"{path}.{key}" if path else key
    return f'{path}["{key}"]'


def _walk(obj: str, path: str, up: Any, ours: Any, out: list[Difference]) -> None:
    if up == ours and type(up) is type(ours):
        return
    if isinstance(up, dict) and isinstance(ours, dict) and type(up) is type(ours):
        for key in sorted(set(up) | set(ours)):
            _walk(
                obj,
                _child(path, key, isinstance(up, Keyed)),
                up.get(key, MISSING),
                ours.get(key, MISSING),
                out,
            )
        return
    out.append(Difference(obj, path, shown(up), shown(ours)))


def compare(
    upstream: Mapping[str, dict[str, Any]], ours: Mapping[str, dict[str, Any]]
) -> list[Difference]:
    """Every difference between two sets of views, objects missing on one side included."""
    out: list[Difference] = []
    for key in sorted(set(upstream) | set(ours)):
        if key not in ours or key not in upstream:
            up = "present" if key in upstream else ABSENT
            out.append(Difference(key, "(object)", up, "present" if key in ours else ABSENT))
            continue
        _walk(key, "", upstream[key], ours[key], out)
    return out


def pattern(listed: str) -> re.Pattern[str]:
    """A row's value as a pattern: itself, but for the placeholders in it."""
    parts = _PLACEHOLDER.split(listed)
    holes = [PLACEHOLDERS[p] for p in _PLACEHOLDER.findall(listed)]
    text = re.escape(parts[0]) + "".join(
        f"(?:{hole}){re.escape(part)}" for hole, part in zip(holes, parts[1:], strict=True)
    )
    return re.compile(text)


def matches(listed: str | None, found: str) -> bool:
    """Whether a value found is the one a row states; a row that states none matches none."""
    return listed is not None and pattern(listed).fullmatch(found) is not None


def _entry_yaml(d: Difference) -> str:
    row = {"object": d.object, "field": d.field, "upstream": d.upstream, "ours": d.ours}
    return yaml.safe_dump([{**row, "reason": "..."}], sort_keys=False, width=1 << 16)


def check_table(table: str, differences: Iterable[Difference]) -> None:
    """Fail unless the differences are exactly the rows of `table`.yaml, values included."""
    rows = generator().load_tables()[table]
    found = {(d.object, d.field): d for d in differences}
    listed = {(e.object, e.field): e for e in rows}
    unlisted = [found[k] for k in sorted(set(found) - set(listed))]
    gone = [listed[k] for k in sorted(set(listed) - set(found))]
    wrong = [
        (listed[k], found[k])
        for k in sorted(set(found) & set(listed))
        if not matches(listed[k].upstream, found[k].upstream)
        or not matches(listed[k].ours, found[k].ours)
    ]
    report: list[str] = []
    if unlisted:
        report.append(f"{len(unlisted)} differences not in {table}.yaml (fix ours, or list them):")
        report += [_entry_yaml(d) for d in unlisted]
    if gone:
        report.append(f"{len(gone)} rows of {table}.yaml that no longer differ (remove them):")
        report += [f"- {e.object} {e.field}" for e in gone]
    if wrong:
        report.append(f"{len(wrong)} rows of {table}.yaml whose values are not what differs now:")
        report += [
            f"- {e.object} {e.field}: listed {e.upstream!r} / {e.ours!r}, "
            f"found {d.upstream!r} / {d.ours!r}"
            for e, d in wrong
        ]
    assert not report, "\n".join(report)
