"""The default Istio release is the release the pinned istio.io/istio commit is.

hack/cluster/istio/go.mod pins istio.io/istio as a pseudo-version naming a
commit; api/releases.py says which release was tagged at which commit, with
its source. The agents default to the release of the pinned commit: the
charts and the istiod every test runs are that release.
"""

from __future__ import annotations

import re

from ambient_operator.api.releases import RELEASES, fixed_since, markdown, newest_patch
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from checks import every
from render_cases import REPO

GO_MOD = REPO / "hack" / "cluster" / "istio" / "go.mod"
_PSEUDO = re.compile(r"^\s*require\s+istio\.io/istio\s+v\S+-\d{14}-([0-9a-f]{12})\s*$", re.M)


def pinned_commit() -> str:
    match = _PSEUDO.search(GO_MOD.read_text(encoding="utf-8"))
    assert match, f"{GO_MOD}: no `require istio.io/istio <pseudo-version>` line"
    return match.group(1)


def test_the_pinned_commit_has_a_release_row() -> None:
    commit = pinned_commit()
    rows = [
        r
        for r in RELEASES
        if r.commit and (commit.startswith(r.commit) or r.commit.startswith(commit))
    ]
    assert len(rows) == 1, (
        f"istio.io/istio is pinned at {commit}; add the release tagged there to "
        "operator/ambient_operator/api/releases.py, with its source"
    )


def test_default_tag_is_the_release_of_the_pinned_commit() -> None:
    commit = pinned_commit()
    (row,) = [
        r
        for r in RELEASES
        if r.commit and (commit.startswith(r.commit) or r.commit.startswith(commit))
    ]
    assert AmbientMeshSpec().images.tag == row.version


def test_the_pinned_release_is_1_31_0() -> None:
    # Literal: eed52ebb66ad (2026-08-27) was tagged 1.31.0-rc.4 and released as 1.31.0.
    assert (pinned_commit(), AmbientMeshSpec().images.tag) == ("eed52ebb66ad", "1.31.0")


def test_the_newest_known_patch_of_each_line() -> None:
    # Literal, from the release notes the table cites.
    assert {line: newest_patch(line).version for line in ("1.29", "1.30", "1.31")} == {  # type: ignore[union-attr]
        "1.29": "1.29.8",
        "1.30": "1.30.7",
        "1.31": "1.31.1",
    }
    assert newest_patch("1.28") is None
    assert [r.version for r in fixed_since("1.30", 4)] == ["1.30.5", "1.30.6", "1.30.7"]


def test_every_release_row_says_where_it_comes_from() -> None:
    every(RELEASES, lambda r: bool(r.source), "release rows with a source")
    versions = [r.version for r in RELEASES]
    assert len(versions) == len(set(versions))
    # The fact: 1.30.5 fixes istio/istio#61020 (duplicate redirection rules).
    (row,) = [r for r in RELEASES if r.version == "1.30.5"]
    assert any("#61020" in fix for fix in row.fixes)


def test_versions_md_shows_the_table() -> None:
    page = (REPO / "docs" / "versions.md").read_text(encoding="utf-8")
    assert markdown() in page, "docs/versions.md is stale: run `make docs`"
