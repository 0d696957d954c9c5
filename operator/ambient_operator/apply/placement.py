"""Which OS a pod-bearing object's pods run on, checked before it is written. Pure.

Every pod template the operator writes must pin exactly one OS, so that no
agent or waypoint can land on a node whose OS its image does not run on:
the check tigera-operator's component handler makes before it writes. The
pin is `nodeSelector["kubernetes.io/os"]` or, without it, a required node
affinity whose every term pins the same OS (render/placement.py moves the OS
requirement there when some intended node lacks the label, and adds a term
per such node that selects it by name). `spec.os.name`, when set, must name
the same OS.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ambient_operator.api import constants as c

OSES = ("linux", "windows")
# Where each pod-bearing kind keeps its pod spec.
_TEMPLATE = ("spec", "template", "spec")
POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "DaemonSet": _TEMPLATE,
    "Deployment": _TEMPLATE,
    "StatefulSet": _TEMPLATE,
    "ReplicaSet": _TEMPLATE,
    "Job": _TEMPLATE,
    "CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "Pod": ("spec",),
}
_TERMS = "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms"
_NAME_FIELD = "metadata.name"


class _UnplacedError(Exception):
    """A placement problem, found while reading the pod spec."""


def pod_spec_path(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Where the object's pod spec is, or None when its kind has no pods."""
    return POD_SPEC_PATHS.get(str(obj.get("kind", "")))


def pod_spec(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod spec of a pod-bearing object; None for other kinds or when it is absent."""
    path = pod_spec_path(obj)
    if path is None:
        return None
    node: Any = obj
    for key in path:
        if not isinstance(node, Mapping):
            return None
        node = node.get(key)
    return node if isinstance(node, Mapping) else None


def _os_value(value: Any, field: str) -> str:
    if value not in OSES:
        raise _UnplacedError(f"{field} is {value!r}, not one of {', '.join(OSES)}")
    return str(value)


def _listed(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


def _by_name_only(term: Mapping[str, Any]) -> bool:
    """A term that picks nodes by name alone (metadata.name In ...), as placement adds them."""
    fields = term.get("matchFields") or []
    return (
        not term.get("matchExpressions")
        and _listed(fields)
        and bool(fields)
        and all(
            isinstance(f, Mapping) and f.get("key") == _NAME_FIELD and f.get("operator") == "In"
            for f in fields
        )
    )


def _term_os(term: Any, field: str) -> str | None:
    """The OS one affinity term pins, None when it selects nodes by name only."""
    if not isinstance(term, Mapping):
        raise _UnplacedError(f"{field} is not a node selector term")
    found: set[str] = set()
    for i, expr in enumerate(term.get("matchExpressions") or []):
        if not isinstance(expr, Mapping) or expr.get("key") != c.LABEL_OS:
            continue
        where = f"{field}.matchExpressions[{i}]"
        values = expr.get("values") or []
        if expr.get("operator") != "In" or not _listed(values) or len(values) != 1:
            raise _UnplacedError(
                f"{where} must be {c.LABEL_OS} In one OS, not {expr.get('operator')!r} {values!r}"
            )
        found.add(_os_value(values[0], f"{where}.values[0]"))
    if len(found) > 1:
        both = " and ".join(sorted(found))
        raise _UnplacedError(f"{field} requires {c.LABEL_OS} to be both {both}")
    if found:
        return found.pop()
    if _by_name_only(term):
        return None
    raise _UnplacedError(
        f"{field} pins no OS: a term needs {c.LABEL_OS} In one OS, or to select nodes "
        f"only by {_NAME_FIELD}"
    )


def _affinity_os(spec: Mapping[str, Any], where: str) -> tuple[str, str]:
    """(OS, field that pins it) from the required node affinity."""
    node: Any = spec
    for key in _TERMS.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
    terms = node if _listed(node) else []
    if not terms:
        raise _UnplacedError(
            f"{where} pins no OS: it needs nodeSelector[{c.LABEL_OS}] or a required node "
            f"affinity on {c.LABEL_OS} ({where}.{_TERMS})"
        )
    field = f"{where}.{_TERMS}"
    pinned: dict[str, int] = {}
    for i, term in enumerate(terms):
        os_name = _term_os(term, f"{field}[{i}]")
        if os_name is not None:
            pinned.setdefault(os_name, i)
    if not pinned:
        raise _UnplacedError(f"{field} only names nodes and pins no OS")
    if len(pinned) > 1:
        shown = ", ".join(f"term {i} {os_name}" for os_name, i in sorted(pinned.items()))
        raise _UnplacedError(f"{field} disagree on {c.LABEL_OS}: {shown}")
    ((os_name, i),) = pinned.items()
    return os_name, f"{field}[{i}]"


def _problem(spec: Any, where: str) -> str | None:
    if not isinstance(spec, Mapping):
        return f"{where} is missing, so nothing pins the pods' OS"
    selector = spec.get("nodeSelector") or {}
    if not isinstance(selector, Mapping):
        return f"{where}.nodeSelector is not a mapping"
    try:
        if c.LABEL_OS in selector:
            field = f"{where}.nodeSelector[{c.LABEL_OS}]"
            os_name = _os_value(selector[c.LABEL_OS], field)
        else:
            os_name, field = _affinity_os(spec, where)
        declared = spec.get("os")
        if declared is not None and not isinstance(declared, Mapping):
            return f"{where}.os is not a mapping"
        name = (declared or {}).get("name")
        if name is not None and name != os_name:
            return f"{where}.os.name is {name!r} but {field} pins {os_name!r}"
    except _UnplacedError as exc:
        return str(exc)
    return None


def placement_problem(obj: Mapping[str, Any]) -> str | None:
    """Why the object's pods are not pinned to exactly one OS; None when they are.

    Objects that carry no pods (a ConfigMap, a Service) have no problem.
    """
    path = pod_spec_path(obj)
    if path is None:
        return None
    return _problem(pod_spec(obj), ".".join(path))
