"""What the docs tell users to run, and the names and permissions they state (issue 31, 7-13).

Offline, with the real helm (.cache/bin/helm): the chart's object names
under a release whose name lacks "ambient-operator" (`<fullname>`), the
permission tables generated from the chart's render and what the pages
say about them, helm's default Kubernetes version, and what the limitations
page says of the Windows images.

On the session's control plane, with the real kubectl (.cache/bin/kubectl):
the documented clean-up of the istio-cni RBAC an older operator made, the
documented `helm template` and `kubectl apply` install, and the columns
`kubectl get ambientmesh` prints.

Every command is read from the page itself, so the test runs what a user
would copy; expected values are literals quoted from the pages, or what
the real helm and kubectl print.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import LocalCluster, apply_objects
from ambient_devcluster.harness import borrowed_mesh
from ambient_devcluster.istio import charts_dir
from ambient_operator.cli.main import main as cli
from chart_helpers import helm, template
from conftest import BIN_DIR, REPO_ROOT, ignoring, unique_name, wait_for
from test_docs import generator

DOCS = REPO_ROOT / "docs"
INSTALLATION = DOCS / "installation.md"
WAYPOINTS = DOCS / "waypoints.md"
TROUBLESHOOTING = DOCS / "troubleshooting.md"
REFERENCE = DOCS / "ambientmesh-reference.md"
SAMPLE_NODES = REPO_ROOT / "operator" / "ambient_operator" / "samples" / "nodes-mixed.yaml"
WRITE = frozenset({"create", "update", "patch", "delete", "deletecollection"})
Grant = tuple[str, str, str, str, tuple[str, ...]]  # where, group, resource, verb, names


# -- reading the pages -------------------------------------------------------------------------


def _commands(page: Path) -> Iterator[str]:
    """Every command of the page: fenced sh lines (continuations joined) and code spans."""
    text = page.read_text(encoding="utf-8")
    for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S):
        # A block inside a list item is indented; the command is what follows.
        lines = block.replace("\\\n", " ").splitlines()
        yield from (line.strip() for line in lines if line.strip())
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    yield from re.findall(r"`([^`\n]+)`", prose.replace("\n", " "))


def section(page: Path, heading: str) -> str:
    """The text under a heading of the page (`## X`), up to the next heading of its level."""
    lines = page.read_text(encoding="utf-8").splitlines(keepends=True)
    fenced, level, start = False, 0, -1
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        found = None if fenced else re.match(r"(#+) (.*)$", line)
        if found and start >= 0 and len(found.group(1)) <= level:
            return "".join(lines[start:i])
        if found and start < 0 and found.group(2).strip() == heading:
            level, start = len(found.group(1)), i + 1
    assert start >= 0, f"{page.name}: no heading {heading!r}"
    return "".join(lines[start:])


def sh_blocks(text: str) -> list[str]:
    """The fenced ```sh blocks of a page's text, dedented (a block in a list is indented)."""
    import textwrap

    return [textwrap.dedent(b) for b in re.findall(r"^ *```sh\n(.*?)^ *```", text, re.M | re.S)]


def section_commands(page: Path, heading: str) -> list[str]:
    """The commands of a section's sh blocks, continuations joined, heredoc bodies left out."""
    out: list[str] = []
    for block in sh_blocks(section(page, heading)):
        ending = ""
        for line in block.replace("\\\n", " ").splitlines():
            if ending:
                ending = "" if line.strip() == ending else ending
                continue
            if line.strip():
                out.append(line.strip())
                heredoc = re.search(r"<<-?'?(\w+)'?", line)
                ending = heredoc.group(1) if heredoc else ""
    return out


def documented(page: Path, start: str) -> list[str]:
    """The one command of the page that starts so, as argv (its comment dropped)."""
    found = [line for line in _commands(page) if line.startswith(start)]
    assert len(found) == 1, f"{page.name}: {len(found)} commands start with {start!r}: {found}"
    return shlex.split(found[0], comments=True)


def _local(args: Sequence[str]) -> list[str]:
    """Paths of the repository (`charts/ambient-operator`, `crds/`) made absolute."""
    return [
        str(REPO_ROOT / a) if not a.startswith("-") and (REPO_ROOT / a).exists() else a
        for a in args
    ]


def kubectl(
    cluster: LocalCluster, argv: Sequence[str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """A documented kubectl command, run by the real kubectl against the cluster."""
    assert argv[0] == "kubectl", argv
    return subprocess.run(
        [str(BIN_DIR / "kubectl"), *_local(argv[1:])],
        capture_output=True,
        text=True,
        env={**os.environ, "KUBECONFIG": str(cluster.kubeconfig)},
        cwd=cwd,
        timeout=120,
        check=False,
    )


# -- 8: the names of the chart's objects ---------------------------------------------------------


def _deployment(objects: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    (found,) = [dict(o) for o in objects if o["kind"] == "Deployment"]
    return found


@pytest.mark.parametrize(
    ("release", "fullname"),
    [
        # installation.md: "the release name when it contains `ambient-operator`
        # (`helm install ambient-operator` gives `ambient-operator`), otherwise
        # `<release>-ambient-operator` (release `x` gives `x-ambient-operator`)".
        ("ambient-operator", "ambient-operator"),
        ("my-ambient-operator", "my-ambient-operator"),
        ("x", "x-ambient-operator"),
    ],
)
def test_the_chart_names_its_objects_after_the_documented_fullname(
    release: str, fullname: str
) -> None:
    objects = template(release=release, namespace="ns")
    assert _deployment(objects)["metadata"]["name"] == fullname
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for kind in ("ServiceAccount", "Service", "ClusterRole", "ClusterRoleBinding", "Role"):
        assert (kind, fullname) in names, kind


def test_every_name_the_docs_build_from_fullname_is_one_the_chart_renders() -> None:
    """Under release `x` (no "ambient-operator" in it), namespace `ns`."""
    objects = template(release="x", namespace="ns")
    deployment = _deployment(objects)
    rendered = {o["metadata"]["name"] for o in objects}
    # Objects the chart makes only with a value the docs name beside them.
    optional = template({"multus": {"enabled": True}}, release="x", namespace="ns")
    rendered |= {o["metadata"]["name"] for o in optional}
    rendered |= {
        f"{prefix}/{deployment['metadata']['name']}" for prefix in ("deploy", "deployment")
    }
    rendered |= set(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    checked: list[str] = []
    for page in (INSTALLATION, TROUBLESHOOTING):
        text = page.read_text(encoding="utf-8")
        for found in re.findall(r"[^\s`(),]*<fullname>[^\s`(),]*", text):
            token = found.rstrip(".;:")
            name = token.replace("<fullname>", "x-ambient-operator").replace("<namespace>", "ns")
            assert name in rendered, f"{page.name}: {token} is {name} for release x, not rendered"
            checked.append(token)
        # <release> only ever in the rule that defines <fullname>.
        assert set(re.findall(r"<release>[^\s`(),]*", text)) <= {"<release>-ambient-operator"}
    assert {
        "<fullname>",
        "<fullname>-agents",
        "<fullname>-istio-cni",
        "--webhook-service=<namespace>/<fullname>:443",
        "deploy/<fullname>",
    } <= set(checked)


# -- 9: the permission tables --------------------------------------------------------------------


@pytest.fixture(scope="module")
def gen_rbac() -> Any:
    return generator("gen_rbac")


@pytest.fixture(scope="module")
def renders(gen_rbac: Any) -> dict[str, list[dict[str, Any]]]:
    """The chart rendered for each value set the generator compares."""
    return {
        case: template(values, release=gen_rbac.RELEASE, namespace=gen_rbac.NAMESPACE)
        for case, values in gen_rbac.CASES.items()
    }


@pytest.mark.parametrize(
    ("page", "blocks"), [(INSTALLATION, ["operator"]), (WAYPOINTS, ["waypoints"])]
)
def test_the_permission_tables_are_the_charts_render(
    gen_rbac: Any, renders: dict[str, list[dict[str, Any]]], page: Path, blocks: list[str]
) -> None:
    text = page.read_text(encoding="utf-8")
    assert re.findall(r"<!-- generated: rbac ([a-z-]+)", text) == blocks
    assert gen_rbac.rewrite(text, renders) == text, (
        f"the permission table of docs/{page.name} is stale; run `make docs` "
        "(or `.venv/bin/python hack/gen_rbac.py`)"
    )


def test_the_rbac_generator_keeps_the_hand_written_page(
    gen_rbac: Any, renders: dict[str, list[dict[str, Any]]]
) -> None:
    end = "<!-- end generated: rbac operator -->"
    page = f"# T\n\nby hand\n\n{gen_rbac.begin_marker('operator')}\nold\n{end}\n\nend\n"
    out = gen_rbac.rewrite(page, renders)
    assert out.startswith(f"# T\n\nby hand\n\n{gen_rbac.begin_marker('operator')}\n\n| Where |")
    assert out.endswith(f"\n\n{end}\n\nend\n")
    assert "old" not in out
    with pytest.raises(ValueError, match="no generated rbac block"):
        gen_rbac.rewrite("# no markers\n", renders)
    with pytest.raises(ValueError, match="unknown block"):
        gen_rbac.rewrite(page.replace("rbac operator", "rbac nothing"), renders)


def _table(page: Path, block: str) -> set[Grant]:
    """The grants a generated table of the page states, read back from its Markdown."""
    text = page.read_text(encoding="utf-8")
    body = text.split(f"<!-- generated: rbac {block},")[1].split(
        f"<!-- end generated: rbac {block}"
    )[0]
    out: set[Grant] = set()
    rows = [line for line in body.splitlines() if line.startswith("| ") and "---" not in line]
    for row in rows[1:]:
        where, group, resources, verbs, names = (cell.strip() for cell in row.strip("|").split("|"))
        g = "" if group == "core" else group.strip("`")
        named = tuple(n.strip().strip("`") for n in names.split(",") if n.strip())
        for resource in resources.split(", "):
            out |= {(where, g, resource, verb, named) for verb in verbs.split(", ")}
    assert len(rows) > 1, f"no table in the {block} block of {page.name}"
    return out


def test_the_installation_table_lists_what_the_issue_found_missing() -> None:
    stated = _table(INSTALLATION, "operator")
    cluster, agents = "cluster", "`agents.namespaces`"
    every = ("get", "list", "watch", "create", "patch", "delete")
    for group, resource in (
        ("autoscaling", "horizontalpodautoscalers"),
        ("policy", "poddisruptionbudgets"),
    ):
        assert {(cluster, group, resource, v, ()) for v in every} <= stated, resource
    assert {(cluster, "", "resourcequotas", v, ()) for v in ("list", "watch")} <= stated
    assert {
        (agents, "", "resourcequotas", v, ()) for v in ("get", "create", "patch", "delete")
    } <= stated
    policies = ("networking.k8s.io", "networkpolicies")
    assert {(cluster, *policies, v, ()) for v in ("list", "watch")} <= stated
    assert {(agents, *policies, v, ()) for v in ("get", "create", "patch", "delete")} <= stated
    webhook = ("admissionregistration.k8s.io", "mutatingwebhookconfigurations")
    assert (cluster, *webhook, "create", ("ambient-operator",)) in stated
    # ConfigMaps: read across the cluster, written only in the agents' namespaces.
    for page, block in ((INSTALLATION, "operator"), (WAYPOINTS, "waypoints")):
        configmaps = {(w, v) for w, g, r, v, _ in _table(page, block) if r == "configmaps"}
        assert configmaps == {
            *((cluster, v) for v in ("get", "list", "watch")),
            *((agents, v) for v in ("create", "patch", "delete")),
        }, page.name


def _grants(objects: Sequence[Mapping[str, Any]], kind: str, name: str, ns: str = "") -> set[Grant]:
    """What one rendered role grants, found by the name installation.md gives it."""
    (role,) = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and o["metadata"].get("namespace", "") == ns
    ]
    return {
        (f"{kind} {name}", group, resource, verb, tuple(rule.get("resourceNames") or ()))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def _operator_grants(objects: Sequence[Mapping[str, Any]]) -> set[Grant]:
    # installation.md, for `helm install ambient-operator`: the ClusterRole
    # `<fullname>`, the Role `<fullname>-agents` in istio-system (the default
    # agents.namespaces), the Role `<fullname>` in the release namespace.
    return (
        _grants(objects, "ClusterRole", "ambient-operator")
        | _grants(objects, "Role", "ambient-operator-agents", "istio-system")
        | _grants(objects, "Role", "ambient-operator", "ambient-operator")
    )


def test_what_installation_md_says_the_operator_may_write(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """The "What that means" bullets, against the chart's rendered roles."""
    cluster = "ClusterRole ambient-operator"
    agents = "Role ambient-operator-agents"
    grants = _operator_grants(renders["defaults"])
    writes = {g for g in grants if g[3] in WRITE}
    # "Writes across the cluster, besides Events and the status of the
    # AmbientMesh, of Gateways and of GatewayClasses, are for waypoints".
    across = {
        r
        for w, _, r, _, _ in writes
        if w == cluster and r not in ("events", "ambientmeshes") and not r.endswith("/status")
    }
    assert across == {
        "deployments",
        "services",
        "serviceaccounts",
        "horizontalpodautoscalers",
        "poddisruptionbudgets",
        "gatewayclasses",
        "mutatingwebhookconfigurations",
    }
    statuses = {r for w, _, r, _, _ in writes if w == cluster and r.endswith("/status")}
    assert statuses == {"ambientmeshes/status", "gateways/status", "gatewayclasses/status"}
    # "and the AmbientMesh's finalizer" (spec.deletionPolicy: Orphan), by name.
    assert {
        (r, names) for w, _, r, v, names in writes if w == cluster and r == "ambientmeshes"
    } == {("ambientmeshes", ("default",))}
    # "DaemonSets, ConfigMaps, ResourceQuotas and NetworkPolicies are written only in
    # agents.namespaces."
    for resource in ("daemonsets", "configmaps", "resourcequotas", "networkpolicies"):
        where = {w for w, _, r, _, _ in writes if r == resource}
        assert where == {agents}, resource
    # "A GatewayClass may be created under any name ... but changed or deleted
    # only as waypoints.className" (default ambient-waypoint).
    classes = {(v, n) for w, _, r, v, n in writes if r == "gatewayclasses"}
    assert classes == {
        ("create", ()),
        ("patch", ("ambient-waypoint",)),
        ("delete", ("ambient-waypoint",)),
    }
    # "the MutatingWebhookConfiguration is applied by its name, ambient-operator, only".
    hooks = {n for _, _, r, _, n in writes if r == "mutatingwebhookconfigurations"}
    assert hooks == {("ambient-operator",)}
    # Others' are only listed and watched (istiod's revision tags).
    read = {(v, n) for _, _, r, v, n in grants - writes if r == "mutatingwebhookconfigurations"}
    assert read == {("get", ("ambient-operator",)), ("list", ()), ("watch", ())}
    # "Never: Pods, pods/status, Nodes (unless nodeReadiness.enabled), Namespaces,
    # any RBAC object, impersonation, CRDs, Secrets other than its own."
    never = {"pods", "pods/status", "nodes", "namespaces", "customresourcedefinitions"}
    assert not {g for g in writes if g[2] in never or g[1] == "rbac.authorization.k8s.io"}
    assert not {g for g in grants if g[3] in ("impersonate", "escalate", "bind")}
    secrets = {(v, n) for _, _, r, v, n in grants if r == "secrets"}
    assert secrets == {
        ("create", ()),
        ("get", ("ambient-operator-webhook-tls",)),
        ("update", ("ambient-operator-webhook-tls",)),
    }
    ready = _operator_grants(renders["nodeReadiness.enabled=true"])
    assert {g for g in ready - grants} == {(cluster, "", "nodes", "patch", ())}


# -- 11: the default Windows images --------------------------------------------------------------


def test_the_limitations_say_the_default_windows_images_do_not_exist(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # windows-support.md: "Istio publishes no Windows images of ztunnel or istio-cni".
    assert "Istio publishes no Windows images" in (DOCS / "windows-support.md").read_text()
    limitations = " ".join((DOCS / "limitations.md").read_text(encoding="utf-8").split())
    assert "The default Windows agent images do not exist" in limitations
    assert "Istio publishes no Windows images" in limitations
    assert "default Windows images exist" not in limitations
    # And `ambient-operator render` says so for both agents.
    assert cli(["render", "--nodes", str(SAMPLE_NODES)]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "does not publish" in line]
    assert [w.split(" is unset")[0] for w in warnings] == [
        "warning: spec.images.ztunnel.windows",
        "warning: spec.images.istioCni.windows",
    ]


# -- 13: helm's default Kubernetes version -------------------------------------------------------


def test_helm_defaults_to_the_kubernetes_version_of_its_client_go(tmp_path: Path) -> None:
    """As Helm's release builds do (its Makefile's K8S_MODULES_VER), not v1.20."""
    go_mod = (REPO_ROOT / "hack" / "cluster" / "helm" / "go.mod").read_text()
    (minor,) = re.findall(r"^\s*k8s\.io/client-go v0\.(\d+)\.\d+", go_mod, flags=re.M)
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\n"
        "data: {kube: {{ .Capabilities.KubeVersion.Version | quote }}}\n"
    )
    done = helm("template", "probe", str(chart))
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["data"]["kube"] == f"v1.{minor}.0"


# -- on the control plane ------------------------------------------------------------------------


def _rbac_exists(rbac: client.RbacAuthorizationV1Api, kind: str, name: str) -> bool:
    read = rbac.read_cluster_role if kind == "ClusterRole" else rbac.read_cluster_role_binding
    try:
        read(name)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _delete_istio_cni_rbac(rbac: client.RbacAuthorizationV1Api) -> None:
    with ignoring(404):
        rbac.delete_cluster_role("istio-cni")
    with ignoring(404):
        rbac.delete_cluster_role_binding("istio-cni")


def _old_operator_rbac(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The istio-cni ClusterRole and binding as the operator renders them without the chart."""
    assert cli(["render", "--nodes", str(SAMPLE_NODES)]) == 0
    out = capsys.readouterr().out
    found = [
        doc
        for doc in yaml.safe_load_all(out)
        if doc and doc["kind"] in ("ClusterRole", "ClusterRoleBinding")
    ]
    assert sorted((d["kind"], d["metadata"]["name"]) for d in found) == [
        ("ClusterRole", "istio-cni"),
        ("ClusterRoleBinding", "istio-cni"),
    ]
    return found


def _istios_own_rbac() -> list[dict[str, Any]]:
    """The istio-cni ClusterRole and binding of Istio's own istio-cni chart (same names)."""
    done = helm(
        "template",
        "istio-cni",
        str(charts_dir() / "istio-cni"),
        "--namespace",
        "istio-system",
        "--set",
        "profile=ambient",
    )
    assert done.returncode == 0, done.stderr
    found = [
        doc
        for doc in yaml.safe_load_all(done.stdout)
        if doc
        and doc["kind"] in ("ClusterRole", "ClusterRoleBinding")
        and doc["metadata"]["name"] == "istio-cni"
    ]
    assert len(found) == 2, found
    return found


def test_the_documented_cleanup_removes_only_the_old_istio_cni_rbac(
    cluster: LocalCluster, k8s: client.ApiClient, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = documented(INSTALLATION, "kubectl delete clusterrole,clusterrolebinding")
    rbac = client.RbacAuthorizationV1Api(k8s)
    kinds = ("ClusterRole", "ClusterRoleBinding")
    # The name is the cluster's own: an earlier test's mesh may still be
    # being collected, with the istio-cni RBAC its operator made.
    wait_for(
        lambda: not any(_rbac_exists(rbac, kind, "istio-cni") for kind in kinds),
        60,
        "no istio-cni ClusterRole or binding left by another test",
    )
    ours_elsewhere = unique_name("ambient-operator-made")
    apply_objects(
        k8s,
        [
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {
                    "name": ours_elsewhere,
                    "labels": {"app.kubernetes.io/managed-by": "ambient-operator"},
                },
                "rules": [],
            }
        ],
    )
    try:
        # Istio's own istio-cni RBAC (its chart) is not the operator's: left alone.
        apply_objects(k8s, _istios_own_rbac())
        done = kubectl(cluster, argv)
        assert done.returncode == 0, done.stderr
        assert all(_rbac_exists(rbac, kind, "istio-cni") for kind in kinds)
        _delete_istio_cni_rbac(rbac)
        wait_for(
            lambda: not any(_rbac_exists(rbac, kind, "istio-cni") for kind in kinds),
            60,
            "Istio's istio-cni RBAC deleted",
        )

        # The operator's: both go, and nothing else it labelled.
        apply_objects(k8s, _old_operator_rbac(capsys))
        done = kubectl(cluster, argv)
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.split("\n")[:2]) == [
            'clusterrole.rbac.authorization.k8s.io "istio-cni" deleted',
            'clusterrolebinding.rbac.authorization.k8s.io "istio-cni" deleted',
        ], done.stdout
        wait_for(
            lambda: not any(_rbac_exists(rbac, kind, "istio-cni") for kind in kinds),
            60,
            "the old istio-cni RBAC deleted",
        )
        assert _rbac_exists(rbac, "ClusterRole", ours_elsewhere)
    finally:
        with ignoring(404):
            rbac.delete_cluster_role(ours_elsewhere)
        _delete_istio_cni_rbac(rbac)


def test_the_documented_helm_template_and_apply_install(
    cluster: LocalCluster, k8s: client.ApiClient, tmp_path: Path
) -> None:
    """installation.md, "With kubectl apply": the chart rendered, then applied, as written."""
    block = documented(INSTALLATION, "helm template ambient-operator charts/ambient-operator")
    assert block[-2] == ">", block
    render, output = block[1:-2], block[-1]
    create = documented(INSTALLATION, "kubectl create namespace ambient-operator")
    apply = documented(INSTALLATION, f"kubectl apply -f {output}")
    # No --kube-version: helm's default must be one the chart accepts.
    assert not any(arg.startswith("--kube-version") for arg in render)
    done = helm(*_local(render))
    assert done.returncode == 0, done.stderr
    (tmp_path / output).write_text(done.stdout)
    # The chart's Role for the agents goes into istio-system, which exists
    # before install ("each must exist before install"); other modules may have made it.
    with ignoring(409):
        client.CoreV1Api(k8s).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name="istio-system"))
        )
    namespace = create[-1]
    try:
        for argv in (create, apply):
            done = kubectl(cluster, argv, cwd=tmp_path)
            assert done.returncode == 0, done.stderr
        done = kubectl(
            cluster,
            ["kubectl", "-n", namespace, "get", "deployment/ambient-operator", "-o", "json"],
        )
        assert done.returncode == 0, done.stderr
        pod = json.loads(done.stdout)["spec"]["template"]["spec"]
        image = pod["containers"][0]["image"]
        assert image.startswith("registry.example.com/ambient-operator:"), image
        done = kubectl(cluster, ["kubectl", "-n", "istio-system", "get", "role", "-o", "name"])
        assert "role.rbac.authorization.k8s.io/ambient-operator-agents" in done.stdout.split()
    finally:
        done = kubectl(cluster, ["kubectl", "delete", "-f", output, "--ignore-not-found"], tmp_path)
        assert done.returncode == 0, done.stderr
        with ignoring(404):
            client.CoreV1Api(k8s).delete_namespace(namespace)


@pytest.fixture
def a_mesh(k8s: client.ApiClient, crds_installed: None) -> Iterator[dict[str, Any]]:
    """The AmbientMesh as found, or one without a spec while the test runs."""
    with borrowed_mesh(k8s, lambda original: (original or {}).get("spec")) as mesh:
        yield mesh


def test_the_documented_columns_are_what_kubectl_prints(
    cluster: LocalCluster, a_mesh: dict[str, Any]
) -> None:
    done = kubectl(cluster, ["kubectl", "get", "ambientmesh"])
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0].split()
    assert header[0] == "NAME"
    for page in (INSTALLATION, REFERENCE):
        (listed,) = re.findall(
            r"^kubectl get ambientmesh +# (.*)$", page.read_text(encoding="utf-8"), flags=re.M
        )
        assert listed.split(", ") == header[1:], page.name
