"""What a take-over of Helm releases takes, keeps and refuses (apply/adopt.py), offline.

Literal objects throughout: a Helm release record's objects as Istio's
charts name them, live objects as the API server holds them after
`helm install`, and the operator's render reduced to what matters here.
The cluster test (test_adopt_helm.py) runs the same against real Helm.
"""

from __future__ import annotations

from typing import Any

import pytest

from ambient_operator.apply.adopt import (
    ADOPTED_FROM,
    Takeover,
    as_adopted,
    helm_managers,
    plan_takeover,
)
from ambient_operator.apply.held import (
    AS_IS,
    INPUTS,
    Hold,
    apply_hold,
    held,
    template_differences,
    template_digest,
)
from ambient_operator.apply.plan import Owner
from ambient_operator.cluster.helm_releases import (
    HelmRelease,
    ReleaseObject,
    ReleaseRecordError,
    manifest_objects,
    parse_record,
)

NS = "istio-system"
OWNER = Owner("ambientoperator.io/v1alpha1", "AmbientMesh", "default", "mesh-uid")
DS_KEY = ("apps/v1", "DaemonSet", NS, "ztunnel")
SA_KEY = ("v1", "ServiceAccount", NS, "ztunnel")
RENDERED = {DS_KEY, SA_KEY, ("v1", "ConfigMap", NS, "istio-cni-config")}


def helm_meta(name: str, release: str = "ztunnel", uid: str = "u-1") -> dict[str, Any]:
    return {
        "name": name,
        "namespace": NS,
        "uid": uid,
        "resourceVersion": "7",
        "labels": {"app.kubernetes.io/managed-by": "Helm", "app": "ztunnel"},
        "annotations": {
            "meta.helm.sh/release-name": release,
            "meta.helm.sh/release-namespace": NS,
        },
    }


def helm_ds(uid: str = "u-1") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": helm_meta("ztunnel", uid=uid),
        "spec": {
            "selector": {"matchLabels": {"app": "ztunnel"}},
            "template": {
                "metadata": {
                    "creationTimestamp": None,
                    "labels": {"app": "ztunnel", "sidecar.istio.io/inject": "false"},
                },
                "spec": {"containers": [{"name": "istio-proxy", "image": "istio/ztunnel:1.31.0"}]},
            },
        },
        "status": {"currentNumberScheduled": 2},
    }


def helm_sa() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": helm_meta("ztunnel")}


def release(*objects: ReleaseObject, chart: str = "ztunnel") -> HelmRelease:
    return HelmRelease(
        name="ztunnel",
        namespace=NS,
        version=1,
        status="deployed",
        chart=chart,
        chart_version="1.31.0",
        app_version="1.31.0",
        values={},
        objects=tuple(objects),
        record="sh.helm.release.v1.ztunnel.v1",
    )


ZTUNNEL = release(
    ReleaseObject("v1", "ServiceAccount", NS, "ztunnel"),
    ReleaseObject("apps/v1", "DaemonSet", NS, "ztunnel"),
)
LIVE = {DS_KEY: helm_ds(), SA_KEY: helm_sa()}


def rendered_ds(image: str = "gcr.io/istio-release/ztunnel:1.31.0") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "ztunnel", "namespace": NS, "labels": {"app": "ztunnel"}},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "ztunnel"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "ztunnel"}},
                "spec": {"containers": [{"name": "istio-proxy", "image": image}]},
            },
        },
    }


def test_a_release_whose_objects_carry_its_metadata_is_taken() -> None:
    plan = plan_takeover(["ztunnel"], NS, {"ztunnel": ZTUNNEL}, LIVE, RENDERED, OWNER)
    assert plan.refused == ()
    assert sorted(plan.taken) == sorted([DS_KEY, SA_KEY])
    assert plan.allows(helm_ds()) == "ztunnel"
    # Another object under the same name (deleted and made again) is not what was checked.
    assert plan.allows(helm_ds(uid="u-2")) is None


def test_a_missing_release_is_refused_unless_its_objects_were_taken_before() -> None:
    plan = plan_takeover(["ztunnel", "istio-cni"], NS, {"ztunnel": ZTUNNEL}, LIVE, RENDERED, OWNER)
    assert plan.refused == (
        "Helm release istio-system/istio-cni: not found (no Secret "
        "sh.helm.release.v1.istio-cni.v<N> with status deployed in the namespace)",
    )
    assert plan.taken == {}
    assert plan.allows(helm_ds()) is None
    again = plan_takeover(
        ["ztunnel", "istio-cni"],
        NS,
        {"ztunnel": ZTUNNEL},
        LIVE,
        RENDERED,
        OWNER,
        taken_before={"istio-cni"},
    )
    assert again.refused == ()
    assert sorted(again.taken) == sorted([DS_KEY, SA_KEY])


def test_a_release_of_another_chart_is_refused() -> None:
    plan = plan_takeover(
        ["ztunnel"], NS, {"ztunnel": release(chart="nginx")}, LIVE, RENDERED, OWNER
    )
    assert plan.refused == (
        "Helm release istio-system/ztunnel: is of chart nginx, not Istio's ztunnel or "
        "istio-cni (cni)",
    )


def test_rbac_not_rendered_is_left_with_helm_and_anything_else_refused() -> None:
    rbac = ReleaseObject("rbac.authorization.k8s.io/v1", "ClusterRole", None, "istio-cni-ambient")
    extra = ReleaseObject("v1", "Secret", NS, "ztunnel-extra")
    left = plan_takeover(
        ["ztunnel"], NS, {"ztunnel": release(*ZTUNNEL.objects, rbac)}, LIVE, RENDERED, OWNER
    )
    assert left.refused == ()
    assert left.left_with_helm == ("ClusterRole istio-cni-ambient",)
    refused = plan_takeover(
        ["ztunnel"], NS, {"ztunnel": release(*ZTUNNEL.objects, extra)}, LIVE, RENDERED, OWNER
    )
    assert refused.refused == (
        "Secret istio-system/ztunnel-extra: in Helm release istio-system/ztunnel, and the "
        "operator renders no such object (take it out of the release, or leave the release to "
        "Helm)",
    )
    assert refused.taken == {}


def test_an_object_of_the_record_without_the_release_metadata_is_refused() -> None:
    stranger = helm_sa()
    stranger["metadata"]["annotations"]["meta.helm.sh/release-name"] = "other"
    plan = plan_takeover(
        ["ztunnel"], NS, {"ztunnel": ZTUNNEL}, {**LIVE, SA_KEY: stranger}, RENDERED, OWNER
    )
    assert plan.refused == (
        "ServiceAccount istio-system/ztunnel: in Helm release istio-system/ztunnel's record, "
        "but its ownership metadata names release istio-system/other: Helm would not manage it "
        "either",
    )
    assert plan.taken == {}


def test_an_object_claiming_a_release_outside_its_record_refuses_the_take_over() -> None:
    stray = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": helm_meta("team-config")}
    plan = plan_takeover(
        ["ztunnel"], NS, {"ztunnel": ZTUNNEL}, LIVE, RENDERED, OWNER, labelled=[stray, LIVE[SA_KEY]]
    )
    assert plan.refused == (
        "ConfigMap istio-system/team-config: carries Helm release istio-system/ztunnel's "
        "ownership metadata but is not in its record, so Helm did not make it; remove that "
        "metadata or the object",
    )
    assert plan.taken == {}


def _written(
    rendered: dict[str, Any], live: dict[str, Any], taking: str | None, inputs: str
) -> Any:
    """What the data-plane pass writes over `live`: apply/adopt.py's form, then the hold rule."""
    out = dict(as_adopted(rendered, live, taking))
    hold = Hold(inputs, "0.2.0")
    return apply_hold(out, live, hold, held(out, live, hold, taking=taking is not None))


def test_a_daemonset_taken_keeps_its_template_until_the_user_changes_something() -> None:
    live = helm_ds()
    first = _written(rendered_ds(), live, "ztunnel", "inputs-1")
    assert first["spec"]["selector"] == {"matchLabels": {"app": "ztunnel"}}
    assert first["spec"]["template"] == {
        "metadata": {"labels": {"app": "ztunnel", "sidecar.istio.io/inject": "false"}},
        "spec": {"containers": [{"name": "istio-proxy", "image": "istio/ztunnel:1.31.0"}]},
    }
    # Held at the render as it will roll: with Helm's selector labels added.
    rolled_form = {
        "metadata": {"labels": {"app.kubernetes.io/name": "ztunnel", "app": "ztunnel"}},
        "spec": {
            "containers": [{"name": "istio-proxy", "image": "gcr.io/istio-release/ztunnel:1.31.0"}]
        },
    }
    assert first["metadata"]["annotations"][AS_IS] == template_digest(
        {"spec": {"template": rolled_form}}
    )
    assert first["metadata"]["annotations"][ADOPTED_FROM] == "ztunnel"
    assert first["metadata"]["annotations"][INPUTS] == "inputs-1"
    # A later pass: the object is ours and says what the render was.
    ours = {
        **helm_ds(),
        "metadata": {**helm_meta("ztunnel"), "annotations": dict(first["metadata"]["annotations"])},
    }
    again = _written(rendered_ds(), ours, None, "inputs-1")
    assert again["spec"]["template"] == first["spec"]["template"]
    # The user changes something: the render is rolled, under Helm's selector.
    rolled = _written(rendered_ds("example.com/ztunnel:1.31.1"), ours, None, "inputs-2")
    assert AS_IS not in rolled["metadata"]["annotations"]
    assert rolled["metadata"]["annotations"][ADOPTED_FROM] == "ztunnel"
    assert rolled["spec"]["selector"] == {"matchLabels": {"app": "ztunnel"}}
    assert rolled["spec"]["template"] == {
        "metadata": {"labels": {"app.kubernetes.io/name": "ztunnel", "app": "ztunnel"}},
        "spec": {"containers": [{"name": "istio-proxy", "image": "example.com/ztunnel:1.31.1"}]},
    }


def test_an_object_never_taken_is_written_as_rendered() -> None:
    assert as_adopted(rendered_ds(), None, None) == rendered_ds()
    ours = helm_ds()
    ours["metadata"]["annotations"] = {}
    assert as_adopted(rendered_ds(), ours, None) == rendered_ds()


def test_template_differences_name_fields_by_container_and_variable() -> None:
    running = {
        "metadata": {"labels": {"app": "ztunnel"}},
        "spec": {
            "containers": [
                {"name": "istio-proxy", "env": [{"name": "A", "value": "1"}], "image": "x:1"}
            ]
        },
    }
    rendered = {
        "metadata": {"labels": {"app": "ztunnel", "app.kubernetes.io/name": "ztunnel"}},
        "spec": {
            "containers": [
                {"name": "istio-proxy", "env": [{"name": "A", "value": "2"}], "image": "x:1"}
            ]
        },
    }
    assert template_differences(running, rendered) == [
        "metadata.labels.app.kubernetes.io/name",
        "spec.containers[istio-proxy].env[A].value",
    ]
    assert template_differences(running, running) == []


def test_helm_is_found_by_what_it_wrote_not_by_its_name() -> None:
    obj = {
        "metadata": {
            "managedFields": [
                {
                    "manager": "helm3",
                    "operation": "Update",
                    "fieldsV1": {
                        "f:metadata": {"f:annotations": {"f:meta.helm.sh/release-name": {}}}
                    },
                },
                {"manager": "kube-controller-manager", "operation": "Update", "fieldsV1": {}},
            ]
        }
    }
    assert helm_managers(obj) == frozenset({"helm3"})


def test_an_empty_takeover_allows_nothing() -> None:
    assert Takeover().allows(helm_ds()) is None


def _record(payload: str | None) -> dict[str, Any]:
    data = {} if payload is None else {"release": payload}
    return {
        "metadata": {"name": "sh.helm.release.v1.ztunnel.v1", "namespace": NS},
        "type": "helm.sh/release.v1",
        "data": data,
    }


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (None, "no `release` key"),
        ("not base64!", "not a Helm release record"),
        # base64 of base64 of "[1]": JSON, but not a release.
        ("V3pGZA==", "not a Helm release record (not a JSON object)"),
    ],
    ids=["no-key", "not-base64", "not-an-object"],
)
def test_a_record_that_cannot_be_read_is_an_error_naming_its_secret(
    payload: str | None, why: str
) -> None:
    with pytest.raises(ReleaseRecordError) as caught:
        parse_record(_record(payload))
    assert str(caught.value).startswith(f"Secret {NS}/sh.helm.release.v1.ztunnel.v1: {why}")


def test_a_manifest_object_without_a_namespace_is_in_the_release_namespace() -> None:
    manifest = (
        "---\n# Source: ztunnel/templates/serviceaccount.yaml\napiVersion: v1\n"
        "kind: ServiceAccount\nmetadata:\n  name: ztunnel\n---\n"
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n"
        "  name: istio-cni\n"
    )
    assert manifest_objects(manifest, NS, "r") == (
        ReleaseObject("v1", "ServiceAccount", NS, "ztunnel"),
        ReleaseObject("rbac.authorization.k8s.io/v1", "ClusterRole", None, "istio-cni"),
    )


def test_what_the_api_server_defaulted_is_not_a_difference() -> None:
    running = {
        "metadata": {"labels": {"app": "ztunnel", "helm.sh/chart": "ztunnel-1.31.0"}},
        "spec": {
            "dnsPolicy": "ClusterFirst",
            "containers": [
                {
                    "name": "istio-proxy",
                    "imagePullPolicy": "IfNotPresent",
                    "terminationMessagePath": "/dev/termination-log",
                    "env": [
                        {"name": "HELM_ONLY", "value": "1"},
                        {
                            "name": "POD_NAME",
                            "valueFrom": {
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}
                            },
                        },
                    ],
                }
            ],
        },
    }
    rendered = {
        "metadata": {"labels": {"app": "ztunnel"}},
        "spec": {
            "containers": [
                {
                    "name": "istio-proxy",
                    "env": [
                        {
                            "name": "POD_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                        }
                    ],
                }
            ]
        },
    }
    # The Helm label and the Helm-only variable go with the next change; the defaults stay.
    assert template_differences(running, rendered) == [
        "metadata.labels.helm.sh/chart",
        "spec.containers[istio-proxy].env[HELM_ONLY]",
    ]
