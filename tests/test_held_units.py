"""Held pod templates (apply/held.py) and the order an approval rolls them in (issue 32).

Literal cases: which DaemonSet is held and what is written for it, when an
approval rolls which platform, and what Reconciled says.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from pathlib import Path
from typing import Any

from ambient_operator.api import constants as c
from ambient_operator.api.v1alpha1 import AdoptionStatus, AsIsDaemonSet, HeldTemplates
from ambient_operator.apply.held import (
    APPROVED,
    AS_IS,
    INPUTS,
    OPERATOR_UPGRADE,
    TEMPLATE_BY,
    Held,
    Hold,
    apply_hold,
    approval,
    held,
)
from ambient_operator.render.model import OrderedRollout, PlatformRollout
from ambient_operator.render.rollout import release_held
from ambient_operator.status.adoption import as_is_message
from ambient_operator.status.components import ApplyOutcome
from ambient_operator.status.held import held_message, held_platforms, held_status
from ambient_operator.status.versions import rollout_message

NS = "istio-system"
WS2022 = "10.0.20348"
WS2025 = "10.0.26100"
HOLD = Hold("inputs-1", "0.2.0")


def ds(env: str, annotations: dict[str, str] | None = None, platform: str = "linux") -> Any:
    """A ztunnel DaemonSet whose one container has variable `env`."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "ztunnel" if platform == "linux" else f"ztunnel-{platform}",
            "namespace": NS,
            "labels": {"ambientoperator.io/platform": platform},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "selector": {"matchLabels": {"app": "ztunnel"}},
            "template": {
                "metadata": {"labels": {"app": "ztunnel"}},
                "spec": {
                    "containers": [
                        {
                            "name": "istio-proxy",
                            "image": "istio/ztunnel:1.31.0",
                            "env": [{"name": env, "value": "1"}],
                        }
                    ]
                },
            },
        },
        "status": {"currentNumberScheduled": 3},
    }


OLD = ds("OLD_VAR")
NEW = ds("NEW_VAR")
RUNNING_TEMPLATE = OLD["spec"]["template"]


def test_a_template_another_version_wrote_is_held_with_the_same_inputs() -> None:
    live = ds("OLD_VAR", {TEMPLATE_BY: "0.1.0", INPUTS: "inputs-1"})
    state = held(NEW, live, HOLD)
    assert state is not None
    assert (state.name, state.platform, state.reason, state.approved) == (
        "ztunnel",
        "linux",
        OPERATOR_UPGRADE,
        False,
    )
    assert state.differences == (
        "spec.containers[istio-proxy].env[NEW_VAR]",
        "spec.containers[istio-proxy].env[OLD_VAR]",
    )
    out = apply_hold(NEW, live, HOLD, state)
    assert out["spec"]["template"] == RUNNING_TEMPLATE
    assert out["metadata"]["annotations"] == {
        AS_IS: state.digest,
        TEMPLATE_BY: "0.1.0",
        INPUTS: "inputs-1",
    }


def test_a_daemonset_from_before_the_rule_is_held() -> None:
    # No TEMPLATE_BY, no INPUTS: an operator older than this rule wrote it.
    state = held(NEW, ds("OLD_VAR"), HOLD)
    assert state is not None
    assert apply_hold(NEW, ds("OLD_VAR"), HOLD, state)["spec"]["template"] == RUNNING_TEMPLATE


def test_the_same_version_writes_its_render_at_once() -> None:
    # A hand edit, or a change of the facts, under this version: undone at once.
    live = ds("OLD_VAR", {TEMPLATE_BY: "0.2.0", INPUTS: "inputs-1"})
    assert held(NEW, live, HOLD) is None
    out = apply_hold(NEW, live, HOLD, None)
    assert out["spec"]["template"] == NEW["spec"]["template"]
    assert out["metadata"]["annotations"] == {TEMPLATE_BY: "0.2.0", INPUTS: "inputs-1"}


def test_a_rebuild_under_the_same_version_is_held_as_a_new_version_is() -> None:
    # Builds are `<version>+<digest of the code>` (api/constants.py's operator_build).
    hold = Hold("inputs-1", "0.2.0+bbbbbbbbbbbb")
    rebuilt = held(
        NEW, ds("OLD_VAR", {TEMPLATE_BY: "0.2.0+aaaaaaaaaaaa", INPUTS: "inputs-1"}), hold
    )
    assert rebuilt is not None and rebuilt.reason == OPERATOR_UPGRADE
    assert rebuilt.differences == (
        "spec.containers[istio-proxy].env[NEW_VAR]",
        "spec.containers[istio-proxy].env[OLD_VAR]",
    )
    # What operators before the digest wrote (the version alone): another build's.
    assert held(NEW, ds("OLD_VAR", {TEMPLATE_BY: "0.2.0", INPUTS: "inputs-1"}), hold) is not None
    # The same build: its own render, written at once.
    same = ds("OLD_VAR", {TEMPLATE_BY: "0.2.0+bbbbbbbbbbbb", INPUTS: "inputs-1"})
    assert held(NEW, same, hold) is None


def test_the_build_digest_changes_with_a_template_not_with_a_cache(tmp_path: Path) -> None:
    package = Path(c.__file__).resolve().parents[1]
    assert re.fullmatch(r"[0-9A-Za-z.+-]+\+[0-9a-f]{12}", c.operator_build()), c.operator_build()
    one, two = tmp_path / "one", tmp_path / "two"
    for copy in (one, two):
        shutil.copytree(package / "templates", copy / "templates")
    # The same files elsewhere (and a byte-code cache beside them): the same digest.
    (two / "templates" / "__pycache__").mkdir()
    (two / "templates" / "__pycache__" / "x.py").write_text("cached = 1\n")
    assert c.code_digest(one) == c.code_digest(two)
    # One template changed by a byte, the version string as it was: another build.
    changed = two / "templates" / "daemonset-ztunnel-linux.yaml.j2"
    changed.write_text(changed.read_text() + "\n")
    assert c.code_digest(one) != c.code_digest(two)


def test_a_change_the_user_asked_for_rolls_what_was_held() -> None:
    first = held(NEW, ds("OLD_VAR", {TEMPLATE_BY: "0.1.0", INPUTS: "inputs-1"}), HOLD)
    assert first is not None
    live = ds("OLD_VAR", {AS_IS: first.digest, TEMPLATE_BY: "0.1.0", INPUTS: "inputs-1"})
    # Same render, same inputs: still held.
    assert held(NEW, live, HOLD) == first
    # A spec change that leaves the render alone (spec.deletionPolicy): still held.
    assert held(NEW, live, Hold("inputs-2", "0.2.0")) == first
    # The render changed and so did the inputs: the user asked; it rolls.
    newer = ds("NEWER_VAR")
    assert held(newer, live, Hold("inputs-2", "0.2.0")) is None
    # The render changed and the inputs did not (a fact, e.g. a Windows build's image
    # defaults): held again, at the new render.
    again = held(newer, live, HOLD)
    assert again is not None and again.digest != first.digest


def test_an_identical_template_is_not_held() -> None:
    live = ds("NEW_VAR", {TEMPLATE_BY: "0.1.0"})
    assert held(NEW, live, HOLD) is None
    out = apply_hold(NEW, live, HOLD, None)
    assert out["metadata"]["annotations"][TEMPLATE_BY] == "0.2.0"


def test_objects_without_pods_are_never_held() -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}, "data": {}}
    assert held(config, config, HOLD) is None
    assert apply_hold(config, config, HOLD, None) == config


def test_an_approved_daemonset_rolls_only_on_its_platforms_turn() -> None:
    live = ds("OLD_VAR", {TEMPLATE_BY: "0.1.0", INPUTS: "inputs-1"})
    state = held(NEW, live, HOLD)
    assert state is not None
    approved = dataclasses.replace(state, approved=True)
    waiting = apply_hold(NEW, live, HOLD, approved)
    assert waiting["spec"]["template"] == RUNNING_TEMPLATE
    assert waiting["metadata"]["annotations"][APPROVED] == state.digest
    # Marked, the approval is the DaemonSet's own on the next pass.
    marked = ds("OLD_VAR", waiting["metadata"]["annotations"])
    assert held(NEW, marked, HOLD) == approved
    turn = dataclasses.replace(HOLD, release=frozenset({"linux"}))
    out = apply_hold(NEW, marked, turn, approved)
    assert out["spec"]["template"] == NEW["spec"]["template"]
    assert AS_IS not in out["metadata"]["annotations"]
    assert out["metadata"]["annotations"][TEMPLATE_BY] == "0.2.0"


def _rollout(*states: tuple[str, str]) -> OrderedRollout:
    return OrderedRollout(tuple(PlatformRollout(p, s) for p, s in states))  # type: ignore[arg-type]


def test_an_approval_rolls_linux_first_then_each_windows_build() -> None:
    current = _rollout(("linux", "current"), (WS2022, "current"), (WS2025, "current"))
    everything = {"linux": [True, True], WS2022: [True], WS2025: [True]}
    assert release_held(current, everything) == {"linux"}
    # Linux rolled and is Ready: WS2022's turn, not WS2025's.
    assert release_held(current, {WS2022: [True], WS2025: [True]}) == {WS2022}
    # Linux still rolling: nothing more.
    rolling = _rollout(("linux", "rolling"), (WS2022, "current"), (WS2025, "current"))
    assert release_held(rolling, {WS2022: [True], WS2025: [True]}) == frozenset()
    # Not approved (or not all of a platform): nothing rolls.
    assert release_held(current, {"linux": [True, False], WS2022: [True]}) == frozenset()
    assert release_held(current, {}) == frozenset()


def test_the_approval_names_exactly_what_is_held() -> None:
    a = Held("ztunnel", "linux", "d1", OPERATOR_UPGRADE, False)
    b = Held("istio-cni-node", "linux", "d2", OPERATOR_UPGRADE, False)
    assert approval([a, b]) == approval([b, a])
    assert approval([a, b]) != approval([a])
    assert approval([a]) != approval([dataclasses.replace(a, digest="d3")])


def test_reconciled_says_what_would_restart_and_how_to_approve() -> None:
    status = HeldTemplates(
        approval="abc123",
        daemon_sets=[
            AsIsDaemonSet(name="ztunnel", platform="linux", pods=3, reason="OperatorUpgrade"),
            AsIsDaemonSet(
                name="ztunnel-windows-ltsc2022", platform=WS2022, pods=1, reason="OperatorUpgrade"
            ),
        ],
    )
    assert held_message(status, ["linux", WS2022]) == (
        "agents are held, running the pod template that another operator version wrote (linux: "
        "3 pod(s) of ztunnel; 10.0.20348: 1 pod(s) of ztunnel-windows-ltsc2022); approving "
        "restarts them with this operator's render, in order, Linux first; nothing restarts "
        "until this AmbientMesh changes or you approve (kubectl annotate ambientmesh default "
        "ambientoperator.io/approve-templates=abc123 --overwrite) (status.held lists the fields "
        "that differ)"
    )
    approved = status.model_copy(
        update={
            "daemon_sets": [d.model_copy(update={"approved": True}) for d in status.daemon_sets]
        }
    )
    assert held_message(approved, ["linux", WS2022]) == (
        "approved pod templates roll in order, Linux first, then each Windows build, each Ready "
        "before the next; still to roll: linux: 3 pod(s) of ztunnel; 10.0.20348: 1 pod(s) of "
        "ztunnel-windows-ltsc2022 (status.held)"
    )
    assert held_message(None, ["linux"]) is None


def test_after_a_take_over_reconciled_says_the_agents_are_held_and_what_approving_changes() -> None:
    # Upstream's 1.30.3 charts taken over, the agents' tag following a 1.31 istiod:
    # Linux's agents run Helm's template and the render has new images.
    new = "istio-cni: new image; ztunnel: new image"
    rollout = OrderedRollout((PlatformRollout("linux", "rolling", why=new),))
    held = HeldTemplates(
        approval="abc123",
        daemon_sets=[
            AsIsDaemonSet(name=name, platform="linux", pods=3, reason="TakenOver")
            for name in ("istio-cni-node", "ztunnel")
        ],
    )
    outcome = ApplyOutcome(
        rollout=rollout_message(rollout, held=held_platforms(held)),
        held=held_message(held, ["linux"], {"linux": new}),
        as_is=as_is_message(
            AdoptionStatus(
                releases=["ztunnel"],
                as_is=[AsIsDaemonSet(name="ztunnel", platform="linux", pods=3)],
            ),
            NS,
            held=True,
        ),
    )
    assert outcome.verdict(14).message == (
        "14 objects match the spec; agents are held, running the pod template that Helm wrote "
        "(linux: 6 pod(s) of istio-cni-node, ztunnel); approving restarts them with this "
        "operator's render (Linux: istio-cni: new image; ztunnel: new image), in order, Linux "
        "first; nothing restarts until this AmbientMesh changes or you approve (kubectl annotate "
        "ambientmesh default ambientoperator.io/approve-templates=abc123 --overwrite) "
        "(status.held lists the fields that differ); taken over from Helm as they run: ztunnel "
        "(3 pods on linux, 0 fields differ from the render) (status.adoption.asIs lists the "
        "fields). If the releases' records are still there, `helm uninstall` would delete these "
        "objects: have Helm forget each release first (kubectl delete secret -n istio-system "
        "-l owner=helm,name=ztunnel; docs/migration.md)"
    )
    # Not held, the same rollout is a replacement under way.
    assert rollout_message(rollout) == f"the agents on Linux are being replaced ({new})"


def test_an_old_approval_is_called_stale_only_while_something_waits_for_one() -> None:
    waiting = Held("ztunnel", "linux", "d1", OPERATOR_UPGRADE, False)
    live = {"ztunnel": ds("OLD_VAR")}
    status = held_status([waiting], live, "new-token", "old-token")
    assert status is not None
    assert (status.approval, status.stale_approval) == ("new-token", "old-token")
    assert [(d.name, d.pods, d.approved) for d in status.daemon_sets] == [("ztunnel", 3, False)]
    # Approved and waiting for its turn: the approval was honoured, not stale.
    rolling = held_status([dataclasses.replace(waiting, approved=True)], live, "t2", "t1")
    assert rolling is not None and rolling.stale_approval is None
    assert held_status([], live, "t", "t") is None
