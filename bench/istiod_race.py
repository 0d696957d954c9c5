"""Our waypoint controller raced against istiod's own, on one cluster, in one run.

    .venv/bin/python bench/istiod_race.py [--trials 15] [--busy] [--json FILE]

istiod deploys the waypoints of its class `istio-waypoint` itself (its
gateway deployment controller); the operator deploys those of class
`ambient-waypoint`. Numbers taken on different clusters or in different
runs differ by more than the controllers do, so this runs both side by
side: a private local control plane with the sample nodes, Istio installed
from its own charts with the real istiod (`IstioControlPlane`), and
`ambient-operator run` with the sample AmbientMesh.

Each trial creates, per class, a Gateway with the one HBONE listener in two
kinds of namespace:

- fresh: a namespace created right before its Gateway, as one `kubectl
  apply` of a namespace and its waypoint does; a controller that needs to
  have seen the namespace (its labels, its defaults) first may wait for it;
- known: a namespace that exists since set-up and already had a waypoint.

Each is timed from just before the Gateway's create request to the arrival
of the watch event showing

- deployment: the Deployment named after the Gateway (ADDED), the
  controller's first write of what it renders;
- available: the Deployment's first availableReplicas >= 1 (ReplicaSet,
  scheduler, kwok's pod), the same path on both sides, against which the
  two Programmed can be read;
- programmed: the Gateway's Programmed=True for its generation, the
  controller's verdict. It does not mean the same on both sides: ours
  waits for an available pod behind the Service's ClusterIP, istiod's only
  for the Service's address (its status code says it does not check the
  Deployment).

The watches are cluster-wide and open since set-up, so no watch start
falls inside a timing. The floor is reaction_latency's chain: a zero-logic
reactor in this process answering a write with a write, which is what any
write -> watch -> write -> watch controller could reach.

The two classes alternate which goes first (ours on even trials), so
neither always runs right after the other's work. Each Gateway is created
only once, for 2.1 s, neither of our controllers made a pass and istiod
counted no watch event but Nodes' (kwok's heartbeats keep those coming):
each is an isolated change. The fresh namespaces of trial i-2 are deleted
at the start of trial i, so namespace deletions go on around later trials,
as in a live cluster.

With --busy the trials run back to back, as in a busy cluster: no wait for
quiet anywhere; each trial deletes the previous trial's namespaces, then
per class creates a namespace and, `BUSY_GAP_S` later, its Gateway (the
series "busy"), while the deletions and the previous Gateways' rollouts go
on. A controller that batches whatever arrives while it is busy makes a new
Gateway wait; one that queues each key does not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ambient_devcluster import (
    IstioControlPlane,
    LocalCluster,
    apply_dirs,
    apply_objects,
    cluster_dns_service,
    create_nodes,
    default_bin_dir,
)
from ambient_devcluster.harness import (
    CRDS_DIR,
    OPERATOR_USER,
    SAMPLE_NODES,
    SAMPLES_DIR,
    AuditLog,
    current,
    metric_total,
    parse_metrics,
    wait_for,
)
from ambient_devcluster.launcher import LOOPBACK
from ambient_operator.api import constants as c
from ambient_operator.controllers.waypoints.common import METRICS_NAME
from benchlib import GATEWAY_API, BenchOperator, Watcher, summary
from reaction_latency import (
    CLIENT_USER,
    GW_GROUP,
    GW_VERSION,
    WAYPOINT_CLASS,
    ReactionBench,
    gateway,
    trial_parts,
)

CLASSES = {"ours": WAYPOINT_CLASS, "istiod": c.ISTIO_WAYPOINT_CLASS}
MODES = ("fresh", "known")
# --busy: each Gateway this long after its namespace, with no wait for quiet.
BUSY_MODES = ("busy",)
BUSY_GAP_S = 0.5
MILESTONES = ("deployment", "available", "programmed")
FLOOR = "chain floor"
# What either controller writes for a waypoint, and how istiod's requests
# are told from this client's, both being the devcluster's admin.
WAYPOINT_RESOURCES = frozenset({"serviceaccounts", "deployments", "services", "gateways"})
ISTIOD_AGENT = "pilot-discovery/"
TIMEOUT = 60.0
# istiod's counters of what it is told and does: the watch events of its
# config store and service registry, and the pushes they cause (its gateway
# deployment controller has no metric of its own). Node events are left out:
# kwok's heartbeats update some node every second or two, which istiod counts
# but which make it do nothing a waypoint waits for.
ISTIOD_COUNTERS = (
    "pilot_k8s_cfg_events",
    "pilot_k8s_reg_events",
    "pilot_inbound_updates",
    "pilot_push_triggers",
)


def key(side: str, mode: str, milestone: str) -> str:
    """The name of one series: 'ours fresh deployment', 'istiod known programmed', ..."""
    return f"{side} {mode} {milestone}"


def istiod_activity(istiod: IstioControlPlane) -> float:
    """The sum of istiod's event counters: unchanged while istiod has nothing to do."""
    url = f"http://{LOOPBACK}:{istiod.ports.monitoring}/metrics"
    with urllib.request.urlopen(url, timeout=5) as resp:
        samples = parse_metrics(resp.read().decode())
    return sum(
        value
        for name, value in samples.items()
        if name.partition("{")[0] in ISTIOD_COUNTERS and 'type="Nodes"' not in name
    )


class RaceOperator(BenchOperator):
    """Ours, whose `wait_quiet()` waits for its waypoint controller and for istiod too."""

    def __init__(self, cluster: LocalCluster, log_path: Path, istiod: IstioControlPlane) -> None:
        super().__init__(cluster, log_path)
        self.istiod = istiod

    def passes(self) -> tuple[float, float]:
        """Passes started and finished by both our controllers, istiod's events as finished ones.

        `wait_quiet()` waits until this pair stood still with both halves equal;
        istiod's events count on both sides, so they only have to stop.
        """
        started, done = super().passes()
        samples = self.metrics()
        labels = {"controller": METRICS_NAME}
        started += metric_total(samples, "ambient_operator_reconcile_total", labels)
        done += metric_total(samples, "ambient_operator_reconcile_duration_seconds_count", labels)
        events = istiod_activity(self.istiod)
        return started + events, done + events


def _at(
    namespace: str, name: str, kind: str | None = None
) -> Callable[[str, dict[str, Any]], bool]:
    """Predicate: an event (of `kind`, when given) about namespace/name."""
    return lambda t, o: (
        (kind is None or t == kind)
        and o["metadata"]["namespace"] == namespace
        and o["metadata"]["name"] == name
    )


def class_accepted(api: client.ApiClient, name: str) -> bool:
    """Whether the GatewayClass `name` is Accepted for its generation."""
    try:
        gc = client.CustomObjectsApi(api).get_cluster_custom_object(
            GW_GROUP, GW_VERSION, "gatewayclasses", name
        )
    except ApiException:
        return False
    return isinstance(gc, dict) and current(gc, "Accepted")


class Race:
    """The watches, namespaces and samples of the race on one cluster."""

    def __init__(
        self,
        api: client.ApiClient,
        op: RaceOperator,
        audit: AuditLog | None = None,
        busy: bool = False,
    ) -> None:
        self.op = op
        self.busy = busy
        self.modes = BUSY_MODES if busy else MODES
        # The trials as (series, namespace, wall-clock start, end at the
        # Deployment's event), for parts(); without the audit log, none.
        self.audit = audit
        self.audit_since = audit.mark() if audit else 0
        self.windows: list[tuple[str, str, float, float]] = []
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        for side in CLASSES:
            self._create_namespace(self._known(side))
        self.deployments = Watcher(client.AppsV1Api(api).list_deployment_for_all_namespaces)
        self.gateways = Watcher(
            self.custom.list_cluster_custom_object, GW_GROUP, GW_VERSION, "gateways"
        )
        self.deployments.start()
        self.gateways.start()
        self.floor = ReactionBench(api, op)
        self.samples: dict[str, list[float]] = {
            key(side, mode, milestone): []
            for side in CLASSES
            for mode in self.modes
            for milestone in MILESTONES
        }
        self.missed = dict.fromkeys(self.samples, 0)
        self.fresh: dict[int, list[str]] = {}

    @staticmethod
    def _known(side: str) -> str:
        return f"race-known-{side}"

    def _create_namespace(self, name: str) -> None:
        self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def close(self) -> None:
        """Stop the watches (the cluster goes away with what the trials made)."""
        self.floor.close()
        self.deployments.stop()
        self.gateways.stop()

    def warm_up(self) -> None:
        """One Gateway of each class to Programmed in its known namespace (then forgotten).

        It also makes the known namespaces known: each controller already
        deployed a waypoint there.
        """
        for side, class_name in CLASSES.items():
            self.op.wait_quiet()
            if self.gateway(side, self._known(side), "warm-up")["programmed"] is None:
                raise TimeoutError(f"the warm-up Gateway of {class_name} never got Programmed")

    def gateway(
        self, side: str, namespace: str, name: str, mode: str | None = None
    ) -> dict[str, float | None]:
        """Seconds from the create request to each milestone (None: not within TIMEOUT).

        With `mode`, the trial is kept for parts().
        """
        expectations = {
            "deployment": self.deployments.expect(_at(namespace, name, "ADDED")),
            "available": self.deployments.expect(
                lambda t, o: (
                    _at(namespace, name)(t, o)
                    and (o.get("status") or {}).get("availableReplicas", 0) >= 1
                )
            ),
            "programmed": self.gateways.expect(
                lambda t, o: _at(namespace, name)(t, o) and current(o, "Programmed")
            ),
        }
        wall, started = time.time(), time.monotonic()
        self.custom.create_namespaced_custom_object(
            GW_GROUP, GW_VERSION, namespace, "gateways", gateway(name, CLASSES[side])
        )
        took: dict[str, float | None] = {}
        for milestone, expectation in expectations.items():
            left = max(0.0, started + TIMEOUT - time.monotonic())
            try:
                took[milestone] = (
                    expectation.wait(left, f"{milestone} {namespace}/{name}") - started
                )
            except TimeoutError:
                took[milestone] = None
        deployed = took["deployment"]
        if mode is not None and deployed is not None:
            self.windows.append((f"{side} {mode}", namespace, wall, wall + deployed))
        return took

    def parts(self) -> dict[str, list[dict[str, float]]]:
        """race_parts() of the trials since the warm-up; empty without the audit log."""
        if self.audit is None:
            return {}
        return race_parts(
            self.windows,
            self.audit.events(self.audit_since, user=OPERATOR_USER),
            self.audit.events(self.audit_since, user=CLIENT_USER),
        )

    def trial(self, i: int) -> None:
        """Trial `i`: the chain floor, then each class (alternating first) in both modes."""
        if self.busy:
            self.busy_trial(i)
            return
        for old in self.fresh.pop(i - 2, []):
            with contextlib.suppress(ApiException):
                self.core.delete_namespace(old)
        self.op.wait_quiet()
        self.floor.chain(i)
        sides = list(CLASSES) if i % 2 == 0 else list(reversed(CLASSES))
        for side in sides:
            for mode in MODES:
                self.op.wait_quiet()
                if mode == "fresh":
                    namespace, name = f"race-{side}-{i}", "waypoint"
                    self.fresh.setdefault(i, []).append(namespace)
                    self._create_namespace(namespace)
                else:
                    namespace, name = self._known(side), f"wp-{i}"
                for milestone, took in self.gateway(side, namespace, name, mode).items():
                    series = key(side, mode, milestone)
                    if took is None:
                        self.missed[series] += 1
                    else:
                        self.samples[series].append(took)

    def busy_trial(self, i: int) -> None:
        """Trial `i` of --busy: no wait for quiet; the last trial's namespaces go meanwhile."""
        for old in self.fresh.pop(i - 1, []):
            with contextlib.suppress(ApiException):
                self.core.delete_namespace(old)
        self.floor.chain(i)
        sides = list(CLASSES) if i % 2 == 0 else list(reversed(CLASSES))
        for side in sides:
            namespace = f"race-{side}-{i}"
            self.fresh.setdefault(i, []).append(namespace)
            self._create_namespace(namespace)
            time.sleep(BUSY_GAP_S)
            for milestone, took in self.gateway(side, namespace, "waypoint", "busy").items():
                series = key(side, "busy", milestone)
                if took is None:
                    self.missed[series] += 1
                else:
                    self.samples[series].append(took)

    def run(self, trials: int, progress: Callable[[str], None]) -> None:
        """`trials` trials; progress every 5 and at the end."""
        mode = self.modes[0]
        for i in range(trials):
            self.trial(i)
            if (i + 1) % 5 == 0 or i + 1 == trials:
                p50 = {
                    side: _p50_ms(self.samples[key(side, mode, "programmed")]) for side in CLASSES
                }
                progress(f"istiod race: {i + 1}/{trials} trials, {mode} Programmed p50 ms {p50}")


def race_parts(
    windows: list[tuple[str, str, float, float]],
    operator: list[dict[str, Any]],
    bench: list[dict[str, Any]],
) -> dict[str, list[dict[str, float]]]:
    """Per series ("ours fresh", ...), reaction_latency's PARTS of each trial, in order (seconds).

    `windows` are (series, namespace, start, end) on the wall clock;
    `operator` and `bench` the audit events of the operator and of the
    devcluster's admin, who is both this client and istiod (it runs with
    the admin kubeconfig; its user agent tells it apart). The bench's
    Gateway create is the trigger; the answer is its controller's requests
    for the waypoint's objects in the trial's namespace, so what either
    does for the namespace itself (istiod's root-certificate ConfigMap, our
    mesh's status) is not counted.
    """

    def inside(namespace: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in events if (e.get("objectRef") or {}).get("namespace") == namespace]

    def answer(event: dict[str, Any]) -> bool:
        # A watch or list completes when it ends, long after it was received.
        return event["verb"] not in ("watch", "list") and (
            (event.get("objectRef") or {}).get("resource") in WAYPOINT_RESOURCES
        )

    istiod = [e for e in bench if str(e.get("userAgent", "")).startswith(ISTIOD_AGENT)]
    answers = {
        side: [e for e in events if answer(e)]
        for side, events in (("ours", operator), ("istiod", istiod))
    }
    creates = [
        e
        for e in bench
        if e["verb"] == "create" and (e.get("objectRef") or {}).get("resource") == "gateways"
    ]
    out: dict[str, list[dict[str, float]]] = {}
    for series, namespace, start, end in windows:
        side = series.split(" ", 1)[0]
        got = trial_parts(
            (start, end), inside(namespace, creates), inside(namespace, answers[side])
        )
        if got is not None:
            out.setdefault(series, []).append(got)
    return out


def _p50_ms(values: list[float]) -> int | None:
    return round(summary(values)["p50"] * 1000) if values else None


def ratios(summaries: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """ours/istiod and ours/chain floor of p50 and p99, per mode and milestone."""
    out: dict[str, dict[str, float]] = {}
    floor = summaries[FLOOR]
    for mode in (*MODES, *BUSY_MODES):
        for milestone in MILESTONES:
            ours = summaries.get(key("ours", mode, milestone))
            theirs = summaries.get(key("istiod", mode, milestone))
            if ours is None:
                continue
            row: dict[str, float] = {}
            for q in ("p50", "p99"):
                if theirs is not None:
                    row[f"ours/istiod {q}"] = ours[q] / theirs[q]
                row[f"ours/chain {q}"] = ours[q] / floor[q]
            out[f"{mode} {milestone}"] = row
    return out


def _race(
    api: client.ApiClient,
    op: RaceOperator,
    trials: int,
    progress: Callable[[str], None],
    lap: Callable[[str], float],
    audit: AuditLog | None = None,
    busy: bool = False,
) -> dict[str, Any]:
    """The sample AmbientMesh, both classes Accepted, the warm-up, then the trials."""
    sample = yaml.safe_load((SAMPLES_DIR / "ambientmesh.yaml").read_text())
    apply_objects(api, [sample])
    for name in CLASSES.values():
        wait_for(partial(class_accepted, api, name), 180, f"GatewayClass {name} Accepted")
    race = Race(api, op, audit, busy)
    try:
        lap("operator")
        race.warm_up()
        race.audit_since = audit.mark() if audit else 0
        progress(f"istiod race: set up in {lap('warm-up'):.0f}s, {trials} trials")
        race.run(trials, progress)
    finally:
        race.close()
    samples = {**race.samples, FLOOR: race.floor.samples[FLOOR]}
    summaries = {name: summary(values) for name, values in samples.items() if values}
    return {
        "trials": trials,
        "busy": busy,
        "busy_gap_s": BUSY_GAP_S,
        "samples": samples,
        "missed": race.missed,
        "summaries": summaries,
        "ratios": ratios(summaries),
        "parts": race.parts(),
    }


def measure(
    trials: int, progress: Callable[[str], None] = print, busy: bool = False
) -> dict[str, Any]:
    """The race on a private cluster of its own; samples in seconds, JSON-friendly.

    `busy`: back to back (--busy, the module's docstring), else isolated trials.
    """
    bin_dir = default_bin_dir()
    # Two cores shared with whatever else runs: the load says how alone it was.
    load = {"start": os.getloadavg()}
    setup: dict[str, float] = {}
    began = time.monotonic()

    def lap(phase: str) -> float:
        """Record how long `phase` took since the previous one; the set-up so far."""
        setup[phase] = time.monotonic() - began - sum(setup.values())
        return sum(setup.values())

    with (
        tempfile.TemporaryDirectory(prefix="istiod-race-") as tmp,
        LocalCluster(Path(tmp) / "cluster", bin_dir=bin_dir, verbose=False) as cluster,
        cluster.api_client() as api,
    ):
        apply_dirs(api, [CRDS_DIR, GATEWAY_API], timeout=120)
        create_nodes(api, SAMPLE_NODES, timeout=120)
        apply_objects(api, [cluster_dns_service()])
        lap("cluster")
        with IstioControlPlane(cluster.kubeconfig, Path(tmp) / "istiod", bin_dir) as istiod:
            lap("istio")
            op = RaceOperator(cluster, Path(tmp) / "operator.log", istiod)
            op.start()
            try:
                result = _race(api, op, trials, progress, lap, AuditLog(cluster.audit_log), busy)
            except Exception:
                # The work directory goes away with the cluster: show why now.
                print(f"operator log:\n{op.log_tail(40)}", file=sys.stderr)
                print(f"istiod log:\n{istiod.log_tail(40)}", file=sys.stderr)
                raise
            finally:
                survived = {"operator": op.alive(), "istiod": istiod.running()}
                op.stop()
            panics = istiod.log_file.read_text(errors="replace").count("panic:")
    load["end"] = os.getloadavg()
    return {
        **result,
        "setup_s": setup,
        "survived": survived,
        "istiod_panics": panics,
        "load_average": load,
    }


RATIO_COLUMNS = ("ours/istiod p50", "ours/istiod p99", "ours/chain p50", "ours/chain p99")


def table(result: dict[str, Any]) -> str:
    """The distributions (ms) and the ratios as text."""
    quantiles = ("p50", "p95", "p99", "max")
    lines = [f"{'series (ms)':<27} {'n':>3} {'miss':>4} " + " ".join(f"{q:>8}" for q in quantiles)]
    for name in result["samples"]:
        missed = result["missed"].get(name, 0)
        s = result["summaries"].get(name)
        cells = " ".join(f"{s[q] * 1000:>8.1f}" for q in quantiles) if s else "never reached"
        lines.append(f"{name:<27} {int(s['n']) if s else 0:>3} {missed:>4} {cells}")
    lines += ["", f"{'ratio':<22} " + " ".join(f"{col:>15}" for col in RATIO_COLUMNS)]
    for name, row in result["ratios"].items():
        cells = " ".join(
            f"{row[col]:>15.2f}" if col in row else f"{'-':>15}" for col in RATIO_COLUMNS
        )
        lines.append(f"{name:<22} {cells}")
    setup = ", ".join(f"{phase} {took:.0f}s" for phase, took in result["setup_s"].items())
    lines += [
        "",
        f"set-up: {setup}; still running at the end: {result['survived']}; "
        f"panics in istiod's log: {result['istiod_panics']}",
        "load average (1, 5, 15 min) at start, at end: "
        + "; ".join(
            ", ".join(f"{x:.2f}" for x in result["load_average"][at]) for at in ("start", "end")
        ),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the race and print its table (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=15)
    parser.add_argument(
        "--busy",
        action="store_true",
        help=f"back to back: each Gateway {BUSY_GAP_S} s after its namespace, no wait for quiet",
    )
    parser.add_argument("--json", metavar="FILE", help="also write samples and summaries as JSON")
    args = parser.parse_args(argv)
    result = measure(
        args.trials, lambda msg: print(msg, file=sys.stderr, flush=True), busy=args.busy
    )
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
