"""Pod templates kept as they run until the user asks for the change (issue 32).

Restarting an agent cuts its node's long-lived connections, so the agents'
pods restart only for a change the user made, or when the user approves
one. Two things change a DaemonSet's pod template without the user asking:

- a new operator version that renders the same spec differently (one more
  variable, a label), and
- a take-over from Helm (apply/adopt.py), whose template is Helm's.

Both are one rule. A DaemonSet whose running template differs from the
render is *held*: the render is written with the running template in place
of its own, and the DaemonSet carries AS_IS, the digest of the render it is
held at. It stays held until

- the user changes something the agents are rendered from (the spec, or
  the version the agents follow): the digest of those inputs, INPUTS, is
  kept on every DaemonSet, and a different one means the user asked; or
- the user approves what is held: the AmbientMesh's APPROVE annotation set
  to the approval digest that status.held gives. Each DaemonSet held at
  that moment is marked APPROVED, and the held platforms roll in the order
  of a version change (render/rollout.py's `release_held`): Linux, then each
  Windows build, each Ready before the next.

A DaemonSet is held when it is taken over, or when its template was
written by another operator build (TEMPLATE_BY; a DaemonSet without it
predates this rule and is treated as another build's) and the inputs
are the ones it was written with (or it does not say). A build is the
version and a digest of the operator's code and templates
(api/constants.py's operator_build): a rebuilt image under the same
version string is another build, and a value without a digest (what
operators before this wrote) is another build's too. Under one build, a
render that differs from what runs is written at once: that is the
user's change, or a hand edit to undo.

Objects without pods (ConfigMaps, RBAC, Services) are written at once;
agents read their ConfigMaps at start, so a held agent takes a new value
when it next restarts (docs/upgrades.md).

Pure: the controller gives the live objects and the inputs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AmbientMeshSpec
from ambient_operator.apply.plan import desired_hash

# On a held DaemonSet: the digest of the render it is held at.
AS_IS = "ambientoperator.io/as-is-template"
# On every agent DaemonSet: the operator build (`<version>+<code digest>`) whose
# render its pod template is (kept from the live object while held).
TEMPLATE_BY = "ambientoperator.io/template-by"
# On every agent DaemonSet: the digest of what it was rendered from.
INPUTS = "ambientoperator.io/inputs"
# On a held DaemonSet the user approved: the AS_IS digest approved.
APPROVED = "ambientoperator.io/approved-template"
# On the AmbientMesh: the approval digest of what is held (status.held.approval).
APPROVE = "ambientoperator.io/approve-templates"
# What a held DaemonSet is held for (status.held).
OPERATOR_UPGRADE = "OperatorUpgrade"
TAKEN_OVER = "TakenOver"
# Fields of a held template shown in status (it takes at most 32).
DIFFERENCES_SHOWN = 32


class _Digested:
    """The last spec digested and its digest, and each rendered template's digest by
    the template itself (see `template_digest`)."""

    # More templates than the platforms could have: past it, the digests start over.
    TEMPLATES_KEPT = 64

    def __init__(self) -> None:
        self.inputs: tuple[AmbientMeshSpec, str] | None = None
        self.templates: dict[int, tuple[Mapping[str, Any], str]] = {}


_DIGESTED = _Digested()


def inputs_digest(spec: AmbientMeshSpec) -> str:
    """The digest of what the agents are rendered from: the effective spec.

    Taken after the agents' tag is chosen (cluster/versions.py's agent_tag),
    so istiod's version, when followed, is part of it.
    """
    # Every full pass asks with a spec equal to the last pass's: comparing it
    # costs a fraction of dumping and hashing it (7 % of a node pass at 5,000
    # nodes). Render keeps its objects by the same equality (RenderMemo).
    last = _DIGESTED.inputs
    if last is not None and last[0] == spec:
        return last[1]
    text = json.dumps(spec.model_dump(mode="json", by_alias=True), sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    _DIGESTED.inputs = (spec, digest)
    return digest


def template_digest(obj: Mapping[str, Any]) -> str:
    """The digest of a DaemonSet's pod template, as the operator renders it."""
    template = (obj.get("spec") or {}).get("template") or {}
    # Render hands an unchanged platform the very objects of the last pass
    # (render/dataplane.py's RenderMemo), which nobody changes: the digest is
    # kept by the template, held here so that its id stays its own. Dumping
    # every template was a tenth of a node pass at 5,000 nodes.
    kept = _DIGESTED.templates.get(id(template))
    if kept is not None and kept[0] is template:
        return kept[1]
    digest = desired_hash(template)
    if len(_DIGESTED.templates) >= _DIGESTED.TEMPLATES_KEPT:
        _DIGESTED.templates.clear()
    _DIGESTED.templates[id(template)] = (template, digest)
    return digest


@dataclass(frozen=True)
class Hold:
    """What the pass decides held templates by."""

    inputs: str
    # The operator build: its version and the digest of its code (operator_build).
    version: str
    # Platforms whose approved DaemonSets roll this pass (release_held).
    release: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Held:
    """One DaemonSet held this pass, before any release."""

    name: str
    platform: str
    digest: str
    reason: str
    approved: bool
    differences: tuple[str, ...] = field(default=(), compare=False)


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def held(
    out: Mapping[str, Any], live: Mapping[str, Any] | None, hold: Hold, *, taking: bool = False
) -> Held | None:
    """Whether the DaemonSet rendered as `out` is held over `live`, and how; None when not.

    `out` is what would be written if it rolled (for a DaemonSet taken
    over, apply/adopt.py's form of it); `taking`: it is taken over this pass.
    """
    if out.get("kind") != "DaemonSet" or live is None:
        return None
    digest = template_digest(out)
    was = _annotations(live)
    # Not held at this render: held now only if another version wrote what
    # runs from the inputs of this pass, and it differs.
    written_here = was.get(TEMPLATE_BY) == hold.version
    asked = was.get(INPUTS) not in (None, hold.inputs)
    if not taking and was.get(AS_IS) != digest and (written_here or asked):
        return None
    differences = tuple(template_differences(_template(live), _template(out)))
    if not differences and not taking:
        return None
    meta = out.get("metadata") or {}
    labels = meta.get("labels") or {}
    from_helm = c.ADOPTED_FROM in (meta.get("annotations") or {})
    return Held(
        name=str(meta.get("name", "")),
        platform=str(labels.get(c.LABEL_PLATFORM, "")),
        digest=digest,
        reason=TAKEN_OVER if from_helm else OPERATOR_UPGRADE,
        approved=was.get(APPROVED) == digest,
        differences=differences,
    )


def apply_hold(
    out: Mapping[str, Any], live: Mapping[str, Any] | None, hold: Hold, state: Held | None
) -> dict[str, Any]:
    """What to write for `out`: as rendered, or with the running template kept.

    `state` is `held`'s answer for it this pass. Every DaemonSet is written
    with INPUTS; TEMPLATE_BY names the version whose template it runs.
    """
    obj = dict(out)
    if obj.get("kind") != "DaemonSet":
        return obj
    meta = obj["metadata"] = dict(obj.get("metadata") or {})
    annotations = meta["annotations"] = dict(meta.get("annotations") or {})
    annotations[INPUTS] = hold.inputs
    if state is None or live is None or (state.approved and state.platform in hold.release):
        annotations[TEMPLATE_BY] = hold.version
        return obj
    was = _annotations(live)
    annotations[AS_IS] = state.digest
    if was.get(TEMPLATE_BY):
        annotations[TEMPLATE_BY] = str(was[TEMPLATE_BY])
    if state.approved:
        annotations[APPROVED] = state.digest
    spec = obj["spec"] = dict(obj.get("spec") or {})
    spec["template"] = _without_nulls(_template(live))
    return obj


def approval(states: Iterable[Held]) -> str:
    """The digest that approves exactly these held DaemonSets (status.held.approval)."""
    text = json.dumps(sorted((s.name, s.digest) for s in states))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _template(obj: Mapping[str, Any]) -> Any:
    return (obj.get("spec") or {}).get("template") or {}


def _without_nulls(node: Any) -> Any:
    """`node` without null values (a template's `creationTimestamp: null`), which apply would read
    as fields to remove."""
    if isinstance(node, Mapping):
        return {k: _without_nulls(v) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [_without_nulls(item) for item in node]
    return node


def is_held(live: Mapping[str, Any]) -> bool:
    """Whether a DaemonSet runs a template kept as it was (AS_IS)."""
    return AS_IS in _annotations(live)


def template_differences(
    running: Any, rendered: Any, path: str = "", *, whole: bool = False
) -> list[str]:
    """Field paths of a pod template where what runs differs from the render, sorted.

    Lists of named items (containers, env, volumes, ports) are compared by
    name, so one changed variable is one path, not the whole list. A field
    set only in what runs counts when it is a label, an annotation or a
    named item (`whole`): the API server's defaults (an image pull policy, a
    fieldRef's apiVersion, a termination message path) are never those, and
    the next apply leaves them as they are.
    """
    if rendered is None:
        return [path] if whole and running not in (None, {}, []) else []
    if isinstance(running, Mapping) and isinstance(rendered, Mapping):
        keyed = path.endswith(("labels", "annotations"))
        out: list[str] = []
        for name in sorted(set(running) | set(rendered)):
            sub = f"{path}.{name}" if path else str(name)
            out += template_differences(running.get(name), rendered.get(name), sub, whole=keyed)
        return out
    if isinstance(running, list) and isinstance(rendered, list):
        named = _by_name(running), _by_name(rendered)
        if named[0] is not None and named[1] is not None:
            out = []
            for name in sorted(set(named[0]) | set(named[1])):
                sub = f"{path}[{name}]"
                out += template_differences(named[0].get(name), named[1].get(name), sub, whole=True)
            return out
    if running in (None, {}, []) and rendered in (None, {}, []):
        return []
    return [] if running == rendered else [path]


def _by_name(items: list[Any]) -> dict[str, Any] | None:
    if not all(isinstance(item, Mapping) and isinstance(item.get("name"), str) for item in items):
        return None
    return {item["name"]: item for item in items}
