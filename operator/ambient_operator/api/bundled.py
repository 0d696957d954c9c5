"""The images this project builds and ships beside the operator (`make images`, docs/images.md).

One place for their names and tags: `hack/images` builds and pushes them under
`<registry>/<name>:<tag>`, and the operator resolves the same names from the one
registry the user gives, so what was pushed is what the pods pull.
"""

from __future__ import annotations

from typing import Final

from ambient_operator.api import constants as c

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
# Where the user names that registry: the AmbientMesh field, and the chart's
# value that the operator takes as its default (--default-registry).
REGISTRY_FIELD: Final = "spec.images.registry"
CHART_REGISTRY_VALUE: Final = "registry"
# Istio's own hub publishes none of the images above: a reference there is a
# placeholder that no pull can resolve.
UPSTREAM_HUB: Final = "docker.io/istio"
# The same hub as Docker's tools also spell it.
UPSTREAM_HUB_ALIASES: Final = (UPSTREAM_HUB, "istio", "index.docker.io/istio")
# Tag of the operator's images when no installed package names its version
# (a source tree run without `pip install`): `make images` never pushes it.
UNVERSIONED: Final = "0.0.0-unversioned"


def operator_tag() -> str:
    """Tag of the operator's own images (the operator and redirection-wait): its version."""
    return c.operator_version() or UNVERSIONED


def reference(registry: str, name: str, tag: str) -> str:
    """The reference `make images REGISTRY=<registry>` pushes an image under."""
    return f"{registry.rstrip('/')}/{name}:{tag}"


def is_placeholder(image: str) -> bool:
    """Whether a reference names one of these images under Istio's hub, which has none."""
    name = image.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    hub, _, repository = name.rpartition("/")
    return hub in UPSTREAM_HUB_ALIASES and repository in (
        ZTUNNEL_WINDOWS,
        INSTALL_CNI_WINDOWS,
        REDIRECTION_WAIT,
    )
