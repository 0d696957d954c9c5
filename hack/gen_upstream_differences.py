"""Write docs/upstream-differences.md from tests/data/upstream-differences/*.yaml.

.venv/bin/python hack/gen_upstream_differences.py          # rewrite the page
.venv/bin/python hack/gen_upstream_differences.py --check  # exit 1 when it would change

Each YAML file there is one table: a list of entries with `object`, `field`,
`upstream`, `ours` and `reason` (required), and `source` (optional). Every row
says what each side has, so no test accepts any value at a listed field. The
tests that compare our objects with Istio's own read the same files through
`load_tables`, so the page and the tests cannot disagree about the rows.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "tests" / "data" / "upstream-differences"
PAGE = ROOT / "docs" / "upstream-differences.md"
GO_MOD = ROOT / "hack" / "cluster" / "istio" / "go.mod"
CHARTS_VERSION = ROOT / ".cache" / "istio" / "charts" / "VERSION"

REQUIRED = ("object", "field", "upstream", "ours", "reason")
OPTIONAL = ("source",)
# A reason has to explain; these only admit that nobody knows.
NON_REASONS = {"unknown", "tbd", "todo", "?", "n/a", "none"}
# Headings of the tables we know of; any other file gets its name as heading.
TITLES = {
    "linux": "Linux data plane",
    "windows": "Windows data plane",
    "waypoint": "Waypoints",
    "platforms": "Linux data plane per platform",
}
# What each table compares with, and which test holds it to the table.
JUDGES = {
    "linux": "Upstream's `ztunnel` and `istio-cni` charts rendered by the real `helm` "
    "(`--set profile=ambient`), against our render of the sample inventory: "
    "`tests/test_upstream_conformance.py`.",
    "platforms": "Upstream's charts with each platform profile (`--set global.platform=<p>`), "
    "against our render for `spec.platform: <p>`; only what differs beyond the Linux table "
    "(objects prefixed `<p>: `): `tests/test_upstream_conformance.py`.",
    "windows": "What the `experimental-windows-ambient` branches of istio/istio and "
    "istio/ztunnel read (the Source column names the file), against our Windows render: "
    "`tests/test_windows_reference.py`.",
    "waypoint": "The Deployment, Service, ServiceAccount, HorizontalPodAutoscaler and "
    "PodDisruptionBudget that the real istiod's own deployment controller writes for an "
    "`istio-waypoint` Gateway, against ours for an `ambient-waypoint` Gateway, the two "
    "Gateways naming the same parameters ConfigMap, all read back from the API server: "
    "`tests/test_istiod.py`.",
}
# istio.io/istio is served only as pseudo-versions: v0.0.0-<UTC timestamp>-<commit>.
_PSEUDO = re.compile(r"^\s*require\s+istio\.io/istio\s+(v\S+-(\d{14})-([0-9a-f]{12}))\s*$", re.M)


@dataclass(frozen=True)
class Entry:
    """One deliberate difference between upstream's objects and ours."""

    object: str
    field: str
    reason: str
    upstream: str | None = None
    ours: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class IstioPin:
    """Which Istio the upstream charts come from."""

    module_version: str
    commit: str
    date: str
    version_line: str


def _text(where: str, key: str, value: Any) -> str:
    # Values that YAML would read as numbers or booleans are kept as the
    # text they were written as, so a row can say "0" or "true" verbatim.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def load_table(path: Path) -> list[Entry]:
    """The entries of one file, checked: required keys, no stray keys, no repeats."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if data is None:
        return []
    if not isinstance(data, list):
        raise ValueError(f"{path.name}: expected a list of entries, got {type(data).__name__}")
    entries: list[Entry] = []
    seen: set[tuple[str, str]] = set()
    for index, item in enumerate(data):
        where = f"{path.name} entry {index}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a mapping, got {item!r}")
        missing = [k for k in REQUIRED if k not in item]
        stray = sorted(set(item) - set(REQUIRED) - set(OPTIONAL))
        if missing or stray:
            raise ValueError(f"{where}: missing keys {missing}, unknown keys {stray}")
        values = {k: _text(where, k, item[k]) for k in (*REQUIRED, *OPTIONAL) if k in item}
        if values["reason"].strip().lower().rstrip(".") in NON_REASONS:
            raise ValueError(f"{where}: {values['reason']!r} is not a reason")
        key = (values["object"], values["field"])
        if key in seen:
            raise ValueError(f"{where}: {key[0]} {key[1]} is listed twice")
        seen.add(key)
        entries.append(Entry(**values))
    return entries


def load_tables(folder: Path = TABLES) -> dict[str, list[Entry]]:
    """Every `*.yaml` of the folder, by file name without the suffix."""
    return {path.stem: load_table(path) for path in sorted(folder.glob("*.yaml"))}


def istio_pin(go_mod: Path = GO_MOD, version_file: Path = CHARTS_VERSION) -> IstioPin:
    """The pinned istio.io/istio module and the development line its VERSION names."""
    match = _PSEUDO.search(go_mod.read_text(encoding="utf-8"))
    if not match:
        raise ValueError(f"{go_mod}: no `require istio.io/istio <pseudo-version>` line")
    if not version_file.exists():
        raise FileNotFoundError(f"{version_file} missing; run hack/build-binaries.sh")
    stamp = match.group(2)
    return IstioPin(
        module_version=match.group(1),
        commit=match.group(3),
        date=f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}",
        version_line=version_file.read_text(encoding="utf-8").strip(),
    )


def _cell(text: str | None, code: bool = False) -> str:
    if text is None:
        return ""
    text = text.replace("\n", " ").replace("|", "\\|")
    return f"`{text}`" if code else text


def render_markdown(tables: dict[str, list[Entry]], pin: IstioPin) -> str:
    """The page: an introduction, then one table per file."""
    lines = [
        "# Differences from what Istio itself writes",
        "",
        "<!-- Generated by hack/gen_upstream_differences.py; edit the YAML, not this page. -->",
        "",
        "Where the objects the operator writes differ from what Istio's own Helm charts,",
        "Windows experiment and istiod write, and why. Every other field is the same.",
        "Istio's charts and istiod (`pilot-discovery`) are those of",
        f"`istio.io/istio` {pin.version_line} (development line), module version",
        f"`{pin.module_version}`: commit `{pin.commit}` of {pin.date}, pinned in",
        "`hack/cluster/istio/go.mod` and copied to `.cache/istio/charts` by",
        "`hack/build-binaries.sh`.",
        "",
        "Each table below says what it is compared with and by which test; the",
        "comparison is field by field. A difference missing from a table fails its",
        "test, and so does a row that no longer differs. The rows live in",
        "`tests/data/upstream-differences/*.yaml`, one file per table; after changing",
        "them, regenerate this page with `make docs`",
        "(or `.venv/bin/python hack/gen_upstream_differences.py`).",
        "",
        "`(absent)` means the field is not set on that side; `<hash>` stands for a",
        "hash that changes from run to run (the rest of the value is compared as it is).",
    ]
    for name, entries in tables.items():
        title = TITLES.get(name, name)
        lines += ["", f"## {title}", ""]
        if name in JUDGES:
            lines += [JUDGES[name], ""]
        lines += [f"From `tests/data/upstream-differences/{name}.yaml`.", ""]
        with_source = any(e.source for e in entries)
        header = ["Object", "Field", "Upstream", "Ours", "Reason"]
        if with_source:
            header.insert(0, "Source")
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        for e in entries:
            cells = [
                _cell(e.object, code=True),
                _cell(e.field, code=True),
                _cell(e.upstream, code=e.upstream is not None),
                _cell(e.ours, code=e.ours is not None),
                _cell(e.reason),
            ]
            if with_source:
                cells.insert(0, _cell(e.source, code=e.source is not None))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + _values_section()) + "\n"


def _values_section() -> list[str]:
    """The charts' values the operator does not take, with why (api/helm_values.py)."""
    # Imported here: the rest of the page needs only the YAML tables.
    from ambient_operator.api.helm_values import CHARTS, ENTRIES, Fixed

    lines = [
        "",
        "## Chart values the operator does not take",
        "",
        "Every value of the pinned `ztunnel` and `istio-cni` charts (each leaf of their",
        "`values.yaml`, and each value their templates read) is either carried to an",
        "AmbientMesh field (docs/coming-from-helm.md) or listed here. `import-values`",
        "accepts these only as the values in the Honoured column, which render what the",
        "operator renders, and refuses any other with the reason:",
        "`tests/test_helm_values.py` fails on a chart value in neither place.",
        "",
        "From `operator/ambient_operator/api/helm_values.py`.",
        "",
        "| Chart | Value | Honoured | Reason |",
        "|---|---|---|---|",
    ]
    for chart in CHARTS:
        for path, entry in ENTRIES[chart].items():
            if not isinstance(entry, Fixed):
                continue
            honoured = (
                "any"
                if entry.any_value
                else ", ".join(_cell(json.dumps(a), code=True) for a in entry.accepts)
            )
            lines.append(
                f"| {chart} | {_cell(path, code=True)} | {honoured} | {_cell(entry.reason)} |"
            )
    return lines


def main() -> int:
    """Write or check the page."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the page would change")
    args = parser.parse_args()
    text = render_markdown(load_tables(), istio_pin())
    if args.check:
        if not PAGE.exists() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is stale; run hack/gen_upstream_differences.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
