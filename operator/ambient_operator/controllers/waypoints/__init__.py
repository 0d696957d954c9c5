"""Waypoints from Gateway API resources: watches feed caches, one pass reconciles.

Thin on purpose: render.py decides, apply/writer.py writes (and only what is ours),
status/components.py judges. This package keeps the caches the watches fill, knows which
Gateways changed since the last pass (only those are reconciled), and talks
to the API server.

Handlers are coroutines so they run on the event loop, like the reconcile
that reads what they write; nothing here is touched from a thread.

The operator's loop calls `reconcile()` (and so resyncs it), but a Gateway
should not wait for the data plane: under churn that loop spaces its passes
out by seconds, since a data-plane pass renders everything. A waypoint pass
only touches what changed, so the controller also runs its own short loop
(the same runtime/loop.py, with its own timing), woken by its own watches,
debounced by a fraction of a second. A lock keeps
the two from running a pass at the same time.

One job per module, each a layer of one class (lowest first, each the base of
the next, so every attribute is known where it is used):

- common.py: the constants and pure helpers the others share.
- cache.py: the caches the watches fill, their event handlers, dirty flags.
- priming.py: its rows of the watch table (cluster/watches.py), whether Gateway API is served.
- classes.py: our GatewayClass, istiod's istio-waypoint class defaults, the
  ConfigMaps both read, and the prune the Gateways share.
- gateways.py: one Gateway's objects and status.
- reports.py: Warning Events on waypoints that cannot work.
- controller.py: `WaypointController`: its loop's timing, the pass.

app/watches.py lists and watches its rows with the cluster state's.
"""

from __future__ import annotations

from ambient_operator.controllers.waypoints.common import placement_of
from ambient_operator.controllers.waypoints.controller import (
    IDLE_DEBOUNCE_SECONDS,
    WaypointController,
)

# What other packages import from here (bench/run_all.py reads the idle debounce).
__all__ = ["IDLE_DEBOUNCE_SECONDS", "WaypointController", "placement_of"]
