"""Shared inputs of the render tests: test inventories, meshes and golden cases."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cli.render import load_mesh, load_nodes
from ambient_operator.cluster.facts import ClusterFacts
from ambient_operator.render import RenderResult, render_dataplane

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
INVENTORIES = DATA / "inventories"
MESHES = DATA / "meshes"
GOLDEN = TESTS / "golden"
SAMPLES = REPO / "operator" / "ambient_operator" / "samples"
SAMPLE_MESH = SAMPLES / "ambientmesh.yaml"
SAMPLE_NODES = SAMPLES / "nodes-mixed.yaml"

ISTIOD_IP = "10.96.0.20"
DNS_IP = "10.96.0.10"


@dataclass(frozen=True)
class Case:
    """One render input: a mesh (None: all defaults), an inventory and the Service IPs."""

    name: str
    nodes: Path
    mesh: Path | None = None
    istiod_ip: str | None = ISTIOD_IP
    dns_ip: str | None = DNS_IP

    def spec(self) -> AmbientMeshSpec:
        """The mesh spec with defaults applied."""
        return load_mesh(self.mesh) if self.mesh else AmbientMeshSpec()

    def facts(self) -> ClusterFacts:
        """The cluster facts of the case."""
        return ClusterFacts(
            nodes=tuple(load_nodes(self.nodes)), istiod_ip=self.istiod_ip, dns_ip=self.dns_ip
        )

    def render(self) -> RenderResult:
        """Render the case."""
        return render_dataplane(self.spec(), self.facts())


CASES = (
    Case("linux-only", INVENTORIES / "linux-only.yaml"),
    Case("linux-arm64", INVENTORIES / "linux-arm64.yaml"),
    Case("mixed-ws2022-ws2025", INVENTORIES / "mixed-ws2022-ws2025.yaml"),
    # Unknown Service IPs: the fallbacks and their warnings.
    Case("windows-unlabeled", INVENTORIES / "windows-unlabeled.yaml", istiod_ip=None, dns_ip=None),
    Case("ws2019-only", INVENTORIES / "ws2019-only.yaml"),
    Case(
        "windows-disabled",
        INVENTORIES / "mixed-ws2022-ws2025.yaml",
        mesh=MESHES / "windows-disabled.yaml",
    ),
    Case(
        "every-reason",
        INVENTORIES / "every-reason.yaml",
        mesh=MESHES / "custom.yaml",
        istiod_ip="fd00::20",
    ),
    Case("sample", SAMPLE_NODES, mesh=SAMPLE_MESH),
)


def summary(result: RenderResult) -> str:
    """What the objects do not show: plans, node verdicts and warnings, one per line."""
    lines = [
        f"daemonset {d.name} ({d.component}, {d.platform}): {', '.join(d.nodes) or '-'}"
        for d in result.daemonsets
    ]
    lines += [
        f"node {v.node}: {v.reason}: {v.message}"
        if not v.supported
        else f"node {v.node}: {v.platform}"
        for v in result.verdicts
    ]
    lines += [f"warning: {w}" for w in result.warnings]
    return "\n".join(lines) + "\n"
