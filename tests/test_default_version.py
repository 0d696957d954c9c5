"""The default Istio release is the release the pinned istio.io/istio commit is.

hack/cluster/istio/go.mod pins istio.io/istio as a pseudo-version naming a
commit; api/releases.py says which release was tagged at which commit, with
its source. The agents default to the release of the pinned commit: the
charts and the istiod every test runs are that release.
"""

from __future__ import annotations

import re

from ambient_operator.api.releases import RELEASES
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from render_cases import REPO

GO_MOD = REPO / "hack" / "cluster" / "istio" / "go.mod"
_PSEUDO = re.compile(r"^\s*require\s+istio\.io/istio\s+v\S+-\d{14}-([0-9a-f]{12})\s*$", re.M)


def pinned_commit() -> str:
    match = _PSEUDO.search(GO_MOD.read_text(encoding="utf-8"))
    assert match, f"{GO_MOD}: no `require istio.io/istio <pseudo-version>` line"
    return match.group(1)


def test_the_pinned_commit_has_a_release_row() -> None:
    commit = pinned_commit()
    rows = [r for r in RELEASES if commit.startswith(r.commit) or r.commit.startswith(commit)]
    assert len(rows) == 1, (
        f"istio.io/istio is pinned at {commit}; add the release tagged there to "
        "operator/ambient_operator/api/releases.py, with its source"
    )


def test_default_tag_is_the_release_of_the_pinned_commit() -> None:
    commit = pinned_commit()
    (row,) = [r for r in RELEASES if commit.startswith(r.commit) or r.commit.startswith(commit)]
    assert AmbientMeshSpec().images.tag == row.version


def test_the_pinned_release_is_1_31_0() -> None:
    # Literal: eed52ebb66ad (2026-08-27) was tagged 1.31.0-rc.4 and released as 1.31.0.
    assert (pinned_commit(), AmbientMeshSpec().images.tag) == ("eed52ebb66ad", "1.31.0")
