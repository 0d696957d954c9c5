"""The order and the pace of a pass's writes (apply/order.py, apply/writer.patient), offline.

Which kinds go in which stage is written out here from what the API server
requires of them (a binding after its role, pods' objects before the pods'
owners); the concurrency bound is watched with a counter of writes in flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ambient_operator.apply import writer
from ambient_operator.apply.order import WRITERS, in_pass_order, write_in_order
from ambient_operator.kube.client import KubeError


def _obj(kind: str, name: str, namespace: str = "istio-system") -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta}


# In render's apply order (render/dataplane.py), bindings and DaemonSets interleaved
# with the rest as a different renderer might give them.
OBJECTS = [
    _obj("ServiceAccount", "istio-cni"),
    _obj("ClusterRoleBinding", "istio-cni", ""),
    _obj("ClusterRole", "istio-cni", ""),
    _obj("DaemonSet", "istio-cni-node"),
    _obj("ConfigMap", "istio-cni-config"),
    _obj("ResourceQuota", "istio-agents"),
    _obj("DaemonSet", "ztunnel"),
    _obj("ServiceAccount", "ztunnel"),
    _obj("NetworkPolicy", "ztunnel"),
]
FIRST = {
    ("ServiceAccount", "istio-cni"),
    ("ClusterRole", "istio-cni"),
    ("ConfigMap", "istio-cni-config"),
    ("ResourceQuota", "istio-agents"),
    ("ServiceAccount", "ztunnel"),
    ("NetworkPolicy", "ztunnel"),
}


def test_stages_go_one_after_the_other_and_within_a_stage_together() -> None:
    started: list[tuple[str, str]] = []
    finished: list[tuple[str, str]] = []
    in_flight = 0
    most = 0

    async def one(obj: dict[str, Any]) -> None:
        nonlocal in_flight, most
        what = (obj["kind"], obj["metadata"]["name"])
        started.append(what)
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0)  # yield: the others of the stage start meanwhile
        in_flight -= 1
        finished.append(what)

    asyncio.run(write_in_order(OBJECTS, one))
    assert set(started[:6]) == FIRST
    assert started[6:] == [
        ("ClusterRoleBinding", "istio-cni"),
        ("DaemonSet", "istio-cni-node"),
        ("DaemonSet", "ztunnel"),
    ]
    # Nothing of a stage starts before the stage before it finished.
    assert set(finished[:6]) == FIRST
    assert most == 6  # the six of the first stage at once: WRITERS allows it
    assert WRITERS == 6


def test_no_more_than_the_bound_are_in_flight() -> None:
    many = [_obj("ConfigMap", f"cm-{i}") for i in range(20)]
    in_flight = 0
    most = 0
    done = 0

    async def one(obj: dict[str, Any]) -> None:
        nonlocal in_flight, most, done
        in_flight += 1
        most = max(most, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        done += 1

    asyncio.run(write_in_order(many, one, limit=4))
    assert (most, done) == (4, 20)


def test_a_failure_stops_the_later_stages() -> None:
    seen: list[tuple[str, str]] = []

    async def one(obj: dict[str, Any]) -> None:
        seen.append((obj["kind"], obj["metadata"]["name"]))
        if obj["kind"] == "ClusterRoleBinding":
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        asyncio.run(write_in_order(OBJECTS, one))
    assert set(seen) == FIRST | {("ClusterRoleBinding", "istio-cni")}


def test_reports_come_in_the_pass_order_whatever_order_the_writes_finished_in() -> None:
    reports = [
        "ServiceAccount istio-system/ztunnel exists and is not owned by AmbientMesh default",
        "something that names no object",
        "ConfigMap istio-system/istio-cni-config exists and was not created by us",
        "ServiceAccount istio-system/istio-cni exists and is not owned by AmbientMesh default",
    ]
    assert in_pass_order(OBJECTS, reports, str) == [
        "ServiceAccount istio-system/istio-cni exists and is not owned by AmbientMesh default",
        "ConfigMap istio-system/istio-cni-config exists and was not created by us",
        "ServiceAccount istio-system/ztunnel exists and is not owned by AmbientMesh default",
        "something that names no object",
    ]
    # A name that is the start of a longer one is not taken for it.
    longer = [
        _obj("ConfigMap", "istio-cni-config-windows-ltsc2022"),
        _obj("ConfigMap", "istio-cni-config"),
    ]
    errors = [
        ("ConfigMap istio-system/istio-cni-config", "refused"),
        ("ConfigMap istio-system/istio-cni-config-windows-ltsc2022", "refused"),
    ]
    assert in_pass_order(longer, errors, lambda e: e[0]) == errors[::-1]


def test_a_429_is_waited_out_and_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(writer.time, "sleep", pauses.append)
    answers = iter([429, 429, 200])

    @writer.patient
    def request() -> str:
        code = next(answers)
        if code == 429:
            raise KubeError(429, "TooManyRequests", "slow down")
        return "written"

    assert request() == "written"
    assert pauses == [0.25, 0.5]


def test_a_429_that_does_not_end_is_the_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(writer.time, "sleep", pauses.append)
    calls = 0

    @writer.patient
    def request() -> str:
        nonlocal calls
        calls += 1
        raise KubeError(429, "TooManyRequests", "slow down")

    with pytest.raises(KubeError) as failed:
        request()
    assert failed.value.status == 429
    assert (calls, pauses) == (6, [0.25, 0.5, 1.0, 2.0, 4.0])


def test_other_refusals_are_not_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(writer.time, "sleep", pauses.append)

    @writer.patient
    def request() -> str:
        raise KubeError(409, "Conflict", "taken")

    with pytest.raises(KubeError):
        request()
    assert pauses == []
