"""Ownership before every write (apply/ownership.py, apply/writer.py), against the real API server.

The rule's cases are literal objects; the writer is exercised on a live
cluster, where another party's object, a race on creation and a stale
resourceVersion are real.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from ambient_operator.api import constants as c
from ambient_operator.apply.ownership import applies_field, conflict, may_prune
from ambient_operator.apply.plan import Owner, prepare
from ambient_operator.apply.writer import NameConflictError, prune, write, write_by_name
from ambient_operator.kube.client import Kube, KubeError
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.resources import KINDS, cached_copy
from conftest import unique_name

MESH = Owner("ambientoperator.io/v1alpha1", "AmbientMesh", "default", "uid-mesh")
OTHER = Owner("gateway.networking.k8s.io/v1", "Gateway", "frontend", "uid-gw")


def _obj(**meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", **meta}}


def _ref(uid: str, controller: bool = True) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Gateway",
        "name": "g",
        "uid": uid,
        "controller": controller,
    }


APPLIED = [{"manager": c.FIELD_MANAGER, "operation": "Apply"}]


@pytest.mark.parametrize(
    ("live", "owner", "ours"),
    [
        (None, MESH, True),
        (_obj(ownerReferences=[_ref("uid-mesh")]), MESH, True),
        (_obj(ownerReferences=[_ref("uid-gw")]), MESH, False),
        # A non-controller reference to us does not make it ours.
        (_obj(ownerReferences=[_ref("uid-mesh", controller=False)]), MESH, False),
        # Our labels and even our apply entry do not make it this owner's.
        (_obj(labels={c.LABEL_MANAGED_BY: c.MANAGED_BY}, managedFields=APPLIED), MESH, False),
        (_obj(managedFields=APPLIED), None, True),
        (_obj(managedFields=[{"manager": c.FIELD_MANAGER, "operation": "Update"}]), None, False),
        (_obj(managedFields=[{"manager": "helm", "operation": "Apply"}]), None, False),
        (_obj(), None, False),
    ],
)
def test_conflict_rule(live: dict[str, Any] | None, owner: Owner | None, ours: bool) -> None:
    assert (conflict(live, owner) is None) is ours


def test_conflict_names_the_holder() -> None:
    why = conflict(_obj(namespace="team", ownerReferences=[_ref("uid-gw")]), MESH)
    assert why == (
        "ConfigMap team/x exists and is controlled by Gateway g, not by AmbientMesh default"
    )


def test_conflict_with_a_deleted_namesake_says_so() -> None:
    earlier = {"apiVersion": MESH.api_version, "kind": "AmbientMesh", "name": "default"}
    live = _obj(ownerReferences=[{**earlier, "uid": "uid-old", "controller": True}])
    assert conflict(live, MESH) == (
        "ConfigMap x exists and is controlled by an earlier AmbientMesh default (uid uid-old), "
        "which was deleted; the garbage collector has not removed it yet. If it stays, "
        "delete it and it is made again"
    )


def test_may_prune_needs_ownership_and_scope() -> None:
    ours = _obj(namespace="istio-system", ownerReferences=[_ref("uid-mesh")])
    assert may_prune(ours, MESH, {"istio-system"})
    assert not may_prune(ours, MESH, {"kube-system"})
    assert may_prune(ours, MESH, None)
    assert not may_prune(_obj(namespace="istio-system"), MESH, {"istio-system"})
    cluster_scoped = {**_obj(ownerReferences=[_ref("uid-mesh")]), "kind": "ClusterRole"}
    assert may_prune(cluster_scoped, MESH, {"istio-system"})


# -- against the API server ------------------------------------------------------------------


@pytest.fixture
def kube(k8s: client.ApiClient, cluster: Any) -> Iterator[Kube]:
    yield Kube(load_credentials(str(cluster.kubeconfig)), field_manager=c.FIELD_MANAGER)


def _real_owner(k8s: client.ApiClient, namespace: str, name: str) -> Owner:
    """An owner that exists, so the garbage collector leaves its dependents alone.

    With a made-up owner UID, kube-controller-manager deletes the objects under
    test whenever it gets to them, and a test's outcome would depend on when.
    """
    core = client.CoreV1Api(k8s)
    made = core.create_namespaced_config_map(namespace, {"metadata": {"name": name}})
    return Owner("v1", "ConfigMap", name, made.metadata.uid)


@pytest.fixture
def owner(k8s: client.ApiClient, namespace: str) -> Owner:
    return _real_owner(k8s, namespace, "owner")


def _config_map(namespace: str, name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


def test_create_claims_fields_for_apply_so_dropped_fields_go(
    kube: Kube, namespace: str, owner: Owner
) -> None:
    first = prepare(_config_map(namespace, "cm", {"a": "1", "b": "2"}), owner, "test")
    live = write(kube, first, None, owner)
    managers = [(m["manager"], m["operation"]) for m in live["metadata"]["managedFields"]]
    assert managers == [(c.FIELD_MANAGER, "Apply")]
    second = prepare(_config_map(namespace, "cm", {"a": "1"}), owner, "test")
    live = write(kube, second, live, owner)
    assert live["data"] == {"a": "1"}


def _our_managers(live: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (m["manager"], m["operation"])
        for m in live["metadata"]["managedFields"]
        if m["manager"] == c.FIELD_MANAGER
    ]


class _Counting(Kube):
    """A Kube that records the method of each request it sends."""

    def __init__(self, kube: Kube) -> None:
        super().__init__(kube.credentials, field_manager=c.FIELD_MANAGER)
        self.sent: list[str] = []

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        self.sent.append(method)
        return super().request(method, path, **kwargs)


def test_a_creation_is_one_request_and_our_apply_entry_holds_its_fields(
    kube: Kube, namespace: str, owner: Owner
) -> None:
    counting = _Counting(kube)
    first = prepare(_config_map(namespace, "cm", {"a": "1", "b": "2"}), owner, "test")
    live = write(counting, first, None, owner)
    assert counting.sent == ["PATCH"]
    assert _our_managers(live) == [(c.FIELD_MANAGER, "Apply")]
    assert applies_field(live, ("data", "b"))  # a hand-over would see it as ours to hand
    second = prepare(_config_map(namespace, "cm", {"a": "1"}), owner, "test")
    live = write(counting, second, live, owner)
    assert counting.sent == ["PATCH", "PATCH"]
    assert live["data"] == {"a": "1"}


def test_a_creation_without_an_owner_is_ours_by_its_apply_entry(kube: Kube, namespace: str) -> None:
    counting = _Counting(kube)
    body = prepare(_config_map(namespace, "cm", {"a": "1"}), None, "test")
    live = write(counting, body, None, None)
    assert counting.sent == ["PATCH"]
    assert conflict(live, None) is None


def test_a_namesake_made_after_our_cache_looked_is_not_merged_into(
    kube: Kube, k8s: client.ApiClient, namespace: str, owner: Owner
) -> None:
    """The creation's precondition fails on any object of the name, even one whose fields
    our forced apply could take: a plain server-side apply would have merged into it."""
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "cm"}})
    counting = _Counting(kube)
    body = prepare(_config_map(namespace, "cm", {"a": "1"}), owner, "test")
    with pytest.raises(NameConflictError):
        write(counting, body, None, owner)
    # The refused creation, then the read that names the holder.
    assert counting.sent == ["PATCH", "GET"]
    live = core.read_namespaced_config_map("cm", namespace)
    assert live.data is None and not live.metadata.owner_references


def test_a_claim_that_never_landed_is_made_on_the_next_update(
    kube: Kube, k8s: client.ApiClient, namespace: str, owner: Owner
) -> None:
    """A POST's entry left beside our apply entry is folded into it, so dropped fields go."""
    core = client.CoreV1Api(k8s)
    body = prepare(_config_map(namespace, "cm", {"a": "1", "b": "2", "c": "3"}), owner, "test")
    core.create_namespaced_config_map(namespace, body, field_manager=c.FIELD_MANAGER)
    # An apply of ours that no longer sets c: the POST's entry still holds it.
    kube.apply(prepare(_config_map(namespace, "cm", {"a": "1", "b": "2"}), owner, "test"))
    live = kube.get(KINDS[("v1", "ConfigMap")], "cm", namespace)
    assert live is not None
    assert sorted(_our_managers(live)) == [(c.FIELD_MANAGER, "Apply"), (c.FIELD_MANAGER, "Update")]
    assert set(live["data"]) == {"a", "b", "c"}
    third = prepare(_config_map(namespace, "cm", {"a": "1"}), owner, "test")
    live = write(kube, third, live, owner)
    assert live["data"] == {"a": "1"}
    assert _our_managers(live) == [(c.FIELD_MANAGER, "Apply")]


def test_someone_elses_object_is_never_written_or_pruned(
    kube: Kube, k8s: client.ApiClient, namespace: str, owner: Owner
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "theirs"}, "data": {"db": "secret-ish"}}
    )
    ours = prepare(_config_map(namespace, "theirs", {"db": "ours"}), owner, "test")
    # Our cache has not seen it: the create finds it and refuses to take it over.
    with pytest.raises(NameConflictError) as refused:
        write(kube, ours, None, owner)
    assert "ConfigMap" in refused.value.message and "theirs" in refused.value.message
    live = core.read_namespaced_config_map("theirs", namespace)
    assert live.data == {"db": "secret-ish"}
    assert not live.metadata.owner_references
    # Labelled as if ours: still refused, and never pruned.
    core.patch_namespaced_config_map(
        "theirs", namespace, {"metadata": {"labels": {c.LABEL_MANAGED_BY: c.MANAGED_BY}}}
    )
    labelled = kube.get(KINDS[("v1", "ConfigMap")], "theirs", namespace)
    with pytest.raises(NameConflictError):
        write(kube, ours, labelled, owner)
    assert labelled is not None and not prune(kube, labelled, owner, None)
    assert core.read_namespaced_config_map("theirs", namespace).data == {"db": "secret-ish"}


def test_stale_resource_version_is_refreshed_and_ownership_rechecked(
    kube: Kube, k8s: client.ApiClient, namespace: str, owner: Owner
) -> None:
    created = write(
        kube, prepare(_config_map(namespace, "cm", {"a": "1"}), owner, "t"), None, owner
    )
    core = client.CoreV1Api(k8s)
    them = _real_owner(k8s, namespace, "them")
    # Somebody else takes the controller reference away after our cache saw it.
    # A merge patch replaces the list: theirs is then the only controller.
    core.patch_namespaced_config_map(
        "cm",
        namespace,
        {"metadata": {"ownerReferences": [them.reference()]}},
        _content_type="application/merge-patch+json",
    )
    with pytest.raises(NameConflictError):
        write(kube, prepare(_config_map(namespace, "cm", {"a": "2"}), owner, "t"), created, owner)
    assert core.read_namespaced_config_map("cm", namespace).data == {"a": "1"}


def test_refused_create_is_a_kube_error_not_a_conflict(kube: Kube) -> None:
    bad = prepare(_config_map(unique_name("no-such-ns"), "cm", {}), OTHER, "t")
    with pytest.raises(KubeError) as failed:
        write(kube, bad, None, OTHER)
    assert failed.value.status == 404


def test_stale_resource_version_of_our_own_object_is_refreshed(
    kube: Kube, k8s: client.ApiClient, namespace: str, owner: Owner
) -> None:
    created = write(
        kube, prepare(_config_map(namespace, "cm", {"a": "1"}), owner, "t"), None, owner
    )
    core = client.CoreV1Api(k8s)
    # Somebody else's write that leaves it ours: only the resourceVersion is stale.
    core.patch_namespaced_config_map("cm", namespace, {"metadata": {"labels": {"team": "x"}}})
    live = write(
        kube, prepare(_config_map(namespace, "cm", {"a": "2"}), owner, "t"), created, owner
    )
    assert live["data"] == {"a": "2"}
    assert int(live["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert core.read_namespaced_config_map("cm", namespace).metadata.labels["team"] == "x"


def test_write_by_name_creates_updates_and_refuses_a_namesake(
    kube: Kube, k8s: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(k8s)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "theirs"}, "data": {}})
    theirs = kube.get(KINDS[("v1", "ConfigMap")], "theirs", namespace)
    with pytest.raises(NameConflictError):
        write_by_name(
            kube, prepare(_config_map(namespace, "theirs", {"a": "1"}), None, "t"), theirs
        )
    assert core.read_namespaced_config_map("theirs", namespace).data is None

    made = write_by_name(kube, prepare(_config_map(namespace, "ours", {"a": "1"}), None, "t"), None)
    assert [(m["manager"], m["operation"]) for m in made["metadata"]["managedFields"]] == [
        (c.FIELD_MANAGER, "Apply")
    ]
    again = write_by_name(
        kube, prepare(_config_map(namespace, "ours", {"a": "2"}), None, "t"), made
    )
    assert again["data"] == {"a": "2"}
    # The copy it was checked at is old now: the update is refused, not forced.
    with pytest.raises(KubeError) as stale:
        write_by_name(kube, prepare(_config_map(namespace, "ours", {"a": "3"}), None, "t"), made)
    assert stale.value.status == 409
    assert core.read_namespaced_config_map("ours", namespace).data == {"a": "2"}
    # A namesake made after our read found nothing is refused, not merged into.
    with pytest.raises(NameConflictError):
        write_by_name(kube, prepare(_config_map(namespace, "theirs", {"a": "1"}), None, "t"), None)
    assert core.read_namespaced_config_map("theirs", namespace).data is None


def test_a_cached_copy_keeps_every_manager_and_the_head_of_our_field_sets() -> None:
    ours = {
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {}}}},
    }
    live = {
        "kind": "Deployment",
        "metadata": {
            "name": "d",
            "uid": "u-1",
            "managedFields": [
                {
                    "manager": c.FIELD_MANAGER,
                    "operation": "Apply",
                    "apiVersion": "apps/v1",
                    "time": "2026-12-07T00:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": ours,
                },
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "subresource": "status",
                    "fieldsV1": {"f:status": {}},
                },
                {"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:metadata": {}}},
            ],
        },
        "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "proxy"}]}}},
    }
    kept = cached_copy(live)
    assert kept["metadata"]["managedFields"] == [
        {
            "manager": c.FIELD_MANAGER,
            "operation": "Apply",
            "apiVersion": "apps/v1",
            "fieldsV1": {
                "f:metadata": {"f:labels": {}},
                "f:spec": {"f:replicas": {}, "f:template": {}},
            },
        },
        {"manager": "kube-controller-manager", "operation": "Update", "subresource": "status"},
        {"manager": "kubectl", "operation": "Update"},
    ]
    assert kept["spec"] == live["spec"] and kept["spec"] is not live["spec"]
    assert kept["metadata"]["uid"] == "u-1"
    # What ownership reads is all there.
    assert conflict(kept, None) == conflict(live, None)
    assert applies_field(kept, ("spec", "replicas"))
    assert not applies_field(kept, ("spec", "paused"))
    # One copy of each string across the caches.
    again = cached_copy(live)
    assert (
        again["spec"]["template"]["spec"]["containers"][0]["name"]
        is (kept["spec"]["template"]["spec"]["containers"][0]["name"])
    )


def test_a_claim_from_a_cached_copy_keeps_the_fields_of_other_managers(
    kube: Kube, k8s: client.ApiClient, namespace: str, owner: Owner
) -> None:
    """The claim writes managedFields back: from the object as it is, not the cache's copy."""
    core = client.CoreV1Api(k8s)
    body = prepare(_config_map(namespace, "cm", {"a": "1", "b": "2"}), owner, "test")
    core.create_namespaced_config_map(namespace, body, field_manager=c.FIELD_MANAGER)
    core.patch_namespaced_config_map(
        "cm", namespace, {"metadata": {"labels": {"team": "x"}}}, field_manager="team-tool"
    )
    live = kube.get(KINDS[("v1", "ConfigMap")], "cm", namespace)
    assert live is not None
    cached = cached_copy(live)
    second = prepare(_config_map(namespace, "cm", {"a": "1"}), owner, "test")
    written = write(kube, second, cached, owner)
    assert written["data"] == {"a": "1"}
    assert _our_managers(written) == [(c.FIELD_MANAGER, "Apply")]
    [theirs] = [m for m in written["metadata"]["managedFields"] if m["manager"] == "team-tool"]
    assert theirs["fieldsV1"] == {"f:metadata": {"f:labels": {"f:team": {}}}}
