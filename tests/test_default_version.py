"""The default Istio release keeps up with the Istio the repository is pinned to.

hack/cluster/istio/go.mod pins istio.io/istio at a master commit; the VERSION
file of its charts (copied to .cache/istio/charts by hack/build-binaries.sh)
names the development line of that commit. The newest release is the line
before it, and that is what the agents should default to.
"""

from __future__ import annotations

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from render_cases import REPO

VERSION_FILE = REPO / ".cache" / "istio" / "charts" / "VERSION"


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.strip().split(".")[:2]
    return int(major), int(minor)


def test_default_tag_is_the_line_before_the_pinned_development_line() -> None:
    # A missing file is a broken setup, not a reason to skip.
    assert VERSION_FILE.is_file(), f"{VERSION_FILE} missing: run `make bins`"
    major, development = _minor(VERSION_FILE.read_text(encoding="utf-8"))
    assert _minor(AmbientMeshSpec().images.tag) == (major, development - 1)


def test_default_tag_is_the_newest_release_of_that_line() -> None:
    # 1.30.4 (2026-08-27), the newest release when master was at 1.31.
    assert AmbientMeshSpec().images.tag == "1.30.4"
