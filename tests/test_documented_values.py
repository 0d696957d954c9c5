"""Values the documents state, pinned exactly and on each side of every threshold.

Each expected value is the documents' own literal (quoted in the test), not
the code's constant: a test that read the constant could never fail.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from hypothesis import given, settings
from hypothesis import strategies as st

from ambient_operator.cluster.facts import NodeFacts
from ambient_operator.status import waypoints as ws
from ambient_operator.webhook import certs
from ambient_operator.webhook import decide as d
from ambient_operator.webhook.config import WebhookOptions, webhook_configuration
from conftest import examples

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def test_webhook_never_blocks_for_more_than_three_seconds() -> None:
    # docs/windows-redirection-wait.md: "failurePolicy: Ignore, timeoutSeconds: 3,
    # sideEffects: None".
    options = WebhookOptions(url="https://127.0.0.1:9443")
    config = webhook_configuration(options.client_config(b"ca"))
    assert len(config["webhooks"]) == 2
    for entry in config["webhooks"]:
        assert entry["timeoutSeconds"] == 3
        assert entry["failurePolicy"] == "Ignore"
        assert entry["sideEffects"] == "None"


WS2022_NODE = NodeFacts.from_node(
    {
        "metadata": {
            "name": "w22",
            "labels": {
                "kubernetes.io/os": "windows",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/windows-build": "10.0.20348",
            },
        }
    }
)
PINNED = {"kubernetes.io/os": "windows", "node.kubernetes.io/windows-build": "10.0.20348"}
SMALL = {"requests": {"cpu": "10m", "memory": "32Mi"}}
GUARANTEED = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "100m", "memory": "128Mi"},
}


def _injected(*resources: dict[str, Any], init: dict[str, Any] | None = None) -> dict[str, Any]:
    """Resources of our init container in a pinned WS2022 pod with these containers."""
    pod: dict[str, Any] = {
        "metadata": {"name": "p", "labels": {"istio.io/dataplane-mode": "ambient"}},
        "spec": {
            "nodeSelector": PINNED,
            "containers": [
                {"name": f"c{i}", "image": "app:1", "resources": r} for i, r in enumerate(resources)
            ],
        },
    }
    if init is not None:
        pod["spec"]["initContainers"] = [{"name": "setup", "image": "s:1", "resources": init}]
    ctx = d.Context.build({"metadata": {"name": "default"}, "spec": {}}, [WS2022_NODE])
    decision = d.decide(pod, {}, ctx)
    assert decision.inject, decision
    ours = d.mutated(pod, decision)["spec"]["initContainers"][0]
    assert ours["name"] == "ambient-redirection-wait"
    resources_: dict[str, Any] = ours["resources"]
    return resources_


def test_guaranteed_pods_get_100m_128mi_and_others_10m_32mi() -> None:
    # docs/windows-redirection-wait.md: "resources: {requests: {cpu: 10m, memory: 32Mi}}";
    # "If every container of the pod has limits equal to requests (a Guaranteed
    # pod), ours gets requests = limits = 100m/128Mi so the pod stays Guaranteed".
    equal = {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert _injected(equal) == GUARANTEED
    assert _injected(equal, equal) == GUARANTEED
    # Requests default to limits, so limits alone make a Guaranteed container.
    assert _injected({"limits": {"cpu": "1", "memory": "1Gi"}}) == GUARANTEED
    assert _injected(equal, init=equal) == GUARANTEED
    # Just off the threshold, one way or another: Burstable or BestEffort.
    off = [
        {"requests": {"cpu": "999m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1"}},
        {"limits": {"memory": "1Gi"}},
        {"requests": {"cpu": "1", "memory": "1Gi"}},
        {},
    ]
    for resources in off:
        assert _injected(resources) == SMALL, resources
        assert _injected(equal, resources) == SMALL, resources
        assert _injected(equal, init=resources) == SMALL, resources


def _expiry(pem: bytes) -> datetime:
    return x509.load_pem_x509_certificate(pem).not_valid_after_utc


def test_the_serving_certificate_is_renewed_a_month_before_expiry() -> None:
    # docs/installation.md: "renewed a month before expiry".
    hosts = ["127.0.0.1", "hook.ns.svc"]
    material = certs.generate(hosts, NOW)
    expires = _expiry(material.cert)
    month = timedelta(days=30)
    assert certs.renewal_reason(material, hosts, expires - month - MINUTE) is None
    assert certs.renewal_reason(material, hosts, expires - month + MINUTE) is not None
    assert certs.renewal_reason(material, hosts, expires - month + MINUTE) == (
        "the certificate expires soon"
    )
    # Renewed then, the new leaf is good for longer than that month again.
    renewed = certs.renewed(material, hosts, expires - month + MINUTE)
    assert renewed.ca_bundle == material.ca_bundle
    assert certs.renewal_reason(renewed, hosts, expires - month + MINUTE) is None
    assert _expiry(renewed.cert) - (expires - month + MINUTE) > month


ADDRESS = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["IPAddress", "Hostname"]),
        "value": st.sampled_from([f"10.96.0.{i}" for i in range(24)] + ["wp.ns.svc.cluster.local"]),
    }
)


def _kept(previous: list[dict[str, str]], current: list[dict[str, str]]) -> list[tuple[str, str]]:
    """docs/waypoints.md: an address once reported is never removed; "only the
    schema's limit of 16 entries can push the oldest out"."""
    order = list(dict.fromkeys((a["type"], a["value"]) for a in [*previous, *current]))
    if len(order) <= 16:
        return order
    now = {(a["type"], a["value"]) for a in current}
    oldest = [k for k in order if k not in now][: len(order) - 16]
    return [k for k in order if k not in oldest]


@settings(max_examples=examples(300))
@given(previous=st.lists(ADDRESS, max_size=24), current=st.lists(ADDRESS, max_size=3))
def test_address_limit_pushes_out_the_oldest(
    previous: list[dict[str, str]], current: list[dict[str, str]]
) -> None:
    merged = ws.merge_addresses(previous, current)
    assert [(a["type"], a["value"]) for a in merged] == _kept(previous, current)


def test_address_limit_on_its_threshold() -> None:
    ips = [{"type": "IPAddress", "value": f"10.96.0.{i}"} for i in range(20)]
    assert ws.merge_addresses(ips[:15], [ips[15]]) == ips[:16]
    assert ws.merge_addresses(ips[:16], [ips[16]]) == ips[1:17]
    assert ws.merge_addresses(ips[:16], [ips[0]]) == ips[:16]
    assert ws.merge_addresses(ips[:16], [ips[16], ips[17]]) == ips[2:18]


def test_the_dev_install_has_what_the_bench_tests_need() -> None:
    # tests/test_bench_smoke.py skips its chart tests without matplotlib; it is a
    # dev dependency (pyproject.toml), so a broken install must fail here instead.
    import matplotlib
    import matplotlib.pyplot

    assert matplotlib.pyplot.figure is not None
