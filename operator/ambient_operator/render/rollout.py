"""The order of a version change: one platform at a time, each Ready before the next.

Pure: from the images the spec asks for per platform and what the live
DaemonSets run (cluster/versions.py's `RunningAgent`, which the data-plane
pass builds from its caches), decide which images each platform is
rendered with this pass.

Linux goes first, then each Windows build, oldest first. A platform whose
DaemonSets run other images than the spec asks gets the new ones only when
every platform before it is `current`: rendered as the spec asks and Ready
there, every pod updated and available. Until then it keeps the images it
runs, and only those: any other change of the spec reaches it at once. A
platform without live DaemonSets has nothing to keep and gets the spec's
images. So a new version that does not come up on Linux (an image that
does not pull, an agent that crashes) never reaches a Windows node, and a
platform whose agents cannot all become available (a node that is gone but
not deleted) holds back the platforms after it, as it would hold back its
own rolling update.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ambient_operator.cluster.versions import RunningAgent
from ambient_operator.render.model import Component, OrderedRollout, PlatformRollout
from ambient_operator.render.values import ZTUNNEL


def decide(
    order: Sequence[str],
    wanted: Mapping[str, Mapping[Component, str]],
    running: Mapping[tuple[str, str], RunningAgent],
    revision: str | None = None,
) -> OrderedRollout:
    """Each platform's images and istiod revision for this pass, in rollout order.

    `order` lists the platforms in rollout order; `wanted` gives, per
    platform, each component's image as the spec asks; `running` the live
    DaemonSets by (platform, component); `revision` the istiod revision the
    spec asks ztunnel to serve (spec.istiod.revision). A platform whose
    ztunnel serves another revision is moved like one that runs another
    image: in order, keeping the revision it has until its turn.
    """
    out: list[PlatformRollout] = []
    blocker: str | None = None
    for platform in order:
        want = dict(wanted[platform])
        live = {
            comp: agent
            for comp in want
            if (agent := running.get((platform, comp))) is not None and agent.image
        }
        have = {comp: str(agent.image) for comp, agent in live.items()}
        differs = [comp for comp in want if comp in have and have[comp] != want[comp]]
        serving = live[ZTUNNEL].revision if ZTUNNEL in live else revision
        moves = serving != revision
        if blocker is not None and (differs or moves):
            keep = {comp: have[comp] if comp in differs else want[comp] for comp in want}
            out.append(PlatformRollout(platform, "waiting", keep, have, blocker, revision=serving))
            continue
        unsettled = [
            f"{comp}: {_change(comp in differs, moves and comp == ZTUNNEL) or agent.progress}"
            for comp, agent in sorted(live.items())
            if comp in differs or (moves and comp == ZTUNNEL) or not agent.settled
        ]
        updating = bool(differs) or moves or any(agent.updating for agent in live.values())
        if unsettled or updating:
            why = "; ".join(unsettled) or "rollout not observed yet"
            # Pods merely starting (a node joined) are no rollout, unless they hold one back.
            held = not updating
            out.append(
                PlatformRollout(
                    platform, "rolling", want, have, why, settling=held, revision=revision
                )
            )
            blocker = blocker or platform
        else:
            out.append(PlatformRollout(platform, "current", want, have, revision=revision))
    if not any(p.state == "waiting" for p in out):
        out = [
            PlatformRollout(p.platform, "current", p.images, p.running, revision=p.revision)
            if p.settling
            else p
            for p in out
        ]
    return OrderedRollout(tuple(out))


def _change(image: bool, revision: bool) -> str:
    """What is new for one agent: its image, its istiod revision, or both ('' for neither)."""
    return "; ".join(
        what for what, new in (("new image", image), ("new istiod revision", revision)) if new
    )


def release_held(rollout: OrderedRollout, approved: Mapping[str, Sequence[bool]]) -> frozenset[str]:
    """The platforms whose held pod templates roll this pass (apply/held.py).

    `approved` gives, per platform with held DaemonSets, whether the user
    approved each. In rollout order, the first platform with held templates
    rolls when all of them are approved and every platform before it is
    current (nothing held, its images rolled and Ready); the others wait, as
    a version change's do. So an approval replaces Linux's agents first, and
    a Windows build's only once Linux runs the new template everywhere.
    """
    for platform in rollout.platforms:
        flags = approved.get(platform.platform)
        if flags:
            return frozenset({platform.platform}) if all(flags) else frozenset()
        if platform.state != "current":
            return frozenset()
    return frozenset()
