"""Draw docs/architecture.png: what the operator watches, decides and writes.

    .venv/bin/python hack/gen_architecture.py

The picture is drawn from the lists below, so it changes with a small edit
here rather than in a drawing program.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

OUT = Path(__file__).resolve().parents[1] / "docs" / "architecture.png"

INK = "#1f2933"
COLORS = {
    "input": "#dbeafe",
    "operator": "#fef3c7",
    "pure": "#dcfce7",
    "output": "#fae8ff",
    "linux": "#e0f2fe",
    "windows": "#ede9fe",
    "none": "#f3f4f6",
    "api": "#fee2e2",
}


def box(
    ax: Axes, x: float, y: float, w: float, h: float, title: str, lines: list[str], color: str
) -> None:
    """A rounded box with a bold title and plain lines under it."""
    ax.add_patch(
        FancyBboxPatch(
            (x, y),
            w,
            h,
            boxstyle="round,pad=0.02,rounding_size=0.08",
            linewidth=1.2,
            edgecolor=INK,
            facecolor=COLORS[color],
        )
    )
    ax.text(x + 0.08, y + h - 0.1, title, fontsize=10.5, fontweight="bold", va="top", color=INK)
    for i, line in enumerate(lines):
        ax.text(x + 0.08, y + h - 0.42 - 0.26 * i, line, fontsize=8.5, va="top", color=INK)


def arrow(
    ax: Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    label: str = "",
    style: str = "-|>",
    dashed: bool = False,
) -> None:
    """An arrow with an optional label at its middle."""
    ax.add_patch(
        FancyArrowPatch(
            start,
            end,
            arrowstyle=style,
            mutation_scale=14,
            linewidth=1.3,
            color=INK,
            linestyle="--" if dashed else "-",
            shrinkA=2,
            shrinkB=2,
        )
    )
    if label:
        mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
        ax.text(
            mx,
            my + 0.08,
            label,
            fontsize=8,
            ha="center",
            va="bottom",
            color=INK,
            bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none"},
        )


def draw() -> None:
    """The whole picture."""
    fig, ax = plt.subplots(figsize=(15, 9.5), dpi=110)
    ax.set_xlim(0, 15)
    ax.set_ylim(0, 9.5)
    ax.axis("off")
    ax.text(
        0.2,
        9.25,
        "ambient-operator: cluster facts -> pure render -> server-side apply -> status",
        fontsize=14,
        fontweight="bold",
        color=INK,
        va="top",
    )

    box(
        ax,
        0.2,
        5.4,
        3.2,
        3.3,
        "Inputs (watched)",
        [
            "AmbientMesh default (spec)",
            "Nodes: OS, arch, Windows build,",
            "   labels, taints",
            "Services istiod*, kube-dns",
            "istiod Deployment (trusted accounts)",
            "Namespaces, Pods (enrollment)",
            "Gateways, GatewayClasses,",
            "   parametersRef ConfigMaps",
            "RuntimeClasses",
        ],
        "input",
    )
    box(
        ax,
        4.0,
        5.4,
        3.5,
        3.3,
        "Operator process",
        [
            "kopf on.event watches",
            "   -> ClusterState caches",
            "one debounced reconcile loop",
            "   (only the Lease holder acts)",
            "dataplane | namespaces |",
            "   waypoints | webhook misses",
            "webhook HTTPS server (own thread)",
            "/metrics :9090, /healthz :8080",
        ],
        "operator",
    )
    box(
        ax,
        8.3,
        7.0,
        3.0,
        1.7,
        "render/ (pure)",
        [
            "spec + facts -> objects",
            "Jinja2 templates/",
            "node verdicts (why not)",
            "same input, same bytes",
        ],
        "pure",
    )
    box(
        ax,
        8.3,
        5.4,
        3.0,
        1.2,
        "apply layer",
        [
            "server-side apply,",
            "field manager ambient-operator,",
            "prune by label, no-op = 0 writes",
        ],
        "pure",
    )
    box(
        ax,
        12.0,
        5.4,
        2.8,
        3.3,
        "Outputs (owned)",
        [
            "DaemonSets per platform:",
            "   linux, ltsc2022, ltsc2025",
            "ServiceAccounts, ConfigMaps,",
            "   istio-cni ClusterRole",
            "GatewayClass, waypoint",
            "   Deployment/Service/SA",
            "MutatingWebhookConfiguration",
            "Status, Events",
        ],
        "output",
    )
    box(
        ax,
        4.0,
        3.3,
        3.5,
        1.3,
        "kube-apiserver",
        [
            "admission: Pod CREATE in ambient",
            "   namespaces -> webhook (3 s, Ignore)",
        ],
        "api",
    )

    arrow(ax, (3.4, 7.2), (4.0, 7.2), "watch")
    arrow(ax, (7.5, 7.9), (8.3, 7.9), "facts")
    arrow(ax, (9.8, 7.0), (9.8, 6.6), "objects")
    arrow(ax, (7.5, 6.0), (8.3, 6.0), "status")
    arrow(ax, (11.3, 6.0), (12.0, 6.0), "apply")
    arrow(ax, (5.75, 4.6), (5.75, 5.4), "AdmissionReview", style="<|-|>")

    y, h = 0.25, 2.1
    box(
        ax,
        0.2,
        y,
        4.3,
        h,
        "Linux node (amd64, arm64)",
        [
            "ztunnel (DaemonSet)",
            "istio-cni-node (DaemonSet)",
            "waypoints (Envoy): Linux only",
            "every feature: probe exclusion,",
            "   DNS proxy, client source IP",
        ],
        "linux",
    )
    box(
        ax,
        4.8,
        y,
        3.4,
        h,
        "Windows Server 2022",
        [
            "ztunnel-windows-ltsc2022",
            "istio-cni-node-windows-ltsc2022",
            "   HostProcess, HNS L4WFPPROXY",
            "new pods: redirection-wait",
            "   init container (webhook)",
        ],
        "windows",
    )
    box(
        ax,
        8.5,
        y,
        3.2,
        h,
        "Windows Server 2025",
        [
            "ztunnel-windows-ltsc2025",
            "istio-cni-node-windows-ltsc2025",
            "   HostProcess, HNS L4WFPPROXY",
            "no init container needed",
        ],
        "windows",
    )
    box(
        ax,
        12.0,
        y,
        2.8,
        h,
        "Windows Server 2019",
        [
            "no agents:",
            "reported as",
            "WindowsBuildUnsupported",
            "(Degraded=True)",
        ],
        "none",
    )
    for target in (2.35, 6.5, 10.1):
        arrow(ax, (13.4, 5.4), (target, 2.4), dashed=True)
    ax.text(13.4, 4.6, "scheduled by\nKubernetes", fontsize=8, ha="left", va="center", color=INK)

    fig.savefig(OUT, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    draw()
