"""One gang-planning cycle over the gated pods of a gang (pure; the operator wires it to the API).

The mutating webhook gates every gang member (``spec.schedulingGates: [{name: kelvin.dev/gang}]``). Once the gang's
minimum number of members exists, :func:`plan_gang` plans all of them at once and returns what to write:

* on success, per member one patch: the plan as annotations (``kelvin.dev/gang-planned-node`` and
  ``-planned-gpus``, which the extender's pod listing counts as taken until the member binds, so no other pod takes
  the planned capacity) and the gate removed, so kube-scheduler schedules the member; the extender's filter then
  passes only the planned node and its bind gives the planned GPUs;
* on failure, nothing for the pods (they stay gated and hold nothing) and an Event's reason (``unresolvable``
  when no domain could ever hold the gang).

A plan whose node disappeared or turned hot before the member bound is found by :func:`stale_members`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..model import FleetArrays, GpuRequest, RequestError, parse_pod
from ..model import annotations as ann
from ..model.pod import key_of, pod_key
from ..policies.base import CycleContext
from .levels import GangPolicy
from .planner import Gang, GangPlan, GangPlanner, Member, PlanFailure
from .readers import GangError, GangRef, read_gang
from .topology import Domains


@dataclass(frozen=True, slots=True)
class GatedMember:
    namespace: str
    name: str
    ref: GangRef
    request: GpuRequest

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)


def is_gated(pod: Mapping[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, Mapping) and g.get("name") == ann.GANG_SCHEDULING_GATE for g in gates)


def gated_member(pod: Mapping[str, Any], policy: GangPolicy) -> GatedMember | None:
    """The pod as a gang member waiting for its plan (gated by kelvin); ``None`` for any other pod."""
    if not is_gated(pod):
        return None
    try:
        ref = read_gang(pod, policy)
        req = parse_pod(pod)
    except (GangError, RequestError):
        return None  # admission refuses these; one created before kelvin's webhook stays gated until fixed
    if ref is None:
        return None
    meta = pod.get("metadata") or {}
    return GatedMember(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), ref, req)


def gangs_of(members: Iterable[GatedMember]) -> dict[str, list[GatedMember]]:
    out: dict[str, list[GatedMember]] = {}
    for m in members:
        out.setdefault(m.ref.key, []).append(m)
    return out


@dataclass(frozen=True, slots=True)
class Decision:
    gang: str
    patches: dict[str, dict[str, Any]]
    """Pod key -> merge patch (empty when nothing is to be written)."""
    reason: str
    """What the Event says."""
    planned: bool
    waiting: bool = False
    """Fewer members than the gang's size exist yet: not planned, no Event."""
    unresolvable: bool = False
    plan: GangPlan | None = None


def _patch(pod_gates: Sequence[Mapping[str, Any]], node: str, gpus: tuple[int, ...]) -> dict[str, Any]:
    text = ",".join(map(str, gpus))
    return {
        "metadata": {
            "annotations": {
                ann.GANG_PLANNED_NODE: node,
                ann.GANG_PLANNED_GPUS: text,
            }
        },
        "spec": {"schedulingGates": [dict(g) for g in pod_gates if g.get("name") != ann.GANG_SCHEDULING_GATE]},
    }


def plan_gang(
    members: Sequence[GatedMember],
    pods: Mapping[str, Mapping[str, Any]],
    size: int | None,
    planner: GangPlanner,
    fleet: FleetArrays,
    domains: Domains,
    ctx: CycleContext,
) -> Decision:
    """Plan ``members`` (one gang's gated pods; ``pods`` their objects by key) if at least ``size`` exist."""
    key = members[0].ref.key
    if size is None:
        return Decision(key, {}, "the gang's size is not known yet (its Job is not found)", False, waiting=True)
    if len(members) < size:
        return Decision(key, {}, f"{len(members)} of {size} members exist; waiting for the rest", False, waiting=True)
    gang = Gang(key, tuple(Member(m.key, m.request, m.ref.index) for m in members), members[0].ref.topology)
    result = planner.plan(gang, fleet, domains, ctx)
    if isinstance(result, PlanFailure):
        what = "can never be placed" if result.unresolvable else "cannot be placed now"
        return Decision(key, {}, f"gang {key} {what}: {result.reason}", False, unresolvable=result.unresolvable)
    patches = {}
    for p in result.placements:
        gates = (pods[p.member].get("spec") or {}).get("schedulingGates") or []
        patches[p.member] = _patch(gates, p.node, p.gpus)
    nodes = ", ".join(dict.fromkeys(result.nodes))
    reason = f"gang {key}: {len(result.placements)} members planned in {result.level} {result.domain} ({nodes})"
    return Decision(key, patches, reason, True, plan=result)


def stale_members(pods: Iterable[Mapping[str, Any]], fleet: FleetArrays, hot: Sequence[bool]) -> list[str]:
    """Keys of planned, not yet bound members whose planned node is gone from the fleet or hot (``hot``: per fleet
    row): the extender refuses them every node, and their plan must be replaced (the plan annotations can be
    rewritten; the gate, once lifted, cannot come back)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        node = annotations.get(ann.GANG_PLANNED_NODE)
        if node is None or (pod.get("spec") or {}).get("nodeName"):
            continue
        row = fleet.index.get(node)
        if row is None or hot[row]:
            out.append(key_of(pod))
    return out
