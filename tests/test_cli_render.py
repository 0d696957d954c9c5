"""`ambient-operator render`: objects on stdout, warnings on stderr, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ambient_operator.cli.main import main
from render_cases import INVENTORIES, SAMPLE_MESH, SAMPLE_NODES


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["render", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_renders_the_sample_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(
        capsys,
        "--mesh",
        str(SAMPLE_MESH),
        "--nodes",
        str(SAMPLE_NODES),
        "--istiod-ip",
        "10.96.0.20",
        "--dns-ip",
        "10.96.0.10",
    )
    assert code == 0
    docs = list(yaml.safe_load_all(out))
    assert out.startswith("---\n")
    kinds = [d["kind"] for d in docs]
    assert kinds.count("DaemonSet") == 6
    assert kinds.index("ServiceAccount") < kinds.index("ClusterRole") < kinds.index("DaemonSet")
    assert err.splitlines() == [
        "warning: node win2019-1: WindowsBuildUnsupported: Windows Server 2019 (build "
        "10.0.17763) lacks HostProcess containers and HNS L4 WFP proxy policies, which ambient "
        "needs; supported: Windows Server 2022 (build 10.0.20348), Windows Server 2025 (build "
        "10.0.26100)"
    ]


def test_unknown_service_ips_are_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--nodes", str(SAMPLE_NODES))
    assert code == 0 and out
    lines = err.splitlines()
    assert lines[0].startswith("warning: node win2019-1: WindowsBuildUnsupported: ")
    assert lines[1].startswith("warning: istiod Service IP unknown")
    assert lines[2].startswith("warning: cluster DNS Service IP unknown")


def test_only_ws2019_nodes_warn_and_get_no_windows_agent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = run(capsys, "--nodes", str(INVENTORIES / "ws2019-only.yaml"))
    assert code == 0
    assert "windows" not in {
        d["spec"]["template"]["spec"]["os"]["name"]
        for d in yaml.safe_load_all(out)
        if d["kind"] == "DaemonSet"
    }
    assert [line.split(":")[1].strip() for line in err.splitlines()] == [
        "node win2019-1",
        "node win2019-2",
    ]


def test_json_output_is_one_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--nodes", str(SAMPLE_NODES), "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["apiVersion"], doc["kind"]) == ("v1", "List")
    assert len(doc["items"]) == 14


def test_defaults_without_any_file(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys)
    assert code == 0 and err == ""
    names = [d["metadata"]["name"] for d in yaml.safe_load_all(out)]
    assert names == [
        "istio-cni",
        "ztunnel",
        "istio-cni",
        "istio-cni",
        "istio-cni-config",
        "istio-cni-node",
        "ztunnel",
    ]


def test_nodes_as_multi_document_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    items = yaml.safe_load(SAMPLE_NODES.read_text())["items"]
    multi = tmp_path / "nodes.yaml"
    multi.write_text(yaml.safe_dump_all(items))
    _, from_list, _ = run(capsys, "--nodes", str(SAMPLE_NODES))
    _, from_docs, _ = run(capsys, "--nodes", str(multi))
    assert from_docs == from_list


def test_istiod_ip_reaches_windows_agents(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "--nodes", str(SAMPLE_NODES), "--istiod-ip", "10.0.0.7")
    assert "value: 10.0.0.7:15012" in out


GOOD_MESH = SAMPLE_MESH.read_text()


@pytest.mark.parametrize(
    ("name", "mesh", "nodes", "expected"),
    [
        ("mesh-missing", None, None, "cannot read: No such file or directory"),
        ("mesh-bad-yaml", "spec: [unclosed\n", None, "invalid YAML"),
        ("mesh-empty", "", None, "expected one AmbientMesh document, found 0"),
        ("mesh-two-docs", GOOD_MESH + "---\n" + GOOD_MESH, None, "found 2"),
        ("mesh-scalar", "just text\n", None, "expected a mapping, got str"),
        (
            "mesh-wrong-kind",
            "apiVersion: v1\nkind: ConfigMap\n",
            None,
            "kind: expected AmbientMesh, got 'ConfigMap'",
        ),
        (
            "mesh-wrong-version",
            "apiVersion: ambientoperator.io/v1\nkind: AmbientMesh\n",
            None,
            "apiVersion: expected ambientoperator.io/v1alpha1",
        ),
        (
            "mesh-bad-surge",
            GOOD_MESH.replace("maxSurge: 1", "maxSurge: lots"),
            None,
            "spec.ztunnel.rollout.maxSurge: 'lots' is neither a count nor a percentage",
        ),
        (
            "mesh-rollout-rule",
            GOOD_MESH.replace("maxUnavailable: 0", "maxUnavailable: 2"),
            None,
            "spec.ztunnel.rollout.maxSurge: maxSurge must be zero when maxUnavailable is not",
        ),
        (
            "mesh-unknown-field",
            GOOD_MESH.replace("logLevel: info", "logLevl: info"),
            None,
            "spec.logLevl: unknown field",
        ),
        (
            "mesh-bad-build",
            GOOD_MESH.replace(
                "enabled: true\n      # Unset", "builds: ['10.0.17763']\n      # Unset"
            ),
            None,
            "spec.platforms.windows.builds[0]: Input should be '10.0.20348' or '10.0.26100'",
        ),
        (
            "mesh-bad-quantity",
            GOOD_MESH.replace("cpu: 200m", "cpu: -1"),
            None,
            "spec.ztunnel.resources.requests.cpu: '-1' is not a non-negative Kubernetes quantity",
        ),
        (
            "mesh-wrong-name",
            GOOD_MESH.replace("name: default", "name: mine"),
            None,
            "metadata.name: an AmbientMesh must be named 'default'",
        ),
        ("nodes-missing", GOOD_MESH, None, "cannot read"),
        ("nodes-bad-yaml", GOOD_MESH, "items:\n  - {a: b\n", "invalid YAML"),
        (
            "nodes-wrong-kind",
            GOOD_MESH,
            "apiVersion: apps/v1\nkind: Deployment\n",
            "kind: expected Node, NodeList or List, got 'Deployment'",
        ),
        (
            "nodes-wrong-item",
            GOOD_MESH,
            "kind: List\nitems:\n- {kind: Node, metadata: {name: a}}\n- {kind: Pod}\n",
            "items[1].kind: expected Node, got 'Pod'",
        ),
        (
            "nodes-nameless",
            GOOD_MESH,
            "kind: List\nitems:\n- {kind: Node, metadata: {}}\n",
            "items[0].metadata.name: a Node needs a name",
        ),
        (
            "nodes-bad-taints",
            GOOD_MESH,
            "kind: Node\nmetadata: {name: a}\nspec: {taints: oops}\n",
            "spec.taints: expected a list",
        ),
        (
            "nodes-duplicate",
            GOOD_MESH,
            "kind: Node\nmetadata: {name: a}\n---\nkind: Node\nmetadata: {name: a}\n",
            "documents[1].metadata.name: duplicate node 'a'",
        ),
        ("nodes-items-not-list", GOOD_MESH, "kind: List\nitems: 3\n", "items: expected a list"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    name: str,
    mesh: str | None,
    nodes: str | None,
    expected: str,
) -> None:
    mesh_file = tmp_path / f"{name}-mesh.yaml"
    nodes_file = tmp_path / f"{name}-nodes.yaml"
    if mesh is not None:
        mesh_file.write_text(mesh)
    if nodes is not None:
        nodes_file.write_text(nodes)
    args = ["--mesh", str(mesh_file)]
    if name.startswith("nodes-"):
        args += ["--nodes", str(nodes_file)]
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    culprit = nodes_file if name.startswith("nodes-") else mesh_file
    assert lines[0].startswith(f"error: {culprit}: "), lines[0]
    assert expected in lines[0]
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--istiod-ip", "istiod.local"], "error: --istiod-ip: 'istiod.local' is not an IP"),
        (["--dns-ip", "10.0.0"], "error: --dns-ip: '10.0.0' is not an IP"),
        (["--kube-version", "latest"], "error: --kube-version: expected MAJOR.MINOR"),
    ],
)
def test_bad_options_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    code, out, err = run(capsys, *args)
    assert (code, out) == (2, "")
    assert err.splitlines() == [err.strip()] and err.startswith(expected)


def test_directory_and_binary_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "--nodes", str(tmp_path))
    assert code == 2 and "cannot read" in err and len(err.splitlines()) == 1
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(b"\xff\xfe\x00binary")
    code, _, err = run(capsys, "--nodes", str(blob))
    assert code == 2 and err.startswith(f"error: {blob}: ") and len(err.splitlines()) == 1


def _console(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ambient_operator.cli.main", "render", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_real_process_success_and_failure(tmp_path: Path) -> None:
    done = _console("--mesh", str(SAMPLE_MESH), "--nodes", str(SAMPLE_NODES))
    assert done.returncode == 0
    assert len(list(yaml.safe_load_all(done.stdout))) == 14
    assert "warning: node win2019-1: WindowsBuildUnsupported:" in done.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD_MESH.replace("maxSurge: 1", "maxSurge: -1"))
    done = _console("--mesh", str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"error: {bad}: spec.ztunnel.rollout.maxSurge: ")
    assert "Traceback" not in done.stderr
