"""Versions on a live control plane with upstream's istiod: skew both ways, and the order.

Istio is installed from its own charts by the real helm and istiod runs
(`IstioControlPlane`, as in test_istiod.py); its version is changed the way a
user changes it, `helm upgrade` with another tag, so the Deployment the
operator reads is the one upstream's chart makes. The nodes are the sample
mixed inventory (kwok): three Linux, one WS2022, one WS2025, one WS2019.

The rollout is observed through one watch of the agents' DaemonSets, whose
events come in resourceVersion order: what each DaemonSet's image and status
were, in the order the API server changed them.

Tests in this module run in order against one operator process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client, watch

from ambient_devcluster import (
    IstioControlPlane,
    LocalCluster,
    apply_dirs,
    apply_objects,
    cluster_dns_service,
    create_nodes,
)
from ambient_devcluster.harness import condition, get_mesh, set_mesh_spec
from conftest import BIN_DIR, SAMPLE_NODES, binaries_present, wait_for
from operator_harness import RunningOperator, full_passes_finished

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "operator" / "ambient_operator" / "samples" / "ambientmesh.yaml"
NS = "istio-system"
SELECTOR = "app.kubernetes.io/managed-by=ambient-operator,ambientoperator.io/controller=dataplane"
TIMEOUT = 180.0
LINUX = ("istio-cni-node", "ztunnel")
WS2022 = ("istio-cni-node-windows-ltsc2022", "ztunnel-windows-ltsc2022")
WS2025 = ("istio-cni-node-windows-ltsc2025", "ztunnel-windows-ltsc2025")


def _mesh_spec(tag: str) -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())["spec"]
    spec["images"]["tag"] = tag
    spec["images"]["ztunnel"]["windows"] = f"registry.example.com/istio/ztunnel-windows:{tag}"
    spec["images"]["istioCni"]["windows"] = f"registry.example.com/istio/install-cni-windows:{tag}"
    return spec


@pytest.fixture(scope="module")
def version_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A control plane of our own: the sample nodes, our CRDs, a cluster DNS Service."""
    if not binaries_present() or not (BIN_DIR / "pilot-discovery").exists():
        pytest.fail(f"binaries missing in {BIN_DIR}; run hack/build-binaries.sh")
    with LocalCluster(tmp_path_factory.mktemp("versions-cluster"), bin_dir=BIN_DIR) as local:
        with local.api_client() as api:
            apply_dirs(api, [ROOT / "crds"], timeout=60)
            create_nodes(api, SAMPLE_NODES, timeout=60)
            apply_objects(api, [cluster_dns_service()])
        yield local


@pytest.fixture(scope="module")
def istio(
    version_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[IstioControlPlane]:
    """Istio 1.30.4 from its charts (the image tag the chart's `global.tag` sets), running."""
    plane = IstioControlPlane(
        version_cluster.kubeconfig,
        tmp_path_factory.mktemp("versions-istiod"),
        BIN_DIR,
        values={"global.tag": "1.30.4"},
    )
    with plane:
        yield plane
    assert "panic:" not in plane.log_file.read_text(errors="replace")


@pytest.fixture(scope="module")
def api(version_cluster: LocalCluster) -> Iterator[client.ApiClient]:
    """Admin client of the module's cluster."""
    with version_cluster.api_client() as admin:
        yield admin


@pytest.fixture(scope="module")
def operator(
    version_cluster: LocalCluster,
    istio: IstioControlPlane,
    api: client.ApiClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunningOperator]:
    """The operator beside istiod, the sample AmbientMesh at 1.30.4."""
    op = RunningOperator(version_cluster, tmp_path_factory.mktemp("versions-operator"))
    with op.running():
        body = yaml.safe_load(SAMPLE.read_text())
        body["spec"] = _mesh_spec("1.30.4")
        apply_objects(api, [body])
        yield op
    assert "Traceback" not in op.log_text(), op.log_text()[-4000:]


def _upgrade_istiod(istio: IstioControlPlane, tag: str) -> None:
    """`helm upgrade` of the istiod release with another image tag, as a user would."""
    istio.values["global.tag"] = tag
    istio.install()


def _istiod_image(api: client.ApiClient) -> str:
    dep = client.AppsV1Api(api).read_namespaced_deployment("istiod", NS)
    (container,) = [c for c in dep.spec.template.spec.containers if c.name == "discovery"]
    return str(container.image)


def _degraded_with(api: client.ApiClient, reason: str, *fragments: str) -> dict[str, Any] | None:
    cond = condition(get_mesh(api), "Degraded")
    message = str(cond.get("message", ""))
    if cond.get("reason") == reason and all(f in message for f in fragments):
        return cond
    return None


def _control_plane(api: client.ApiClient) -> str | None:
    return ((get_mesh(api).get("status") or {}).get("versions") or {}).get("controlPlane")


def test_skew_is_detected_both_ways(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    # The chart's ambient profile adds its variant to the tag.
    assert _istiod_image(api) == "registry.istio.io/testing/pilot:1.30.4-distroless"
    wait_for(lambda: _control_plane(api) == "1.30.4-distroless", TIMEOUT, "istiod read")
    # The sample nodes include WS2019: UnsupportedNodes, and no skew.
    cond = wait_for(lambda: _degraded_with(api, "UnsupportedNodes"), TIMEOUT, "UnsupportedNodes")
    assert "VersionSkew" not in cond["message"] and "minors ahead" not in cond["message"]

    # istiod two minors ahead of the agents.
    _upgrade_istiod(istio, "1.32.0")
    assert _istiod_image(api) == "registry.istio.io/testing/pilot:1.32.0-distroless"
    ahead = wait_for(
        lambda: _degraded_with(
            api, "VersionSkew", "istiod 1.32.0-distroless is 2 minors ahead of the agents' 1.30.4"
        ),
        TIMEOUT,
        "VersionSkew, istiod ahead",
    )
    message = ahead["message"]
    for name in (*LINUX, *WS2022, *WS2025):
        assert name in message
    assert "istiod first, then istio-cni and ztunnel" in message
    # The cause told first, and the unsupported WS2019 node still said after it.
    assert message.index("minors ahead") < message.index("win2019-1")
    assert _control_plane(api) == "1.32.0-distroless"

    # istiod behind the agents.
    _upgrade_istiod(istio, "1.29.1")
    behind = wait_for(
        lambda: _degraded_with(
            api, "VersionSkew", "the agents' 1.30.4 is newer than istiod 1.29.1-distroless"
        ),
        TIMEOUT,
        "VersionSkew, agents ahead",
    )
    assert "upgrade istiod to 1.30 first" in behind["message"]

    # One minor ahead is supported.
    _upgrade_istiod(istio, "1.31.0")
    wait_for(lambda: _degraded_with(api, "UnsupportedNodes"), TIMEOUT, "skew gone")
    assert "newer than" not in condition(get_mesh(api), "Degraded")["message"]


# -- the order of a version change ---------------------------------------------------------


class Recorder:
    """One watch's events, in the API server's order, on a thread of its own."""

    def __init__(self, list_call: Any, *args: Any, **kwargs: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self._call, self._args, self._kwargs = list_call, args, kwargs
        self._stop = threading.Event()
        self._error: BaseException | None = None
        first = list_call(*args, **kwargs)
        self._version = first["metadata"]["resourceVersion"]
        self.initial = list(first["items"])
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Recorder:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                # Short server-side timeouts so a stop is seen within seconds.
                stream = watch.Watch().stream(
                    self._call,
                    *self._args,
                    resource_version=self._version,
                    timeout_seconds=3,
                    allow_watch_bookmarks=False,
                    **self._kwargs,
                )
                for event in stream:
                    obj = event["object"]
                    self._version = obj["metadata"]["resourceVersion"]
                    self.events.append({"type": event["type"], "object": obj})
        except BaseException as exc:  # re-raised in the test's thread
            self._error = exc


def _list_daemonsets(api: client.ApiClient) -> Any:
    apps = client.AppsV1Api(api)

    def call(**kwargs: Any) -> Any:
        resp = apps.list_namespaced_daemon_set(NS, label_selector=SELECTOR, **kwargs)
        # A watch reads the raw stream; without a return type named in this
        # function's docstring, its objects come as dicts, like this list's.
        return resp if kwargs.get("watch") else api.sanitize_for_serialization(resp)

    return call


def _list_meshes(api: client.ApiClient) -> Any:
    custom = client.CustomObjectsApi(api)

    def call(**kwargs: Any) -> Any:
        return custom.list_cluster_custom_object(
            "ambientoperator.io", "v1alpha1", "ambientmeshes", **kwargs
        )

    return call


def _image(ds: dict[str, Any]) -> str:
    return str(ds["spec"]["template"]["spec"]["containers"][0]["image"])


def settled(ds: dict[str, Any]) -> bool:
    """The controller saw its latest spec, and every pod is updated and available."""
    st = ds.get("status") or {}
    desired = st.get("desiredNumberScheduled", 0)
    return bool(
        st.get("observedGeneration", 0) >= ds["metadata"]["generation"]
        and desired > 0
        and st.get("updatedNumberScheduled", 0) == desired
        and st.get("numberAvailable", 0) == desired
    )


def _ready_at(ds: dict[str, Any], tag: str) -> bool:
    """Ready at a version: its image has the tag, and every pod is updated and available."""
    return _image(ds).endswith(f":{tag}") and settled(ds)


def _timeline(initial: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The state of every DaemonSet after each event (the first entry: before any)."""
    state = {ds["metadata"]["name"]: ds for ds in initial}
    out = [dict(state)]
    for event in events:
        obj = event["object"]
        if event["type"] == "DELETED":
            state.pop(obj["metadata"]["name"], None)
        else:
            state[obj["metadata"]["name"]] = obj
        out.append(dict(state))
    return out


def _first(timeline: list[dict[str, Any]], test: Any) -> int:
    found = [i for i, state in enumerate(timeline) if test(state)]
    return found[0] if found else -1


def _all_ready(api: client.ApiClient, tag: str) -> bool:
    mesh = get_mesh(api)
    ready = condition(mesh, "Ready")
    if ready.get("status") != "True" or ready.get("observedGeneration") != mesh["metadata"].get(
        "generation"
    ):
        return False
    items = _list_daemonsets(api)()["items"]
    return len(items) == 6 and all(_ready_at(ds, tag) for ds in items)


def _assert_linux_first(daemonsets: Recorder, old_images: set[str], new: str) -> None:
    """The DaemonSets changed and became Ready at `new` in order: Linux, WS2022, WS2025.

    Until its turn each Windows DaemonSet kept `old_images`.
    """
    timeline = _timeline(daemonsets.initial, daemonsets.events)

    def ready(names: tuple[str, ...]) -> Any:
        return lambda state: all(n in state and _ready_at(state[n], new) for n in names)

    def changed(names: tuple[str, ...]) -> Any:
        return lambda state: any(n in state and _image(state[n]).endswith(f":{new}") for n in names)

    linux_ready, ws2022_ready = _first(timeline, ready(LINUX)), _first(timeline, ready(WS2022))
    linux_changed = _first(timeline, changed(LINUX))
    ws2022_changed, ws2025_changed = (
        _first(timeline, changed(WS2022)),
        _first(timeline, changed(WS2025)),
    )
    seen = [(e["object"]["metadata"]["name"], _image(e["object"])) for e in daemonsets.events]
    assert 0 < linux_changed < linux_ready, seen
    # No Windows DaemonSet changes before both Linux ones are Ready at the new version...
    assert linux_ready < ws2022_changed, seen
    # ...and WS2025 waits for WS2022 likewise.
    assert ws2022_changed < ws2022_ready < ws2025_changed, seen
    for state in timeline[:ws2022_changed]:
        assert {_image(state[n]) for n in (*WS2022, *WS2025)} == old_images


def _roll(api: client.ApiClient, old: str, new: str) -> Recorder:
    """Set the sample's tag from `old` to `new`, wait for every DaemonSet Ready at it, and
    check the order (Linux, WS2022, WS2025); the AmbientMesh's recorded changes."""
    with (
        Recorder(_list_daemonsets(api)) as daemonsets,
        Recorder(_list_meshes(api)) as meshes,
    ):
        set_mesh_spec(api, _mesh_spec(new))
        wait_for(lambda: _all_ready(api, new), TIMEOUT, f"every DaemonSet Ready at {new}")
    _assert_linux_first(
        daemonsets,
        {
            f"registry.example.com/istio/install-cni-windows:{old}",
            f"registry.example.com/istio/ztunnel-windows:{old}",
        },
        new,
    )
    return meshes


def test_a_version_change_rolls_linux_first_then_each_windows_build(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    old, new = "1.30.4", "1.31.0"
    # The safe order: istiod first (a no-op after the test before).
    _upgrade_istiod(istio, "1.31.0")
    assert _istiod_image(api).endswith(":1.31.0-distroless")
    wait_for(lambda: _all_ready(api, old), TIMEOUT, f"every DaemonSet Ready at {old}")

    meshes = _roll(api, old, new)

    # The status said which platform was rolling, in that order, and what Windows nodes lose.
    rolling: list[str] = []
    windows_said = False
    for event in meshes.events:
        status = event["object"].get("status") or {}
        platform = (status.get("versions") or {}).get("rolling")
        if platform and (not rolling or rolling[-1] != platform):
            rolling.append(platform)
        message = condition(event["object"], "Reconciled").get("message", "")
        if platform == "10.0.20348":
            assert (status["versions"]["waiting"]) in ([], ["10.0.26100"])
            windows_said = windows_said or "INPOD_PORT_REUSE=false" in message
        if platform == "linux":
            assert status["versions"]["waiting"] == ["10.0.20348", "10.0.26100"]
            assert "keep the images they run until Linux is Ready" in message
    assert rolling == ["linux", "10.0.20348", "10.0.26100"]
    assert windows_said
    final = get_mesh(api)["status"]["versions"]
    # 1.31.1 is the newest 1.31 patch api/releases.py knows.
    assert final == {
        "controlPlane": "1.31.0-distroless",
        "dataPlane": new,
        "source": "spec",
        "newestPatch": "1.31.1",
        "waiting": [],
        "previous": old,
        "revision": "default",
    }


def test_returning_the_tag_rolls_back_linux_first_and_says_so(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    was, back = "1.31.0", "1.30.4"  # where the test before left the agents, and its start
    wait_for(lambda: _all_ready(api, was), TIMEOUT, f"every DaemonSet Ready at {was}")
    meshes = _roll(api, was, back)
    said = {
        condition(e["object"], "Reconciled").get("message", "").split("; ")[1]
        for e in meshes.events
        if ((e["object"].get("status") or {}).get("versions") or {}).get("rollback")
    }
    assert said == {
        "rolling the agents back from 1.31.0 to 1.30.4, in the same order as a change: Linux, "
        "then each Windows build"
    }, said
    assert _versions(api)["previous"] == was and "rollback" not in _versions(api)


def _follow_spec() -> dict[str, Any]:
    """The sample without a tag; Windows images named by it (`<hub>/ztunnel-windows:<tag>`).

    Without its registry too: the images `make images` pushes there carry the
    experiment pair's tag, not istiod's.
    """
    spec: dict[str, Any] = yaml.safe_load(SAMPLE.read_text())["spec"]
    for key in ("tag", "registry", "ztunnel", "istioCni"):
        spec["images"].pop(key, None)
    return spec


def _versions(api: client.ApiClient) -> dict[str, Any]:
    return dict((get_mesh(api).get("status") or {}).get("versions") or {})


def test_with_the_tag_unset_the_agents_follow_istiod_linux_first(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    old, new = "1.31.0", "1.31.1"
    assert _istiod_image(api).endswith(f":{old}-distroless")  # the test before left it there
    set_mesh_spec(api, _follow_spec())
    wait_for(lambda: _all_ready(api, old), TIMEOUT, f"every DaemonSet Ready at istiod's {old}")
    assert _versions(api)["source"] == "istiod"
    with (
        Recorder(_list_daemonsets(api)) as daemonsets,
        Recorder(_list_meshes(api)) as meshes,
    ):
        _upgrade_istiod(istio, new)
        wait_for(lambda: _all_ready(api, new), TIMEOUT, f"every DaemonSet Ready at istiod's {new}")
    _assert_linux_first(
        daemonsets,
        {
            f"docker.io/istio/install-cni-windows:{old}",
            f"docker.io/istio/ztunnel-windows:{old}",
        },
        new,
    )
    said = [
        condition(e["object"], "Reconciled").get("message", "")
        for e in meshes.events
        if ((e["object"].get("status") or {}).get("versions") or {}).get("rolling") == "linux"
    ]
    assert any(
        f"the agents' tag follows istiod (follows istiod {new}-distroless): from {old} to {new}"
        in m
        for m in said
    ), said
    assert _versions(api) == {
        "controlPlane": f"{new}-distroless",
        "dataPlane": new,
        "source": "istiod",
        "note": f"follows istiod {new}-distroless",
        "waiting": [],
        "previous": old,
        "revision": "default",
    }


def test_a_set_tag_stays_put_when_istiod_moves(
    api: client.ApiClient, istio: IstioControlPlane, operator: RunningOperator
) -> None:
    pinned = "1.31.1"
    spec = _follow_spec()
    spec["images"]["tag"] = pinned
    set_mesh_spec(api, spec)
    wait_for(lambda: _versions(api).get("source") == "spec", TIMEOUT, "the tag read as set")
    _upgrade_istiod(istio, "1.31.2")
    wait_for(
        lambda: _versions(api).get("controlPlane") == "1.31.2-distroless",
        TIMEOUT,
        "istiod 1.31.2 read",
    )
    # Two full passes of the data plane (the other controllers' passes and
    # status-only ones change no agent), each begun after istiod 1.31.2 was read.
    full_passes_finished(api, operator, 2, TIMEOUT)
    assert _all_ready(api, pinned)
    assert _versions(api)["dataPlane"] == pinned
