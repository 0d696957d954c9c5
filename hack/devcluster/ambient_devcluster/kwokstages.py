"""Stage configuration for the standalone ``kwok`` binary.

Unlike ``kwokctl``, the bare ``kwok`` controller ships no default stages and
exits with "no stages found" without a ``--config`` that defines some. These
stages are written for this project:

* nodes become Ready, keeping whatever ``status.nodeInfo``, capacity,
  allocatable and addresses were written when the node was created (each
  nodeInfo field only gets a default when it is empty), so fake Windows nodes
  keep their Windows build numbers;
* Ready nodes get a heartbeat that refreshes the condition timestamps often
  enough for the node lifecycle controller's grace period; leases are not used
  because a restarted kwok (new holder identity) would leave nodes unmanaged
  until the old lease expired;
* pods bound to a fake node become Running and Ready, Job pods then succeed,
  and terminating pods are removed the way a kubelet confirms deletion
  (finalizers are left to their owners).
"""

from __future__ import annotations

from typing import Any

import yaml

STAGE_API = "kwok.x-k8s.io/v1alpha1"

# Heartbeats every 10-15 s (kwok reads the jitter as the upper bound) stay
# well inside kube-controller-manager's default 50 s node-monitor-grace-period.
HEARTBEAT_MS = 10_000
HEARTBEAT_JITTER_MS = 15_000

_READY_EXPR = '.status.conditions.[] | select( .type == "Ready" ) | .status'

_NODE_CONDITIONS = """\
{{ $now := Now }}
{{ $old := .status.conditions }}
conditions:
{{ range NodeConditions }}
{{ $type := .type }}
{{ $since := $now }}
{{ if $keepTransitions }}
{{ range $old }}
{{ if and (eq .type $type) .lastTransitionTime }}{{ $since = .lastTransitionTime }}{{ end }}
{{ end }}
{{ end }}
- type: {{ .type | Quote }}
  status: {{ .status | Quote }}
  reason: {{ .reason | Quote }}
  message: {{ .message | Quote }}
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $since | Quote }}
{{ end }}
"""

_NODE_READY_TEMPLATE = (
    "{{ $keepTransitions := false }}\n"
    + _NODE_CONDITIONS
    + """\
{{ $name := .metadata.name }}
addresses:
{{ with .status.addresses }}
{{ YAML . 1 }}
{{ else }}
- type: Hostname
  address: {{ $name | Quote }}
{{ end }}
capacity:
{{ with .status.capacity }}
{{ YAML . 1 }}
{{ else }}
  cpu: "32"
  memory: 256Gi
  pods: "110"
  ephemeral-storage: 1Ti
{{ end }}
allocatable:
{{ with .status.allocatable }}
{{ YAML . 1 }}
{{ else }}
{{ with .status.capacity }}
{{ YAML . 1 }}
{{ else }}
  cpu: "32"
  memory: 256Gi
  pods: "110"
  ephemeral-storage: 1Ti
{{ end }}
{{ end }}
{{ $info := or .status.nodeInfo dict }}
{{ $fake := printf "kwok-%s" Version }}
nodeInfo:
  architecture: {{ or $info.architecture "amd64" | Quote }}
  operatingSystem: {{ or $info.operatingSystem "linux" | Quote }}
  osImage: {{ or $info.osImage "" | Quote }}
  kernelVersion: {{ or $info.kernelVersion $fake | Quote }}
  kubeletVersion: {{ or $info.kubeletVersion $fake | Quote }}
  kubeProxyVersion: {{ or $info.kubeProxyVersion "" | Quote }}
  containerRuntimeVersion: {{ or $info.containerRuntimeVersion $fake | Quote }}
  machineID: {{ or $info.machineID "" | Quote }}
  systemUUID: {{ or $info.systemUUID "" | Quote }}
  bootID: {{ or $info.bootID "" | Quote }}
phase: Running
"""
)

_NODE_HEARTBEAT_TEMPLATE = "{{ $keepTransitions := true }}\n" + _NODE_CONDITIONS

_POD_RUNNING_TEMPLATE = """\
{{ $now := Now }}
conditions:
- type: PodReadyToStartContainers
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Initialized
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
- type: Ready
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ range .spec.readinessGates }}
- type: {{ .conditionType | Quote }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
{{ with .spec.initContainers }}
initContainerStatuses:
{{ range . }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: ""
  restartCount: 0
{{ if eq (or .restartPolicy "") "Always" }}
  ready: true
  started: true
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ else }}
  ready: true
  started: false
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
{{ end }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: ""
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
{{ $hostIPs := NodeIPsWith .spec.nodeName }}
{{ with $hostIPs }}
hostIP: {{ index . 0 | Quote }}
hostIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
{{ $podIPs := PodIPsWith .spec.nodeName (or .spec.hostNetwork false) (or .metadata.uid "")
     (or .metadata.name "") (or .metadata.namespace "") }}
{{ with $podIPs }}
podIP: {{ index . 0 | Quote }}
podIPs:
{{ range . }}
- ip: {{ . | Quote }}
{{ end }}
{{ end }}
phase: Running
startTime: {{ $now | Quote }}
"""

_POD_SUCCEEDED_TEMPLATE = """\
{{ $now := Now }}
conditions:
- type: Ready
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{ $now | Quote }}
- type: ContainersReady
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{ $now | Quote }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  imageID: ""
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
phase: Succeeded
"""


def _stage(name: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": STAGE_API,
        "kind": "Stage",
        "metadata": {"name": name},
        "spec": {"resourceRef": {"apiGroup": "v1", "kind": kind}, **spec},
    }


def stages(
    heartbeat_ms: tuple[int, int] = (HEARTBEAT_MS, HEARTBEAT_JITTER_MS),
) -> list[dict[str, Any]]:
    """The Stage objects kwok plays for nodes and pods.

    `heartbeat_ms` is the (least, most) time between a node's heartbeats.
    """
    not_deleted = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
    return [
        _stage(
            "devcluster-node-ready",
            "Node",
            {
                "selector": {
                    "matchExpressions": [
                        not_deleted,
                        {"key": _READY_EXPR, "operator": "NotIn", "values": ["True"]},
                    ]
                },
                "next": {"statusTemplate": _NODE_READY_TEMPLATE},
            },
        ),
        _stage(
            "devcluster-node-heartbeat",
            "Node",
            {
                "selector": {
                    "matchExpressions": [
                        not_deleted,
                        {"key": _READY_EXPR, "operator": "In", "values": ["True"]},
                    ]
                },
                "delay": {
                    "durationMilliseconds": heartbeat_ms[0],
                    "jitterDurationMilliseconds": heartbeat_ms[1],
                },
                "next": {"statusTemplate": _NODE_HEARTBEAT_TEMPLATE},
            },
        ),
        _stage(
            "devcluster-pod-running",
            "Pod",
            {
                "selector": {
                    "matchExpressions": [
                        not_deleted,
                        {"key": ".status.phase", "operator": "In", "values": ["Pending"]},
                        {"key": _READY_EXPR, "operator": "NotIn", "values": ["True"]},
                    ]
                },
                "next": {"statusTemplate": _POD_RUNNING_TEMPLATE},
            },
        ),
        _stage(
            "devcluster-pod-job-succeeded",
            "Pod",
            {
                "selector": {
                    "matchExpressions": [
                        not_deleted,
                        {"key": ".status.phase", "operator": "In", "values": ["Running"]},
                        {
                            "key": ".metadata.ownerReferences.[].kind",
                            "operator": "In",
                            "values": ["Job"],
                        },
                    ]
                },
                "next": {"statusTemplate": _POD_SUCCEEDED_TEMPLATE},
            },
        ),
        _stage(
            "devcluster-pod-deleted",
            "Pod",
            {
                "selector": {
                    "matchExpressions": [
                        {"key": ".metadata.deletionTimestamp", "operator": "Exists"}
                    ]
                },
                "next": {"delete": True},
            },
        ),
    ]


def config_yaml(heartbeat_ms: tuple[int, int] = (HEARTBEAT_MS, HEARTBEAT_JITTER_MS)) -> str:
    """The multi-document YAML to pass to ``kwok --config``."""
    return yaml.safe_dump_all(stages(heartbeat_ms), sort_keys=False)
