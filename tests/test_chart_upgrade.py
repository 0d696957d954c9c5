"""Upgrading the chart from its previous version with the command the docs give (issue 43, 2).

`helm upgrade --reuse-values` renders the new chart with the *previous*
chart's defaults, so every value a newer chart adds is missing. The
previous chart is made here from a copy of charts/ambient-operator without
the value groups added last (`adoption`, `istioCniRepair`, `multus`, as at
997120c^). It is installed with installation.md's install command, then
upgraded with installation.md's upgrade command, both read from the page and
run by the real helm against the session's control plane: with
`--reuse-values` the chart refuses by name and says which flag to use; with
the documented `--reset-then-reuse-values` the upgrade succeeds and the new
defaults are in the release.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from chart_helpers import CHART, helm
from conftest import ignoring, wait_for
from test_docs_commands import INSTALLATION, documented, kubectl, section_commands

# The value groups the previous chart did not have (git show 997120c^:charts/...).
NEWEST = ("adoption", "istioCniRepair", "multus")
HELPERS = CHART / "templates" / "_helpers.tpl"


def _guarded_groups(helpers: str) -> list[str]:
    """The value groups the chart's stale-values guard checks, read from _helpers.tpl."""
    (line,) = re.findall(r'^\{\{- range list ("[^}]*") -\}\}$', helpers, flags=re.M)
    return re.findall(r'"([A-Za-z]+)"', line)


def test_the_guard_checks_every_value_group_of_values_yaml() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    groups = [
        key
        for key, default in values.items()
        if isinstance(default, dict) and default and key not in ("resources", "securityContext")
    ]
    assert _guarded_groups(HELPERS.read_text()) == groups
    assert set(NEWEST) <= set(groups)


def previous_chart(tmp: Path) -> Path:
    """A copy of the chart as it was before its newest value groups."""
    old = tmp / "ambient-operator"
    shutil.copytree(CHART, old)
    values = yaml.safe_load((old / "values.yaml").read_text())
    schema = json.loads((old / "values.schema.json").read_text())
    for key in NEWEST:
        del values[key]
        del schema["properties"][key]
    (old / "values.yaml").write_text(yaml.safe_dump(values, sort_keys=False))
    (old / "values.schema.json").write_text(json.dumps(schema, indent=2))
    helpers = HELPERS.read_text()
    # The previous chart had no guard; its groups here so that it installs at all.
    for key in NEWEST:
        helpers = helpers.replace(f' "{key}"', "")
    assert not set(NEWEST) & set(_guarded_groups(helpers))
    (old / "templates" / "_helpers.tpl").write_text(helpers)
    chart = yaml.safe_load((old / "Chart.yaml").read_text())
    chart["version"] = "0.0.9"
    (old / "Chart.yaml").write_text(yaml.safe_dump(chart))
    return old


def _argv(command: str, chart: Path) -> list[str]:
    """A documented helm command as argv, the chart's path pointing at `chart`."""
    import shlex

    argv = shlex.split(command, comments=True)
    assert argv[0] == "helm", argv
    assert "charts/ambient-operator" in argv, argv
    return [str(chart) if a == "charts/ambient-operator" else a for a in argv[1:]]


@pytest.fixture
def installed_previous(
    cluster: Any, k8s: client.ApiClient, crds_installed: None, tmp_path: Path
) -> Iterator[tuple[str, str]]:
    """The previous chart installed with installation.md's install command; its namespace."""
    (install,) = [c for c in section_commands(INSTALLATION, "With Helm") if "helm install" in c]
    argv = _argv(install, previous_chart(tmp_path))
    release, namespace = argv[1], argv[argv.index("--namespace") + 1]
    # The chart's Role for the agents goes into istio-system, which must exist first.
    with ignoring(409):
        client.CoreV1Api(k8s).create_namespace({"metadata": {"name": "istio-system"}})
    done = helm(*argv, kubeconfig=cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    try:
        yield release, namespace
    finally:
        helm("uninstall", release, "-n", namespace, kubeconfig=cluster.kubeconfig)
        with ignoring(404):
            client.CoreV1Api(k8s).delete_namespace(namespace)
        wait_for(lambda: namespace not in _namespaces(k8s), 120, f"namespace {namespace} deleted")


def _namespaces(k8s: client.ApiClient) -> set[str]:
    return {ns.metadata.name for ns in client.CoreV1Api(k8s).list_namespace().items}


def _values(cluster: Any, release: str, namespace: str) -> dict[str, Any]:
    done = helm(
        "get", "values", release, "-n", namespace, "--all", "-o", "json",
        kubeconfig=cluster.kubeconfig,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    values: dict[str, Any] = json.loads(done.stdout)
    return values


def test_the_documented_upgrade_from_the_previous_chart(
    cluster: Any, k8s: client.ApiClient, installed_previous: tuple[str, str]
) -> None:
    release, namespace = installed_previous
    before = _values(cluster, release, namespace)
    assert not set(NEWEST) & set(before), sorted(before)
    command = " ".join(
        documented(INSTALLATION, "helm upgrade ambient-operator charts/ambient-operator")
    )
    assert "--reset-then-reuse-values" in command.split()
    argv = _argv(command, CHART)
    assert argv[1:2] == [release] and namespace in argv

    # The habit the docs used to give: the chart refuses and names the flag.
    habit = [a.replace("--reset-then-reuse-values", "--reuse-values") for a in argv]
    done = helm(*habit, kubeconfig=cluster.kubeconfig)
    assert done.returncode != 0, done.stdout
    assert "the values adoption, istioCniRepair, multus are missing" in done.stderr, done.stderr
    assert "Upgrade with --reset-then-reuse-values instead" in done.stderr
    assert "nil pointer" not in done.stderr

    # The documented order: the chart's CRD first ("Helm does not upgrade CRDs"), then
    # the documented command: the user's values kept, the new chart's defaults added.
    crds = documented(INSTALLATION, "kubectl apply --server-side --force-conflicts -f charts/")
    done = kubectl(cluster, crds)
    assert done.returncode == 0, done.stderr
    assert "ambientmeshes.ambientoperator.io serverside-applied" in done.stdout, done.stdout
    done = helm(*argv, kubeconfig=cluster.kubeconfig)
    assert done.returncode == 0, done.stderr
    after = _values(cluster, release, namespace)
    assert after["image"]["repository"] == "registry.example.com/ambient-operator"
    assert after["image"]["tag"] == "0.1.1"
    assert (after["adoption"], after["istioCniRepair"], after["multus"]) == (
        {"enabled": False},
        {"deletePods": False},
        {"enabled": False},
    )
    deployment = client.AppsV1Api(k8s).read_namespaced_deployment(release, namespace)
    (container,) = deployment.spec.template.spec.containers
    assert container.image == "registry.example.com/ambient-operator:0.1.1"
    assert deployment.metadata.labels["helm.sh/chart"] == "ambient-operator-0.1.0"
