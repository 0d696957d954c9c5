"""`ambient-operator run`: informers feed the caches; the loops reconcile.

The watch table (cluster/watches.py) is listed and watched by the
operator's informers (app/watches.py, kube/informer.py); each event only
records what the caches keep and pulls a trigger. kopf runs the process:
start-up and clean-up, liveness and the admission webhook. Two loops of one kind
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

from ambient_operator.api.metrics import serve as serve_metrics
from ambient_operator.app.options import CNI_RBAC_BY_OPERATOR, Options
from ambient_operator.app.watches import Watches
from ambient_operator.app.waypoints import register as register_waypoints
from ambient_operator.app.webhook import register as register_webhook
from ambient_operator.app.webhook import start as start_webhook
from ambient_operator.cluster.pods import PodConsumer, PodFeed, PodRecord
from ambient_operator.cluster.state import ClusterState
from ambient_operator.cluster.watches import state_watches
from ambient_operator.controllers.dataplane import DataplaneController
from ambient_operator.controllers.namespaces import NamespaceChecker
from ambient_operator.controllers.waypoints import placement_of
from ambient_operator.kube.client import Kube
from ambient_operator.kube.credentials import load_credentials
from ambient_operator.kube.informer import Informer, not_listed
from ambient_operator.kube.resources import Kind
from ambient_operator.runtime.leader import LeaderElector
from ambient_operator.runtime.loop import ReconcileLoop, Timing
from ambient_operator.status.events import EventRecorder

log = logging.getLogger(__name__)
SWITCH_INTERVAL_SECONDS = 0.0005
# The informers' first lists, which the first pass waits for.
PRIME_SECONDS = 120.0


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
            istio_cni_may_delete_pods=options.istio_cni_may_delete_pods,
            network_attachments=options.network_attachments,
            default_registry=options.default_registry,
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
            default_registry=options.default_registry,
        )
        self.waypoints = register_waypoints(
            self.registry,
            self.state,
            self.kube,
            self.events,
            options.resync_seconds,
            self._seen,
        )
        # Every cache and its watch, as one table (cluster/watches.py).
        self.watches = [
            *state_watches(self.state, options.owned_kinds),
            *self.waypoints.watches(),
            *self.webhook.watches(),
        ]
        self.watching = Watches(self.kube, self.watches)
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
            resynced=self.state.resync,
        )

    def leading(self) -> bool:
        """Whether this replica may write: it holds the lease, or there is no election."""
        return self.elector is None or self.elector.leading

    def pod_consumers(self) -> list[PodConsumer]:
        """Who keeps something of each pod besides the enrollment counts."""
        consumers = [PodConsumer(placement_of, self.waypoints.place_pod)]
        if self.webhook.misses is not None:
            misses = self.webhook.misses
            consumers.append(PodConsumer(misses.suspect_of, misses.remember))
        return consumers

    # -- start-up and clean-up (the watches are app/watches.py's) -------------
    def _register(self) -> None:
        reg = self.registry
        state = self.state

        logins = 0

        @kopf.on.login(registry=reg)
        def login(**_: Any) -> kopf.ConnectionInfo:
            # A custom registry has no default login. kopf logs in again on a 401
            # and at the expiration given: the same credentials answer the token
            # the REST client sends now. The first login takes the credential the
            # client already has; every later one comes after a 401 or a lapse.
            nonlocal logins
            if logins:
                self.credentials.refresh()
            logins += 1
            info: kopf.ConnectionInfo = self.credentials.connection_info()
            return info

        @kopf.on.startup(registry=reg)
        async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.posting.enabled = False  # we post our own, deduplicated Events
            settings.networking.request_timeout = 30
            self.dataplane.kube_version = await asyncio.to_thread(self._kube_version)

        @kopf.on.startup(registry=reg)
        async def start_loop(memo: kopf.Memo, **_: Any) -> None:
            # Fill the caches before the first reconcile: a pass over half-loaded
            # caches would prune the agents of nodes not seen yet.
            await self.prime()
            await start_webhook(self.webhook, memo)
            memo["waypoints"] = asyncio.create_task(
                self.waypoints.loop(self.leading).run(), name="waypoints-loop"
            )
            memo["loop"] = asyncio.create_task(self.loop.run(), name="reconcile-loop")
            if self.elector is not None:
                memo["elector"] = asyncio.create_task(
                    self.elector.run(lambda _leading: state.poke()), name="leader-election"
                )

        @kopf.on.cleanup(registry=reg)
        async def stop_loop(memo: kopf.Memo, **_: Any) -> None:
            for key in ("loop", "elector"):
                task = memo.get(key)
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self.elector is not None:
                await asyncio.to_thread(self.elector.release)
            await self.stop_watching()

    def _seen(self, kind: Kind, key: tuple[str, str]) -> bool | None:
        # The waypoints' `seen`: their controller is made before the watches
        # that read its rows, so this is looked up at each write.
        return self.watching.seen(kind, key)

    def start_watching(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the informers, the watch table's and the pods', once (kopf retries start-up)."""
        self.state.loop = loop  # the informers hand their events to it
        if self.pod_informer is None:
            self.pod_informer = PodFeed(self.state, self.pod_consumers()).informer(self.kube, loop)
            self.pod_informer.start()
        self.watching.start(loop)

    async def stop_watching(self) -> None:
        """Stop every informer."""
        await asyncio.to_thread(self.watching.stop)
        if self.pod_informer is not None:
            await asyncio.to_thread(self.pod_informer.stop)
            self.pod_informer = None

    async def prime(self) -> None:
        """Start watching, and wait until every cache holds a complete list.

        A pass over half-loaded caches would prune the agents of nodes not
        seen yet, or warn about a waypoint Gateway not listed yet; and the
        first pass must count every pod (and every missed one): a lower
        count would be written to the status and raised again moments later.
        """
        self.start_watching(asyncio.get_running_loop())
        await asyncio.to_thread(self.events.load)
        informers: list[Informer[Any]] = list(self.watching.informers)
        if self.pod_informer is not None:
            informers.append(self.pod_informer)
        late = await asyncio.to_thread(not_listed, informers, PRIME_SECONDS)
        if late:
            # kopf retries start-up; the informers go on retrying meanwhile.
            raise RuntimeError(f"not listed (waited up to {PRIME_SECONDS:.0f}s): {', '.join(late)}")
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
        await self.namespaces.check()
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
