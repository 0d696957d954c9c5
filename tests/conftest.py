"""Shared fixtures: one real local control plane per test session.

``cluster`` starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok from ``$AMBIENT_BIN_DIR`` (default ``.cache/bin``);
``k8s`` is an admin ApiClient for it; ``sample_nodes`` creates the sample
mixed Linux/Windows inventory once; ``namespace`` gives each test its own
namespace. Tests that use ``cluster`` get the ``cluster`` marker.

Property tests draw their example counts from ``examples(n)``, scaled by the
hypothesis profile ``HYPOTHESIS_PROFILE`` names: ``default`` (what
``make test`` runs), ``quick`` (a tenth, while editing) or ``thorough`` (ten
times as many). How to write a test that can fail: tests/README.md.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import (
    BINARIES,
    LocalCluster,
    api_client_for,
    apply_dirs,
    apply_objects,
    cluster_dns_service,
    create_nodes,
    default_bin_dir,
    find_processes,
    wait_processes_gone,
)
from ambient_devcluster.harness import (
    REPO_ROOT,
    SAMPLE_NODES,
    create_namespace,
    gateway_api_dir,
    wait_for,
)
from ambient_devcluster.realnode import RealNode, RealNodeError

# Re-exported: tests import them from here.
__all__ = ["BIN_DIR", "REPO_ROOT", "SAMPLE_NODES", "ignoring", "unique_name", "wait_for"]

# Examples per property test, relative to the counts the tests name.
PROFILE_SCALE = {"default": 1.0, "quick": 0.1, "thorough": 10.0}
for _profile in PROFILE_SCALE:
    settings.register_profile(
        _profile,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
if PROFILE not in PROFILE_SCALE:
    raise pytest.UsageError(f"HYPOTHESIS_PROFILE={PROFILE!r}: one of {sorted(PROFILE_SCALE)}")
settings.load_profile(PROFILE)


def examples(count: int) -> int:
    """How many examples a property test runs under the active profile."""
    return max(1, math.ceil(count * PROFILE_SCALE[PROFILE]))


@contextlib.contextmanager
def ignoring(*statuses: int) -> Iterator[None]:
    """Swallow an ApiException of these HTTP statuses only (409 "exists", 404 "gone")."""
    try:
        yield
    except ApiException as exc:
        if exc.status not in statuses:
            raise


BIN_DIR = default_bin_dir()


def binaries_present(bin_dir: Path = BIN_DIR) -> bool:
    """Whether every control-plane program is built."""
    return all((bin_dir / b).exists() for b in BINARIES)


def run_kubectl(
    args: Sequence[str], plugins: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The real kubectl with the folder `plugins` first on PATH, where it finds plugins
    (`kubectl-ambient`, `kubectl_complete-ambient`); `env` adds to the environment."""
    path = f"{plugins}{os.pathsep}{os.environ['PATH']}"
    return subprocess.run(
        [str(BIN_DIR / "kubectl"), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        env={**os.environ, **(env or {}), "PATH": path},
    )


def grant(api: client.ApiClient, user: str, rules: list[dict[str, Any]]) -> None:
    """A ClusterRole of `rules`, named after `user`, bound to that user."""
    rbac = client.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role({"metadata": {"name": user}, "rules": rules})
    group = "rbac.authorization.k8s.io"
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": user},
            "roleRef": {"apiGroup": group, "kind": "ClusterRole", "name": user},
            "subjects": [{"apiGroup": group, "kind": "User", "name": user}],
        }
    )


@contextlib.contextmanager
def own_cluster(
    tmp_path_factory: pytest.TempPathFactory, name: str, *programs: str
) -> Iterator[LocalCluster]:
    """A control plane of a module's own: our CRDs, Gateway API v1.6, the sample nodes
    and the cluster DNS Service. `programs` are more binaries the module needs."""
    missing = [p for p in programs if not (BIN_DIR / p).exists()]
    if not binaries_present() or missing:
        pytest.fail(f"binaries missing in {BIN_DIR} ({missing}); run hack/build-binaries.sh")
    with LocalCluster(tmp_path_factory.mktemp(name), bin_dir=BIN_DIR) as local:
        with local.api_client() as api:
            apply_dirs(api, [REPO_ROOT / "crds", gateway_api_dir("v1.6")], timeout=60)
            create_nodes(api, SAMPLE_NODES, timeout=60)
            apply_objects(api, [cluster_dns_service()])
        yield local


# `make test` builds the images beside the tests (hack/run_tests.py) and names,
# in STATUS_ENV, the folder where the build's end is written; a plain `pytest`
# leaves it unset.
sys.path.insert(0, str(REPO_ROOT / "hack"))
from run_tests import STATUS_ENV as IMAGES_STATUS_ENV  # noqa: E402

# A cold build of both ztunnels at the lowest priority, beside the tests, on 2 cores.
IMAGES_DEADLINE_S = 60 * 60


def images_built() -> None:
    """Barrier: the image build `make test` runs beside the tests has ended, and passed.

    The real node's pause image and the layouts tests/test_images.py reads come
    from it. Without AMBIENT_IMAGES_STATUS (pytest run by hand) the layouts in
    .cache/images are what `make images` left, and nothing waits.
    """
    folder = os.environ.get(IMAGES_STATUS_ENV)
    if not folder:
        return
    result = Path(folder) / "images.json"
    wait_for(
        result.is_file,
        IMAGES_DEADLINE_S,
        f"the image build beside the tests to end (its log: {Path(folder) / 'images.log'})",
        interval=1.0,
    )
    done = json.loads(result.read_text())
    if done["rc"] != 0:
        tail = "".join(Path(done["log"]).read_text(errors="replace").splitlines(True)[-40:])
        pytest.fail(f"the image build failed (exit {done['rc']}); {done['log']} ends:\n{tail}")


@contextlib.contextmanager
def own_node_cluster(
    tmp_path_factory: pytest.TempPathFactory, name: str, *programs: str
) -> Iterator[tuple[LocalCluster, RealNode]]:
    """`own_cluster` with a real Linux node beside the simulated ones (hack/devcluster's
    RealNode: containerd, runc, CNI, kubelet, kube-proxy, CoreDNS). One real node runs
    on the machine at a time: this waits for another to stop. A machine that cannot
    run one fails the test with the reason, never skips it."""
    # The node runs the pause image: built beside the tests by `make test`.
    images_built()
    with own_cluster(tmp_path_factory, name, *programs) as local:
        node = RealNode(local, bin_dir=BIN_DIR)
        reasons = node.missing()
        if reasons:
            pytest.fail("the real node cannot run here: " + "; ".join(reasons))
        try:
            node.start()
        except RealNodeError as exc:
            pytest.fail(f"the real node did not start: {exc}")
        try:
            yield local, node
        finally:
            node.stop()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that (transitively) uses the ``cluster`` fixture, and run their files first.

    With workers (`make test`: pytest-xdist, a file per worker at a time),
    the files that wait on a control plane take longest; sent first, they
    leave the quick offline files to fill the end of the run on whichever
    worker is free, instead of one long file running alone at the end.
    Within a file the order is kept.
    """
    waiting: set[str] = set()
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "cluster" in fixtures:
            item.add_marker(pytest.mark.cluster)
        # Modules with a control plane of their own (pc_cluster, version_cluster...)
        # wait as long, and start one more.
        if any(name.endswith("cluster") for name in fixtures):
            waiting.add(item.nodeid.split("::")[0])
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in waiting)


def _leaked(basetemp: Path) -> list[int]:
    exes = [BIN_DIR / b for b in BINARIES if (BIN_DIR / b).exists()]
    procs = find_processes(exe_in=exes, cmdline_contains=str(basetemp))
    # Detached `up` daemons are Python processes, not one of the binaries.
    procs += [
        p
        for p in find_processes(cmdline_contains=str(basetemp))
        if any("ambient_devcluster" in a for a in p.cmdline)
    ]
    return sorted({p.pid for p in procs})


@pytest.fixture(scope="session", autouse=True)
def _no_leaked_processes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """After everything else is torn down, no control-plane process started by
    this session (they all reference the session's temp dir) may remain."""
    basetemp = tmp_path_factory.getbasetemp()
    yield
    survivors = wait_processes_gone(_leaked(basetemp), timeout=15)
    if survivors:
        for pid in survivors:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"control-plane processes outlived the test session: {survivors}")


def namespaces_settled(api: client.ApiClient, timeout: float = 120.0) -> None:
    """Barrier: no namespace is Terminating.

    Earlier modules on this worker delete their namespaces on the way out and
    the namespace controller finishes that later; a test that counts pods
    cluster-wide must start after those pods are gone, or its counts drift.
    """
    core = client.CoreV1Api(api)
    wait_for(
        lambda: (
            not [
                ns.metadata.name
                for ns in core.list_namespace().items
                if (ns.status.phase if ns.status else None) == "Terminating"
            ]
        ),
        timeout,
        "namespaces deleted by earlier tests to be gone",
    )


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """The session's local control plane."""
    if not binaries_present():
        pytest.fail(f"control-plane binaries missing in {BIN_DIR}; run hack/build-binaries.sh")
    workdir = tmp_path_factory.mktemp("devcluster")
    with LocalCluster(workdir, bin_dir=BIN_DIR) as local:
        pids = list(local.pids().values())
        yield local
    leftovers = local.leftover_processes()
    assert not wait_processes_gone(pids, timeout=5) and not leftovers, (
        f"processes left after stopping the cluster: {leftovers}"
    )


@pytest.fixture(scope="session")
def k8s(cluster: LocalCluster) -> Iterator[client.ApiClient]:
    """Admin ApiClient bound to the session cluster (global config untouched)."""
    with api_client_for(cluster.kubeconfig) as api:
        yield api


@pytest.fixture(scope="session")
def sample_nodes(k8s: client.ApiClient) -> list[str]:
    """The sample inventory as Ready kwok nodes, created once per session and
    left in place; tests must not modify or delete them (add extra nodes with
    unique names instead)."""
    return create_nodes(k8s, SAMPLE_NODES, timeout=60)


def _dns_label(text: str, limit: int) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")[:limit].strip("-")


def unique_name(prefix: str) -> str:
    """A DNS-label-safe name that no other test uses."""
    return f"{_dns_label(prefix, 40)}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(k8s: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace whose ``default`` ServiceAccount exists; deleted after the test."""
    name = create_namespace(k8s, unique_name(f"t-{request.node.name}"))
    yield name
    with contextlib.suppress(ApiException):
        client.CoreV1Api(k8s).delete_namespace(name)


@pytest.fixture(scope="session")
def crds_installed(k8s: client.ApiClient) -> None:
    """The repository's own CRDs (``crds/``) applied and Established."""
    apply_dirs(k8s, [REPO_ROOT / "crds"], timeout=60)


@pytest.fixture(scope="session")
def gateway_api_crds(k8s: client.ApiClient) -> None:
    """Gateway API v1.6 standard CRDs (and their safe-upgrades policy) applied.

    The policy rejects Gateway API CRDs older than v1.5 afterwards, so tests
    that need v1.4 must use their own cluster.
    """
    folder = gateway_api_dir("v1.6")
    if not folder.is_dir():
        pytest.fail(f"{folder} missing; run hack/build-binaries.sh")
    apply_dirs(k8s, [folder], timeout=60)
