"""istiod's own istio-waypoint class: the Linux pin in its class-defaults ConfigMap."""

from __future__ import annotations

from typing import Any

import yaml

from ambient_operator.api import constants as c
from ambient_operator.render.placement import pin_linux
from ambient_operator.render.templating import render_object

# The ConfigMap we create in istiod's namespace when none carries the
# defaults label for istio-waypoint yet.
CLASS_DEFAULTS_NAME = "ambient-operator-istio-waypoint-defaults"


def pin_class_defaults(text: str | None) -> tuple[str | None, str | None]:
    """Merge a Linux pin into istiod's `deployment` overlay YAML.

    Returns (new text, None) when the overlay must change, (None, None) when
    it already pins Linux, and (None, problem) when it cannot be read as a
    mapping (then it is left alone). The merge only adds
    `spec.template.spec.nodeSelector["kubernetes.io/os"] = linux` and drops
    node-selector keys that can only match Windows; every other key the user
    wrote is kept. YAML comments do not survive a rewrite.
    """
    try:
        overlay = yaml.safe_load(text) if text and text.strip() else {}
    except yaml.YAMLError as exc:
        # Not the parser's text: it quotes the offending line, and the
        # message becomes an Event.
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        return None, f"the deployment overlay is not valid YAML{at}"
    if overlay is None:
        overlay = {}
    if not isinstance(overlay, dict):
        return None, "the deployment overlay is not a YAML mapping"
    node: dict[str, Any] = overlay
    for key in ("spec", "template", "spec"):
        child = node.setdefault(key, {})
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            return None, f"the deployment overlay's {key} is not a mapping"
        node = child
    selector = node.get("nodeSelector")
    if selector is None:
        selector = {}
    if not isinstance(selector, dict):
        return None, "the deployment overlay's nodeSelector is not a mapping"
    pinned, _, _ = pin_linux({str(k): str(v) for k, v in selector.items()}, [])
    if selector == pinned:
        return None, None
    node["nodeSelector"] = pinned
    return yaml.safe_dump(overlay, sort_keys=False, default_flow_style=False), None


def render_class_defaults(name: str, namespace: str, deployment: str) -> dict[str, Any]:
    """Only our fields of the istio-waypoint class-defaults ConfigMap."""
    return render_object(
        "waypoint-class-defaults.yaml.j2",
        name=name,
        namespace=namespace,
        labels={c.LABEL_DEFAULTS_FOR_CLASS: c.ISTIO_WAYPOINT_CLASS},
        deployment=deployment,
    )
