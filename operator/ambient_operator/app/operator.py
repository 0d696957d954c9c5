"""`ambient-operator run`: kopf watches feed the caches; one loop reconciles.

kopf is used for what it does well (watch streams, liveness, admission);
its per-object handlers here only record what they see and pull a trigger.
Only `on.event` handlers are used: they keep no progress annotations and
add no finalizers, so the operator writes nothing on Nodes, Namespaces or
anything else it does not own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import socket
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from ambient_operator.api import constants as c
from ambient_operator.api.metrics import serve as serve_metrics
from ambient_operator.app.waypoints import register as register_waypoints
from ambient_operator.app.webhook import register as register_webhook
from ambient_operator.cluster.pods import PodConsumer, PodFeed, PodRecord
from ambient_operator.cluster.state import ClusterState
from ambient_operator.controllers.dataplane import DataplaneController
from ambient_operator.controllers.namespaces import NamespaceChecker
from ambient_operator.controllers.waypoints import placement_of
from ambient_operator.kube.client import Kube, KubeError, load_api_client
from ambient_operator.kube.informer import Informer
from ambient_operator.kube.resources import KINDS, key_of
from ambient_operator.kube.sweep import Key, Target, run_sweeps
from ambient_operator.runtime.leader import LeaderElector
from ambient_operator.runtime.pacing import Pacer
from ambient_operator.status.events import EventRecorder
from ambient_operator.webhook.config import WebhookOptions
from ambient_operator.webhook.misses import MissTracker

log = logging.getLogger(__name__)
MANAGED = {c.LABEL_MANAGED_BY: c.MANAGED_BY}
SWITCH_INTERVAL_SECONDS = 0.0005
# The pod informer's first list, which the first pass waits for.
PRIME_SECONDS = 120.0
# kopf lists every kind again once start-up is done; the first sweep (kube/sweep.py)
# comes after those lists, so what was deleted between them and ours is forgotten.
FIRST_SWEEP_SECONDS = 5.0
# Every handler of these kinds (here and in waypoints/) filters on our labels.
SELF_ONLY_PLURALS = ("daemonsets", "serviceaccounts", "clusterroles", "clusterrolebindings")
# Kept by the operator only with --cni-rbac=operator; the chart ships them, and
# then the operator neither writes nor watches RBAC objects.
CNI_RBAC_API_KINDS = [
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
]
OWNED_API_KINDS = [
    ("apps/v1", "DaemonSet"),
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    *CNI_RBAC_API_KINDS,
]
CNI_RBAC_BY_OPERATOR = "operator"
CNI_RBAC_BY_CHART = "chart"


@dataclass(frozen=True)
class Options:
    """Settings of `run`, from flags or environment variables."""

    kubeconfig: str | None = None
    metrics_port: int = 9090
    health_port: int = 8080
    log_format: str = "text"
    log_level: str = "info"
    leader_election: bool = False
    lease_namespace: str = "istio-system"
    lease_name: str = "ambient-operator"
    lease_seconds: float = 15.0
    debounce_seconds: float = 0.2
    # A change reaching an idle operator is handled at once: only events
    # arriving within this of each other (delivered together) are folded. A
    # `kubectl apply` of many objects may take two passes; the second waits
    # behind the spacing of passes, so a larger stream still folds.
    idle_debounce_seconds: float = 0.005
    max_delay_seconds: float = 1.0
    # Pod and rollout progress only changes status: batch it more.
    status_delay_seconds: float = 3.0
    resync_seconds: float = 300.0
    identity: str = ""
    webhook: WebhookOptions = field(default_factory=WebhookOptions)
    # Namespaces spec.namespace may name (empty: any); the chart's Roles are there.
    agents_namespaces: tuple[str, ...] = ()
    # Who keeps the istio-cni ClusterRole and binding: the operator or the chart.
    cni_rbac: str = CNI_RBAC_BY_OPERATOR

    @property
    def owned_kinds(self) -> list[tuple[str, str]]:
        """(apiVersion, kind) of every object kind the data plane writes."""
        if self.cni_rbac == CNI_RBAC_BY_OPERATOR:
            return list(OWNED_API_KINDS)
        return [kind for kind in OWNED_API_KINDS if kind not in CNI_RBAC_API_KINDS]


def _desired_part(obj: Mapping[str, Any]) -> Any:
    """What of one of our objects we (or a drifting user) write: all but status."""
    meta = obj.get("metadata", {})
    return (
        meta.get("generation"),
        meta.get("labels"),
        meta.get("annotations"),
        {k: v for k, v in obj.items() if k not in ("metadata", "status")},
    )


def _node_shape(node: Mapping[str, Any]) -> Any:
    """What render reads from a Node; heartbeats change nothing here.

    Condition taints (node.kubernetes.io/not-ready and friends) come and go
    with node health and are tolerated by every DaemonSet pod anyway.
    """
    meta = node.get("metadata", {})
    status = node.get("status") or {}
    taints = [
        t
        for t in (node.get("spec") or {}).get("taints") or []
        if not str(t.get("key", "")).startswith("node.kubernetes.io/")
    ]
    return (meta.get("labels"), taints, status.get("nodeInfo"))


class Operator:
    """Wires the caches, the controllers and kopf together."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.pacer = Pacer(
            debounce=options.debounce_seconds, idle_debounce=options.idle_debounce_seconds
        )
        if options.kubeconfig:
            # kopf's own login reads the kubeconfig the standard way.
            os.environ["KUBECONFIG"] = options.kubeconfig
        self.state = ClusterState()
        self.kube = Kube(load_api_client(options.kubeconfig))
        # Unique per process: replicas sharing a host name (hostNetwork pods on one
        # node, or two processes on one machine) must not both think they hold the lease.
        identity = (
            options.identity
            or os.environ.get("POD_NAME")
            or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        )
        self.events = EventRecorder(self.kube, instance=identity)
        self.dataplane = DataplaneController(
            self.state,
            self.kube,
            self.events,
            agents_namespaces=options.agents_namespaces,
            cni_rbac=options.cni_rbac == CNI_RBAC_BY_OPERATOR,
        )
        self.namespaces = NamespaceChecker(self.state, self.kube, self.events)
        self.elector = (
            LeaderElector(
                self.kube,
                options.lease_namespace,
                options.lease_name,
                identity,
                lease_seconds=options.lease_seconds,
            )
            if options.leader_election
            else None
        )
        self.pod_informer: Informer[PodRecord] | None = None
        self.registry = kopf.OperatorRegistry()
        self._register()
        self.webhook = register_webhook(
            self.registry,
            self.state,
            self.kube,
            self.events,
            options.webhook,
            self.dataplane.report_workaround_misses,
        )
        self.waypoints = register_waypoints(
            self.registry,
            self.state,
            self.kube,
            self.events,
            self.leading,
            options.resync_seconds,
        )

    def leading(self) -> bool:
        """Whether this replica may write: it holds the lease, or there is no election."""
        return self.elector is None or self.elector.leading

    def pod_consumers(self) -> list[PodConsumer]:
        """Who keeps something of each pod besides the enrollment counts."""
        consumers = [PodConsumer(placement_of, self.waypoints.place_pod)]
        if self.webhook.misses is not None:
            consumers.append(PodConsumer(MissTracker.suspect_of, self.webhook.misses.remember))
        return consumers

    # -- watches ------------------------------------------------------------
    def _register(self) -> None:
        # Handlers are coroutines: they run on the event loop, like the reconcile
        # that reads the caches they fill and the asyncio.Event they set (neither
        # is safe to touch from kopf's executor threads, where sync handlers run).
        reg = self.registry
        state = self.state

        @kopf.on.login(registry=reg)
        def login(**_: Any) -> kopf.ConnectionInfo:
            # A custom registry has no default login. Load the credentials
            # afresh each time: kopf logs in again when a token expires.
            return connection_info(load_api_client(self.options.kubeconfig).configuration)

        @kopf.on.startup(registry=reg)
        async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
            state.loop = asyncio.get_running_loop()
            settings.posting.enabled = False  # we post our own, deduplicated Events
            settings.watching.server_timeout = 300
            settings.watching.client_timeout = 330
            settings.networking.request_timeout = 30
            # kopf keeps a worker per object, holding its last body, until it
            # idles out; thousands of pods at start-up would otherwise stay
            # whole in memory for 5 s. The handlers only copy what they need.
            settings.queueing.idle_timeout = 0.5
            settings.persistence.diffbase_storage = NoDiffBase()
            # Kinds only ever watched for our own objects: let the API server
            # filter, so 1,000 namespaces' default ServiceAccounts never reach us.
            for plural in SELF_ONLY_PLURALS:
                settings.watching.label_selectors[plural] = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
            settings.persistence.finalizer = (
                "ambientoperator.io/unused"  # never added: no such handlers
            )
            self.dataplane.kube_version = await asyncio.to_thread(self._kube_version)

        @kopf.on.event(c.API_GROUP, c.API_VERSION, c.PLURAL, registry=reg)
        async def mesh_event(type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
            if name != c.MESH_NAME:
                return
            state.mesh = None if type == "DELETED" else copy.deepcopy(dict(body))
            state.poke()

        @kopf.on.event("", "v1", "nodes", registry=reg)
        async def node_event(type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
            if type == "DELETED":
                state.nodes.pop(name, None)
                state.poke()
                return
            node = copy.deepcopy(dict(body))
            old = state.nodes.get(name)
            state.nodes[name] = node
            if old is None or _node_shape(old) != _node_shape(node):
                state.poke()

        def istiod_or_dns(name: str, **_: Any) -> bool:
            return name.startswith("istiod") or name == "kube-dns"

        @kopf.on.event("", "v1", "services", when=istiod_or_dns, registry=reg)
        async def service_event(
            type: str | None, body: kopf.Body, name: str, namespace: str | None, **_: Any
        ) -> None:
            if type == "DELETED":
                state.services.pop((namespace or "", name), None)
            else:
                state.services[(namespace or "", name)] = copy.deepcopy(dict(body))
            state.poke()

        @kopf.on.event("apps", "v1", "deployments", when=istiod_or_dns, registry=reg)
        async def deployment_event(
            type: str | None, body: kopf.Body, name: str, namespace: str | None, **_: Any
        ) -> None:
            if type == "DELETED":
                state.deployments.pop((namespace or "", name), None)
            else:
                state.deployments[(namespace or "", name)] = copy.deepcopy(dict(body))
            state.poke()

        for api_version, kind_name in self.options.owned_kinds:
            kind = KINDS[(api_version, kind_name)]
            group, version, plural = kind.group, api_version.rpartition("/")[2], kind.plural

            @kopf.on.event(
                group, version, plural, labels=MANAGED, registry=reg, id=f"owned-{plural}"
            )
            async def owned_event(type: str | None, body: kopf.Body, **_: Any) -> None:
                obj = copy.deepcopy(dict(body))
                before = state.owned.get(key_of(obj))
                if not state.remember_owned(obj, deleted=type == "DELETED"):
                    return  # a late event: a write's response told us more
                # A rollout moving along is status; an edit or a deletion is drift.
                state.poke(
                    urgent=type == "DELETED"
                    or before is None
                    or _desired_part(before) != _desired_part(obj)
                )

        @kopf.on.event("", "v1", "namespaces", registry=reg)
        async def namespace_event(type: str | None, body: kopf.Body, name: str, **_: Any) -> None:
            if type == "DELETED":
                state.namespaces.pop(name, None)
            else:
                old = state.namespaces.get(name)
                new = namespace_entry(body)
                state.namespaces[name] = new
                if old is not None and same_namespace(old, new):
                    return
            state.poke()

        # Pods come from an informer of our own, not kopf: see kube/informer.py.

        @kopf.on.event("gateway.networking.k8s.io", "v1", "gateways", registry=reg)
        async def gateway_event(
            type: str | None, body: kopf.Body, name: str, namespace: str | None, **_: Any
        ) -> None:
            if type == "DELETED":
                state.gateways.pop((namespace or "", name), None)
            else:
                state.gateways[(namespace or "", name)] = copy.deepcopy(dict(body))
            state.poke()

        @kopf.on.startup(registry=reg)
        async def start_loop(memo: kopf.Memo, **_: Any) -> None:
            # Fill the caches before the first reconcile: a pass over half-loaded
            # caches would prune the agents of nodes not seen yet.
            state.loop = asyncio.get_running_loop()  # prime pokes from its thread
            if self.pod_informer is None:  # kopf retries a failed start-up handler
                feed = PodFeed(state, self.pod_consumers())
                self.pod_informer = feed.informer(self.kube, state.loop)
                self.pod_informer.start()
            await asyncio.to_thread(self.prime)
            memo["loop"] = asyncio.create_task(self.loop(), name="reconcile-loop")
            memo["sweep"] = asyncio.create_task(
                run_sweeps(
                    self.kube,
                    self.sweep_targets,
                    FIRST_SWEEP_SECONDS,
                    self.options.resync_seconds,
                ),
                name="cache-sweep",
            )
            if self.elector is not None:
                memo["elector"] = asyncio.create_task(
                    self.elector.run(lambda _leading: state.poke()), name="leader-election"
                )

        @kopf.on.cleanup(registry=reg)
        async def stop_loop(memo: kopf.Memo, **_: Any) -> None:
            for key in ("loop", "sweep", "elector"):
                task = memo.get(key)
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self.elector is not None:
                await asyncio.to_thread(self.elector.release)
            if self.pod_informer is not None:
                await asyncio.to_thread(self.pod_informer.stop)

    def prime(self) -> None:
        """List once what the watches will keep current."""
        state, kube = self.state, self.kube
        self.events.load()
        state.mesh = kube.get(KINDS[(f"{c.API_GROUP}/{c.API_VERSION}", c.KIND)], c.MESH_NAME)
        for node in kube.list(KINDS[("v1", "Node")]):
            state.nodes[node["metadata"]["name"]] = node
        for kind, cache in (
            (KINDS[("v1", "Service")], state.services),
            (KINDS[("apps/v1", "Deployment")], state.deployments),
        ):
            for obj in kube.list(kind):
                meta = obj["metadata"]
                if meta["name"].startswith("istiod") or meta["name"] == "kube-dns":
                    cache[(meta["namespace"], meta["name"])] = obj
        selector = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"
        for api_version, kind_name in self.options.owned_kinds:
            for obj in kube.list(KINDS[(api_version, kind_name)], label_selector=selector):
                state.remember_owned(obj)
        for ns in kube.list(KINDS[("v1", "Namespace")]):
            state.namespaces[ns["metadata"]["name"]] = namespace_entry(ns)
        # The first pass must count every pod (and every missed one): a lower
        # count would be written to the status and raised again moments later.
        informer = self.pod_informer
        if informer is not None and not informer.wait_synced(PRIME_SECONDS):
            raise RuntimeError(f"pods not listed within {PRIME_SECONDS:.0f}s")
        try:
            for gw in kube.list(KINDS[("gateway.networking.k8s.io/v1", "Gateway")]):
                state.gateways[(gw["metadata"]["namespace"], gw["metadata"]["name"])] = gw
        except KubeError as exc:
            if exc.status != 404:  # Gateway API not installed: nothing to know
                raise
        state.poke()

    def sweep_targets(self) -> list[Target]:
        """Every cache a watch keeps, for kube/sweep.py; the waypoint controller's included."""
        state = self.state

        def forget_in(
            cache: dict[Any, Any], key_of_entry: Callable[[Key], Any]
        ) -> Callable[[Key], None]:
            def forget(key: Key) -> None:
                if cache.pop(key_of_entry(key), None) is not None:
                    state.poke()

            return forget

        def forget_mesh(_key: Key) -> None:
            state.mesh = None
            state.poke()

        mesh_kind = KINDS[(f"{c.API_GROUP}/{c.API_VERSION}", c.KIND)]
        targets = [
            Target(
                mesh_kind,
                lambda: {("", c.MESH_NAME): state.mesh} if state.mesh else {},
                forget_mesh,
                field_selector=f"metadata.name={c.MESH_NAME}",
            ),
            Target(
                KINDS[("v1", "Node")],
                lambda: {("", name): node for name, node in state.nodes.items()},
                forget_in(state.nodes, lambda key: key[1]),
            ),
            Target(
                KINDS[("v1", "Namespace")],
                lambda: {("", name): ns for name, ns in state.namespaces.items()},
                forget_in(state.namespaces, lambda key: key[1]),
            ),
            Target(
                KINDS[("v1", "Service")],
                lambda: dict(state.services),
                forget_in(state.services, lambda key: key),
            ),
            Target(
                KINDS[("apps/v1", "Deployment")],
                lambda: dict(state.deployments),
                forget_in(state.deployments, lambda key: key),
            ),
            Target(
                KINDS[("gateway.networking.k8s.io/v1", "Gateway")],
                lambda: dict(state.gateways),
                forget_in(state.gateways, lambda key: key),
            ),
        ]

        def owned_target(api_version: str, kind_name: str) -> Target:
            def cached() -> dict[Key, dict[str, Any]]:
                return {
                    (key[2], key[3]): obj
                    for key, obj in state.owned.items()
                    if key[0] == api_version and key[1] == kind_name
                }

            def forget(key: Key) -> None:
                obj = state.owned.get((api_version, kind_name, *key))
                if obj is not None:
                    state.remember_owned(obj, deleted=True)
                    state.poke()  # one of ours is gone: put it back

            return Target(
                KINDS[(api_version, kind_name)],
                cached,
                forget,
                label_selector=f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}",
            )

        targets += [owned_target(*kind) for kind in self.options.owned_kinds]
        return targets + self.waypoints.sweep_targets()

    def _kube_version(self) -> str:
        info = self.kube.request("GET", "/version")
        minor = str(info.get("minor", "")).rstrip("+")
        return f"{info.get('major', '1')}.{minor}" if minor else "1.37"

    # -- the loop -------------------------------------------------------------
    async def _settle(self) -> None:
        """Wait for a quiet moment (or the max delay) so a burst is one reconcile."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        while True:
            self.state.trigger.clear()
            urgent = self.state.urgent
            limit = self.options.max_delay_seconds if urgent else self.options.status_delay_seconds
            now = loop.time()
            left = started + limit - now
            if left <= 0:
                return
            # Picked again on every change: an urgent one arriving while status
            # news settles must not wait the longer debounce.
            debounce = self.pacer.debounce_for(now, urgent)
            try:
                await asyncio.wait_for(self.state.trigger.wait(), timeout=min(debounce, left))
            except TimeoutError:
                return

    async def _space_out(self) -> None:
        """Under sustained churn, leave growing gaps between passes (see runtime/pacing.py).

        A wait built up by status churn ends early when an urgent change
        arrives that may go at once.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        wait = self.pacer.woke(now, self.state.urgent)
        deadline = now + wait
        while True:
            now = loop.time()
            if now >= deadline or self.pacer.urgent_goes_now(now, self.state.urgent):
                return
            self.state.trigger.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.state.trigger.wait(), timeout=deadline - now)

    async def loop(self) -> None:
        """Reconcile on every trigger and on the resync period, while we lead."""
        while True:
            # A timeout here is the periodic resync.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.state.trigger.wait(), timeout=self.options.resync_seconds
                )
            loop = asyncio.get_running_loop()
            woke = loop.time()
            await self._space_out()
            await self._settle()
            urgent, self.state.urgent = self.state.urgent, False
            if self.elector is not None and not self.elector.leading:
                continue  # the elector pokes us when we take over
            started = loop.time()
            try:
                # Count the misses first, so the status this pass writes carries the
                # count; tell about them (Events, slow) after everything else.
                if self.webhook.misses is not None:
                    self.webhook.misses.count()
                # Namespace warnings first: cheap, and the news a user who just
                # labelled a namespace waits for.
                await self.namespaces.check_all()
                await self.dataplane.reconcile()
                await self.waypoints.reconcile()
                if self.webhook.misses is not None:
                    await self.webhook.misses.check()
            except asyncio.CancelledError:
                raise
            except Exception:
                # The loop is the operator: one bad pass must not end it.
                log.exception("reconcile pass failed; retrying")
                await asyncio.sleep(1)
                self.state.trigger.set()
            ended = loop.time()
            self.pacer.ended(ended, urgent)
            # One line per pass (passes are spaced out under churn): when a change
            # seems ignored, this tells whether a pass ran, and what it waited for.
            log.info(
                "reconcile pass: urgent=%s waited=%.3fs took=%.3fs nodes=%d namespaces=%d",
                urgent,
                started - woke,
                ended - started,
                len(self.state.nodes),
                len(self.state.namespaces),
            )

    def run(self) -> None:
        """Run until SIGINT/SIGTERM."""
        # The webhook's thread answers the API server while kopf's loop is busy
        # with watch events; a thread waiting for the GIL waits up to one switch
        # interval at each step of a review (5 ms by default), which the API
        # server adds to every pod creation.
        sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
        serve_metrics(self.options.metrics_port)
        liveness = (
            f"http://0.0.0.0:{self.options.health_port}/healthz"
            if self.options.health_port
            else None
        )
        kopf.run(
            registry=self.registry,
            clusterwide=True,
            standalone=True,
            liveness_endpoint=liveness,
        )


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, never built: only `on.event` handlers are registered here.

    kopf builds an "essence" of every body it sees (a deep copy, then
    cleaned) to detect changes for create/update handlers; this operator has
    none, and those copies were a fifth of its CPU at scale. Nothing is ever
    stored, so `fetch` finds nothing either.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()


def namespace_entry(ns: Mapping[str, Any]) -> dict[str, Any]:
    """What the caches keep of a Namespace: identity, labels, and whether it is going away."""
    meta = ns.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        # The version tells a sweep whether the entry is older than its list.
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "labels": dict(meta.get("labels") or {}),
        # Nothing can be created in a terminating namespace; writers skip it.
        "terminating": bool(meta.get("deletionTimestamp")),
    }


def same_namespace(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether two namespace entries differ in nothing but their resourceVersion."""
    return (
        old.get("labels") == new.get("labels")
        and old.get("terminating") == new.get("terminating")
        and (old.get("metadata") or {}).get("uid") == (new.get("metadata") or {}).get("uid")
    )


def connection_info(cfg: Any) -> kopf.ConnectionInfo:
    """kopf's connection settings from a kubernetes client Configuration."""
    header = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
        "authorization"
    )
    scheme, token = None, None
    if header:
        first, _, rest = str(header).partition(" ")
        scheme, token = (first, rest) if rest else (None, first)
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert or None,
        insecure=not cfg.verify_ssl,
        username=cfg.username or None,
        password=cfg.password or None,
        scheme=scheme,
        token=token,
        certificate_path=cfg.cert_file or None,
        private_key_path=cfg.key_file or None,
    )


def configure_logging(fmt: str, level: str) -> None:
    """Structured (json) or text logs at the given level."""
    kopf.configure(
        debug=level == "debug",
        quiet=level in ("warning", "error"),
        log_format=kopf.LogFormat.JSON if fmt == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(level.upper())
