"""The images this project builds and ships beside the operator (`make images`, docs/images.md).

One place for their names and tags: `hack/images` builds and pushes them under
`<registry>/<name>:<tag>`, and the operator resolves the same names from the one
registry the user gives, so what was pushed is what the pods pull.
"""

from __future__ import annotations

from typing import Final

# The operator's own image; its tag is the operator's version.
OPERATOR: Final = "ambient-operator"
# The init container image the webhook names by default: an OCI index with one
# nanoserver-based entry per supported Windows build; its tag is the operator's version.
REDIRECTION_WAIT: Final = "redirection-wait"
# The Windows agents, built from Istio's Windows experiment under the names its
# tools/docker.yaml gives them (render/values.py WINDOWS_IMAGE_NAMES).
ZTUNNEL_WINDOWS: Final = "ztunnel-windows"
INSTALL_CNI_WINDOWS: Final = "install-cni-windows"

# The experiment's pair. The two branches add `windows_namespace` to the ZDS
# WorkloadInfo between istio-cni and ztunnel, which master lacks: a Windows
# ztunnel and istio-cni must come from this same pair, never from a release.
WINDOWS_EXPERIMENT_ISTIO_REPO: Final = "github.com/istio/istio"
WINDOWS_EXPERIMENT_ISTIO_COMMIT: Final = "e245938ea6097d077c0eacd2f466c79935615909"
WINDOWS_EXPERIMENT_ZTUNNEL_REPO: Final = "github.com/istio/ztunnel"
WINDOWS_EXPERIMENT_ZTUNNEL_COMMIT: Final = "c4094652e6ef5924132ae006622abbfc3c8ec324"
# The istio branch's VERSION file: the istiod line the pair was made against.
WINDOWS_EXPERIMENT_ISTIO_VERSION: Final = "1.30"
# Both Windows agents carry one tag naming the line and both commits, so a tag
# read off a running pod says exactly which pair it runs.
WINDOWS_AGENT_TAG: Final = (
    f"{WINDOWS_EXPERIMENT_ISTIO_VERSION}-exp."
    f"{WINDOWS_EXPERIMENT_ISTIO_COMMIT[:8]}.{WINDOWS_EXPERIMENT_ZTUNNEL_COMMIT[:8]}"
)

# The command that builds and pushes every bundled image (docs/images.md).
BUILD_COMMAND: Final = "make images REGISTRY=<registry>"


def reference(registry: str, name: str, tag: str) -> str:
    """The reference `make images REGISTRY=<registry>` pushes an image under."""
    return f"{registry.rstrip('/')}/{name}:{tag}"
