"""istiod revisions and tags as a waypoint resolves them (cluster/revisions.py), literal cases.

The tag webhooks are shaped as `istioctl tag set` and the istiod chart's
`revisionTags` write them: named istio-revision-tag-<tag>, labelled
istio.io/tag and istio.io/rev.
"""

from __future__ import annotations

from typing import Any

from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.cluster.revisions import (
    RevisionChoice,
    revision_inputs,
    revision_tags,
    waypoint_revision,
    with_revision,
)
from ambient_operator.status.revisions import revisions_status


def hook(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


TAG_PROD = hook("istio-revision-tag-prod", **{"istio.io/tag": "prod", "istio.io/rev": "canary"})
TAG_DEFAULT = hook(
    "istio-revision-tag-default", **{"istio.io/tag": "default", "istio.io/rev": "stable"}
)
TAGS = revision_tags([TAG_PROD, TAG_DEFAULT])


def test_tags_come_from_the_tag_webhooks_only() -> None:
    unrelated = hook("istio-sidecar-injector", **{"istio.io/rev": "canary"})
    unlabelled = hook("istio-revision-tag-broken", **{"istio.io/tag": "broken"})
    assert revision_tags([TAG_PROD, TAG_DEFAULT, unrelated, unlabelled]) == {
        "prod": "canary",
        "default": "stable",
    }


def test_the_gateway_label_wins_then_the_namespace_then_the_mesh() -> None:
    rev = "istio.io/rev"
    assert waypoint_revision({rev: "canary"}, {rev: "stable"}, "old", {}) == RevisionChoice(
        "canary", "gateway"
    )
    assert waypoint_revision({}, {rev: "stable"}, "old", {}) == RevisionChoice(
        "stable", "namespace"
    )
    assert waypoint_revision({}, {}, "old", {}) == RevisionChoice("old", "mesh")
    assert waypoint_revision({}, {}, None, {}) == RevisionChoice(None, "mesh")


def test_a_tag_resolves_to_its_revision() -> None:
    rev = "istio.io/rev"
    choice = waypoint_revision({rev: "prod"}, {}, None, TAGS)
    assert choice == RevisionChoice("canary", "gateway", "prod")
    # `default` is a tag when istio-revision-tag-default exists...
    assert waypoint_revision({}, {rev: "default"}, None, TAGS) == RevisionChoice(
        "stable", "namespace", "default"
    )
    # ...and otherwise the istiod installed without a revision (Service istiod).
    assert waypoint_revision({}, {rev: "default"}, "canary", {}) == RevisionChoice(
        None, "namespace"
    )


def test_the_waypoint_is_rendered_with_the_revisions_service() -> None:
    spec = AmbientMeshSpec.model_validate({"istiod": {"revision": "stable"}})
    canary = with_revision(spec, RevisionChoice("canary", "gateway"))
    assert canary.istiod.service() == "istiod-canary"
    assert with_revision(spec, RevisionChoice(None, "namespace")).istiod.service() == "istiod"
    assert with_revision(spec, RevisionChoice("stable", "mesh")) is spec
    # serviceName names the agents' istiod; a Gateway's revision is dialled at its own.
    named = AmbientMeshSpec.model_validate({"istiod": {"serviceName": "my-istiod"}})
    assert with_revision(named, RevisionChoice("canary", "gateway")).istiod.service() == (
        "istiod-canary"
    )
    assert with_revision(named, RevisionChoice(None, "namespace")).istiod.service() == "istiod"
    assert with_revision(named, RevisionChoice("canary", "mesh")).istiod.service() == "my-istiod"


def test_what_waypoints_depend_on_besides_their_gateway() -> None:
    namespaces = {
        "a": {"labels": {"istio.io/rev": "prod"}},
        "b": {"labels": {"istio.io/dataplane-mode": "ambient"}},
    }
    tags = revision_tags([TAG_PROD])
    assert revision_inputs(tags, namespaces) == ((("prod", "canary"),), (("a", "prod"),))


def _deployment(name: str, image: str, rev: str | None = None) -> dict[str, Any]:
    labels = {"istio.io/rev": rev} if rev else {}
    return {
        "metadata": {"name": name, "namespace": "istio-system", "labels": labels},
        "spec": {"template": {"spec": {"containers": [{"name": "discovery", "image": image}]}}},
    }


def _gateway(ns: str, name: str, klass: str, rev: str | None = None) -> dict[str, Any]:
    labels = {"istio.io/rev": rev} if rev else {}
    return {
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {"gatewayClassName": klass},
    }


def test_status_lists_each_revision_and_who_uses_it() -> None:
    spec = AmbientMeshSpec.model_validate({"images": {"tag": "1.30.4"}})
    deployments = [
        _deployment("istiod", "docker.io/istio/pilot:1.30.4"),
        _deployment("istiod-canary", "docker.io/istio/pilot:1.32.0", "canary"),
    ]
    gateways = [
        _gateway("a", "wp", "ambient-waypoint", "prod"),
        _gateway("b", "wp", "ambient-waypoint"),
        _gateway("c", "wp", "istio-waypoint", "canary"),  # istiod's: not ours to count
        _gateway("d", "wp", "ambient-waypoint", "gone"),
    ]
    namespaces = {
        "a": {"labels": {"istio.io/rev": "prod"}},
        "b": {"labels": {}},
        "e": {"labels": {"istio.io/rev": "default"}},
    }
    out = revisions_status(
        spec, deployments, gateways, namespaces, [TAG_PROD], "docker.io/istio/proxyv2:1.30.4"
    )
    assert [r.model_dump(by_alias=True, exclude_defaults=True) for r in out] == [
        {
            "name": "canary",
            "version": "1.32.0",
            "istiod": True,
            "tags": ["prod"],
            "waypoints": 1,
            "namespaces": ["a"],
            "skew": [
                "waypoints: istiod 1.32.0 is 2 minors ahead of the agents' 1.30.4; it may be "
                "at most one ahead: upgrade the agents to 1.31 or later (the safe order is "
                "istiod first, then istio-cni and ztunnel, never more than one minor apart)"
            ],
        },
        {
            "name": "default",
            "version": "1.30.4",
            "istiod": True,
            "agents": True,
            "waypoints": 1,
            "namespaces": ["e"],
        },
        {"name": "gone", "waypoints": 1},
    ]
