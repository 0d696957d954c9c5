"""`ambient-operator run`: kopf watches feed the caches; the loops reconcile.

kopf is used for what it does well (watch streams, liveness, admission);
its handlers only record what they see and pull a trigger (the watch
table: cluster/watches.py, app/watches.py). Two loops of one kind
(runtime/loop.py) make the passes: the operator's (namespaces, data plane,
waypoints, the webhook's misses) and the waypoints' own short one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import sys
import uuid
from typing import Any

import kopf

from ambient_operator.api import constants as c
from ambient_operator.api.metrics import serve as serve_metrics
from ambient_operator.app.kopf_glue import NoDiffBase
from ambient_operator.app.options import CNI_RBAC_BY_OPERATOR, Options
from ambient_operator.app.watches import prime as prime_watches
from ambient_operator.app.watches import register as register_watches
from ambient_operator.app.watches import sweep_targets
from ambient_operator.app.waypoints import register as register_waypoints
from ambient_operator.app.webhook import register as register_webhook
from ambient_operator.app.webhook import start as start_webhook
from ambient_operator.cluster.pods import PodConsumer, PodFeed, PodRecord
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import state_watches
from ambient_operator.controllers.dataplane import DataplaneController
from ambient_operator.controllers.namespaces import NamespaceChecker
from ambient_operator.controllers.waypoints import placement_of
from ambient_operator.kube.client import LIST_PAGE_SIZE, Kube
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.informer import Informer
from ambient_operator.kube.sweep import Sweeps
from ambient_operator.runtime.leader import LeaderElector
from ambient_operator.runtime.loop import ReconcileLoop, Timing
from ambient_operator.status.events import EventRecorder
from ambient_operator.webhook.misses import MissTracker

log = logging.getLogger(__name__)
SWITCH_INTERVAL_SECONDS = 0.0005
# The pod informer's first list, which the first pass waits for.
PRIME_SECONDS = 120.0
# kopf lists every kind again once start-up is done; the first sweep (kube/sweep.py)
# comes after those lists, so what was deleted between them and ours is forgotten.
FIRST_SWEEP_SECONDS = 5.0
# Every handler of these kinds (here and in waypoints/) filters on our labels.
SELF_ONLY_PLURALS = ("daemonsets", "serviceaccounts", "clusterroles", "clusterrolebindings")


class Operator:
    """Wires the caches, the controllers and kopf together."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.state = ClusterState()
        self.credentials = load_credentials(options.kubeconfig)
        self.kube = Kube(self.credentials)
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
            options.resync_seconds,
        )
        # Every cache and its watch, as one table (cluster/watches.py).
        self.watches = [
            *state_watches(self.state, options.owned_kinds),
            *self.waypoints.watches(),
            *self.webhook.watches(),
        ]
        self.sweeps = Sweeps(
            self.kube,
            lambda: sweep_targets(self.watches),
            FIRST_SWEEP_SECONDS,
            options.resync_seconds,
        )
        register_watches(self.registry, self.watches, self.sweeps.relisted)
        self.loop = ReconcileLoop(
            "reconcile",
            self.state,
            self.reconcile,
            self.leading,
            Timing(
                debounce=options.debounce_seconds,
                idle_debounce=options.idle_debounce_seconds,
                max_delay=options.max_delay_seconds,
                status_delay=options.status_delay_seconds,
                resync=options.resync_seconds,
            ),
            describe=self._describe_pass,
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

    # -- start-up and clean-up (the watches are app/watches.py's) -------------
    def _register(self) -> None:
        reg = self.registry
        state = self.state

        @kopf.on.login(registry=reg)
        def login(**_: Any) -> kopf.ConnectionInfo:
            # A custom registry has no default login. kopf logs in again on a 401
            # and at the expiration given: the same credentials answer the token
            # the REST client sends now.
            self.credentials.refresh()
            info: kopf.ConnectionInfo = self.credentials.connection_info()
            return info

        @kopf.on.startup(registry=reg)
        async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
            state.loop = asyncio.get_running_loop()
            settings.posting.enabled = False  # we post our own, deduplicated Events
            settings.watching.server_timeout = 300
            settings.watching.client_timeout = 330
            settings.networking.request_timeout = 30
            # kopf lists each kind in one response unless told otherwise: at a
            # restart that is every pod of the cluster parsed at once, and the
            # heap it grows stays the process's for good (a third of its peak
            # RSS at 6,000 pods). In pages, one page at a time is alive.
            settings.watching.chunk_size = LIST_PAGE_SIZE
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

        @kopf.on.startup(registry=reg)
        async def start_loop(memo: kopf.Memo, **_: Any) -> None:
            # Fill the caches before the first reconcile: a pass over half-loaded
            # caches would prune the agents of nodes not seen yet.
            state.loop = asyncio.get_running_loop()  # the pod informer pokes from its thread
            if self.pod_informer is None:  # kopf retries a failed start-up handler
                feed = PodFeed(state, self.pod_consumers())
                self.pod_informer = feed.informer(self.kube, state.loop)
                self.pod_informer.start()
            await self.prime()
            await start_webhook(self.webhook, memo)
            memo["waypoints"] = asyncio.create_task(
                self.waypoints.loop(self.leading).run(), name="waypoints-loop"
            )
            memo["loop"] = asyncio.create_task(self.loop.run(), name="reconcile-loop")
            memo["sweep"] = asyncio.create_task(
                self.sweeps.run(),
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

    async def prime(self) -> None:
        """Fill every cache of the watch table before the first pass of either loop.

        A pass over half-loaded caches would prune the agents of nodes not
        seen yet, or warn about a waypoint Gateway not listed yet.
        """
        await asyncio.to_thread(self.events.load)
        await prime_watches(self.kube, self.watches)
        # The first pass must count every pod (and every missed one): a lower
        # count would be written to the status and raised again moments later.
        informer = self.pod_informer
        if informer is not None and not await asyncio.to_thread(
            informer.wait_synced, PRIME_SECONDS
        ):
            raise RuntimeError(f"pods not listed within {PRIME_SECONDS:.0f}s")
        self.waypoints.mark_primed()
        self.state.poke()

    def _kube_version(self) -> str:
        info = self.kube.request("GET", "/version")
        minor = str(info.get("minor", "")).rstrip("+")
        return f"{info.get('major', '1')}.{minor}" if minor else "1.37"

    # -- the loop -------------------------------------------------------------
    async def reconcile(self) -> None:
        """One pass of the operator's loop: namespaces, data plane, waypoints, misses."""
        misses = self.webhook.misses
        # Count the misses first, so the status this pass writes carries the
        # count; tell about them (Events, slow) after everything else.
        if misses is not None:
            misses.count()
        # Namespace warnings first: cheap, and the news a user who just
        # labelled a namespace waits for.
        await self.namespaces.check_all()
        await self.dataplane.reconcile()
        await self.waypoints.reconcile()
        if misses is not None:
            await misses.check()

    def _describe_pass(self) -> str:
        return f"nodes={len(self.state.nodes)} namespaces={len(self.state.namespaces)}"

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
