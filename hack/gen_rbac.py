"""Rewrite the permission tables of the docs from the chart's RBAC, as `helm template` renders it.

.venv/bin/python hack/gen_rbac.py          # rewrite the tables
.venv/bin/python hack/gen_rbac.py --check  # exit 1 when they would change

The chart (charts/ambient-operator) is rendered by the real helm
(.cache/bin/helm) for the documented install, release and namespace
`ambient-operator`, once with the default values and once per value in
TOGGLES that changes what the operator holds. A table lists every rule of
every ClusterRole and Role bound to the operator's ServiceAccount (the
Deployment's); the istio-cni agent's own ClusterRole is not the operator's
and is left out. Each table of a page sits between two marker comments,

    <!-- generated: rbac NAME, ... -->
    <!-- end generated: rbac NAME -->

where NAME is one of BLOCKS: `operator` (every rule) in docs/installation.md,
`waypoints` (the resources waypoints need) in docs/waypoints.md. The rest of
each page is written by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ambient_devcluster import default_bin_dir
from ambient_devcluster.istio import helm

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "ambient-operator"
RELEASE = NAMESPACE = "ambient-operator"
PAGES = (ROOT / "docs" / "installation.md", ROOT / "docs" / "waypoints.md")
DEFAULTS = "defaults"
# Values whose change changes the operator's RBAC, as `--set` would write them.
TOGGLES: dict[str, dict[str, Any]] = {
    "nodeReadiness.enabled=true": {"nodeReadiness": {"enabled": True}},
    "adoption.enabled=true": {"adoption": {"enabled": True}},
    "multus.enabled=true": {"multus": {"enabled": True}},
    "webhook.certManager.enabled=true": {"webhook": {"certManager": {"enabled": True}}},
    "webhook.enabled=false": {"webhook": {"enabled": False}},
    "leaderElection.enabled=false": {"leaderElection": {"enabled": False}},
}
CASES: dict[str, dict[str, Any]] = {DEFAULTS: {}, **TOGGLES}
# What each place means; the order of the table.
CLUSTER, AGENTS, RELEASE_NS = "cluster", "`agents.namespaces`", "release namespace"
# Multus's global namespace, where the chart's multus.enabled grants a Role.
MULTUS_NS, MULTUS_NAMESPACE = "namespace `default`", "default"
WHERE = (CLUSTER, AGENTS, RELEASE_NS, MULTUS_NS)
_IN = {
    CLUSTER: "cluster-wide",
    AGENTS: f"in {AGENTS}",
    RELEASE_NS: "in the release namespace",
    MULTUS_NS: f"in {MULTUS_NS}",
}
# The waypoints' share: what waypoints.md explains.
WAYPOINT_RESOURCES = frozenset(
    {
        "gateways",
        "gateways/status",
        "gatewayclasses",
        "gatewayclasses/status",
        "services",
        "serviceaccounts",
        "deployments",
        "horizontalpodautoscalers",
        "poddisruptionbudgets",
        "configmaps",
        "pods",
        "events",
        "namespaces",
    }
)
Objects = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class Rule:
    """One rule of a role bound to the operator, and where it applies."""

    where: str
    groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    names: tuple[str, ...]


@dataclass(frozen=True)
class Block:
    """A generated table: which rules it lists."""

    name: str
    keep: Callable[[str], bool]  # by resource


BLOCKS = {
    "operator": Block("operator", lambda _resource: True),
    "waypoints": Block("waypoints", lambda resource: resource in WAYPOINT_RESOURCES),
}
_BLOCK = re.compile(
    r"(?P<begin><!-- generated: rbac (?P<name>[a-z0-9-]+)\b[^\n]*-->\n)"
    r"(?P<body>.*?)"
    r"(?P<end><!-- end generated: rbac (?P=name) -->)",
    re.S,
)


def begin_marker(name: str) -> str:
    """The comment that opens a generated table."""
    return (
        f"<!-- generated: rbac {name}, from the chart's `helm template` by `make docs` "
        "(hack/gen_rbac.py); edit the chart -->"
    )


def render(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chart as the real helm renders it for the documented release."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    for key, value in _dotted(values):
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    done = helm(default_bin_dir(), *args)
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def _dotted(values: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in values.items():
        if isinstance(value, Mapping):
            yield from _dotted(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def operator_rules(objects: Objects) -> list[Rule]:
    """Every rule bound to the Deployment's ServiceAccount, in the order the chart writes them."""
    (deployment,) = [o for o in objects if o.get("kind") == "Deployment"]
    namespace = deployment["metadata"]["namespace"]
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    agents = {a.split("=", 1)[1] for a in args if a.startswith("--agents-namespace=")}
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    roles = {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o
        for o in objects
        if o.get("kind") in ("ClusterRole", "Role")
    }
    out: list[Rule] = []
    for binding in objects:
        kind = binding.get("kind")
        if kind not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if subject not in binding.get("subjects", []):
            continue
        bound_in = binding["metadata"].get("namespace", "")
        ref = binding["roleRef"]
        role = roles[(ref["kind"], bound_in if ref["kind"] == "Role" else "", ref["name"])]
        if kind == "ClusterRoleBinding":
            where = CLUSTER
        elif bound_in in agents:
            where = AGENTS
        elif bound_in == namespace:
            where = RELEASE_NS
        elif bound_in == MULTUS_NAMESPACE:
            where = MULTUS_NS
        else:
            raise ValueError(f"a RoleBinding in {bound_in}, neither agents' nor release namespace")
        for rule in role.get("rules", []):
            out.append(
                Rule(
                    where,
                    tuple(rule.get("apiGroups", [])),
                    tuple(rule.get("resources", [])),
                    tuple(rule.get("verbs", [])),
                    tuple(rule.get("resourceNames", [])),
                )
            )
    return out


Grant = tuple[str, str, str, str, tuple[str, ...]]  # where, group, resource, verb, names


def grants(rules: Iterable[Rule]) -> set[Grant]:
    """Each (where, group, resource, verb, names) the rules allow."""
    return {
        (r.where, group, resource, verb, r.names)
        for r in rules
        for group in r.groups
        for resource in r.resources
        for verb in r.verbs
    }


def _group(name: str) -> str:
    return "core" if name == "" else f"`{name}`"


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"`{n}`" for n in names)


def table(rules: Sequence[Rule], block: Block) -> str:
    """The Markdown table of the rules the block keeps (one row per group and resource list)."""
    rows = ["| Where | API group | Resources | Verbs | Only the names |", "|---|---|---|---|---|"]
    for where in WHERE:
        for rule in rules:
            if rule.where != where:
                continue
            resources = [r for r in rule.resources if block.keep(r)]
            if not resources:
                continue
            for group in rule.groups:
                rows.append(
                    f"| {where} | {_group(group)} | {', '.join(resources)} "
                    f"| {', '.join(rule.verbs)} | {_names(rule.names)} |"
                )
    return "\n".join(rows)


def _describe(found: set[Grant]) -> str:
    merged: dict[tuple[str, str, str, tuple[str, ...]], list[str]] = {}
    for where, group, resource, verb, names in sorted(found):
        merged.setdefault((where, group, resource, names), []).append(verb)
    parts = []
    for (where, group, resource, names), verbs in merged.items():
        named = f" {_names(names)}" if names else ""
        scope = "" if group == "" else f" ({group})"
        said = ", ".join(f"`{v}`" for v in verbs)
        parts.append(f"{said} on {resource}{scope}{named} {_IN[where]}")
    return "; ".join(parts)


def differences(renders: Mapping[str, Objects], block: Block) -> list[str]:
    """One line per toggle: what it adds to and takes from the defaults' grants."""
    base = {g for g in grants(operator_rules(renders[DEFAULTS])) if block.keep(g[2])}
    lines: list[str] = []
    for toggle in TOGGLES:
        now = {g for g in grants(operator_rules(renders[toggle])) if block.keep(g[2])}
        added, dropped = now - base, base - now
        if not added and not dropped:
            continue
        said = []
        if added:
            said.append(f"adds {_describe(added)}")
        if dropped:
            said.append(f"drops {_describe(dropped)}")
        lines.append(f"- `{toggle}` {' and '.join(said)}.")
    return lines


def markdown(renders: Mapping[str, Objects], block: Block) -> str:
    """A block's generated text: the defaults' table, then what each toggle changes."""
    text = table(operator_rules(renders[DEFAULTS]), block)
    changes = differences(renders, block)
    if changes:
        text += "\n\nWith other values:\n\n" + "\n".join(changes)
    return text


def rewrite(text: str, renders: Mapping[str, Objects]) -> str:
    """The page with every generated block rewritten; the hand-written rest is kept.

    Raises ValueError for markers of a block that does not exist, or when the
    page has none.
    """
    seen: list[str] = []

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise ValueError(f"the page has markers for unknown block {name!r}")
        seen.append(name)
        body = markdown(renders, BLOCKS[name])
        return f"{begin_marker(name)}\n\n{body}\n\n{match['end']}"

    out = _BLOCK.sub(fill, text)
    if not seen:
        raise ValueError("the page has no generated rbac block")
    return out


def main() -> int:
    """Write or check the pages."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a page would change")
    args = parser.parse_args()
    renders = {case: render(values) for case, values in CASES.items()}
    stale = False
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        new = rewrite(text, renders)
        if new == text:
            continue
        if args.check:
            print(f"{page} is stale; run hack/gen_rbac.py", file=sys.stderr)
            stale = True
        else:
            page.write_text(new, encoding="utf-8")
    return 1 if stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
