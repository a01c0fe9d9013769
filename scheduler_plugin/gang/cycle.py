"""One gang-planning cycle over the gated pods of a gang (pure; the operator wires it to the API).

The mutating webhook gates every gang member (``spec.schedulingGates: [{name: kelvin.dev/gang}]``). Once the gang's
minimum number of members exists, :func:`plan_gang` plans all of them at once and returns what to write:

* on success, per member one patch: the plan as annotations (``kelvin.dev/gang-planned-node`` and
  ``-planned-gpus``, which the extender's pod listing counts as taken until the member binds, so no other pod takes
  the planned capacity) and the gate removed, so kube-scheduler schedules the member; the extender's filter then
  passes only the planned node and its bind gives the planned GPUs;
* on failure, nothing for the pods (they stay gated and hold nothing) and an Event's reason (``unresolvable``
  when no domain could ever hold the gang).

A plan that went stale before the member bound (its node disappeared, turned hot or is predicted hot, or its GPUs
were taken: :mod:`.plan_check`, the check the extender's filter runs too) is found by :func:`stale_plans` and
replaced by :func:`replan_gang`. A scheduling gate cannot be added
back once removed (the API server refuses a pod update that adds one), so a stale member stays ungated meanwhile:
the extender's planned-node filter refuses it every node while its plan does not hold, and the re-plan's
annotation update puts it back in kube-scheduler's active queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ..model import FleetArrays, GpuNode, GpuRequest, RequestError, parse_pod
from ..model import annotations as ann
from ..model.claim import parse_gpu_indices
from ..model.pod import key_of, pod_key
from ..model.snapshot import Snapshot
from ..policies.base import CycleContext
from .levels import GangPolicy
from .plan_check import PlannedOn, plan_problem, thermal_masks
from .planner import Gang, GangPlan, GangPlanner, Member, PlanFailure
from .readers import GangError, GangRef, TopologyAsk, read_gang
from .topology import Domains, build_domains

BoolA = npt.NDArray[np.bool_]


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
    stale: Mapping[str, str] = field(default_factory=dict)
    """A re-planning decision (:func:`replan_gang`): pod key -> why its plan went stale (empty for a first plan)."""


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


# --- stale plans ---------------------------------------------------------------------------------------------------

_DONE = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class PlacedMember:
    """A gang member past its gate: planned (``planned`` node and ``gpus``) and maybe bound (``bound``: its node)."""

    namespace: str
    name: str
    ref: GangRef
    request: GpuRequest
    planned: str | None
    gpus: tuple[int, ...]
    bound: str | None

    @property
    def key(self) -> str:
        return pod_key(self.namespace, self.name)


def placed_member(pod: Mapping[str, Any], policy: GangPolicy) -> PlacedMember | None:
    """The pod as an ungated, live gang member (planned by kelvin or bound), else ``None``."""
    if is_gated(pod):
        return None
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in _DONE:
        return None
    annotations = meta.get("annotations") or {}
    planned = annotations.get(ann.GANG_PLANNED_NODE)
    bound = spec.get("nodeName")
    if not planned and not bound:
        return None
    try:
        ref = read_gang(pod, policy)
        req = parse_pod(pod)
    except (GangError, RequestError):
        return None
    if ref is None:
        return None
    gpus = parse_gpu_indices(annotations.get(ann.GANG_PLANNED_GPUS)) or ()
    return PlacedMember(
        str(meta.get("namespace") or "default"),
        str(meta.get("name") or ""),
        ref,
        req,
        str(planned) if planned else None,
        tuple(gpus),
        str(bound) if bound else None,
    )


def stale_plans(
    members: Iterable[PlacedMember],
    snapshot: Snapshot,
    hot: Sequence[bool] | BoolA,
    predicted: Sequence[bool] | BoolA,
) -> dict[str, str]:
    """Pod key -> why its plan went stale, for the planned, not yet bound ``members`` whose plan no longer holds
    (:func:`~scheduler_plugin.gang.plan_check.plan_problem`, the check the extender's filter runs too: node gone,
    hot, predicted hot, planned GPUs taken by another pod; ``hot`` and ``predicted`` per fleet row). Members bound
    already, or whose plan still holds, are not in it."""
    out: dict[str, str] = {}
    for m in members:
        if m.bound or m.planned is None:
            continue
        problem = plan_problem(PlannedOn(m.key, m.planned, m.gpus, m.request), snapshot, hot, predicted)
        if problem is not None:
            out[m.key] = f"{m.key}: {problem}"
    return out


def outside_bound_domain(
    unbound: Sequence[PlacedMember],
    bound_nodes: Sequence[str],
    snapshot: Snapshot,
    labels_of: Callable[[GpuNode], Mapping[str, str]],
    policy: GangPolicy,
    ask: TopologyAsk | None,
    already: Mapping[str, str],
) -> dict[str, str]:
    """Pod key -> why, for the planned, unbound members of a ``required=<level>`` gang whose planned node is not in
    the ``<level>`` domain of its bound members (``already`` stale ones left out). The operator writes a re-plan
    member by member, so a member whose old plan still held can bind on it before its new plan lands: the gang's
    bound and planned members then sit in two domains. Such a plan is stale; the re-plan puts the rest next to the
    bound members, or they wait."""
    if not bound_nodes or ask is None or not ask.required:
        return {}
    fleet = snapshot.arrays
    domains = build_domains(fleet.names, [labels_of(nd) for nd in snapshot.nodes], policy)
    ids = domains.ids[domains.level_index(ask.level)]
    bound_ids = {int(ids[r]) for n in bound_nodes if (r := fleet.index.get(n)) is not None}
    if len(bound_ids) != 1:
        return {}  # bound members gone from the snapshot or spread already: nothing a plan can mend
    (dom,) = bound_ids
    out: dict[str, str] = {}
    for m in unbound:
        if m.planned is None or m.key in already:
            continue
        row = fleet.index.get(m.planned)
        if row is not None and int(ids[row]) != dom:
            out[m.key] = f"{m.key}: its planned node {m.planned} is outside the {ask.level} of its bound members"
    return out


def _without(snapshot: Snapshot, keys: set[str], keep: Callable[[GpuNode], bool] = lambda _: True) -> Snapshot:
    """``snapshot`` restricted to the nodes ``keep`` accepts, with the assignments of the pods ``keys`` removed (a
    stale plan's own capacity is free for its re-plan)."""
    nodes = []
    for nd in snapshot.nodes:
        if not keep(nd):
            continue
        if any(a.pod_key in keys for a in nd.assignments):
            nd = replace(nd, assignments=tuple(a for a in nd.assignments if a.pod_key not in keys))
        nodes.append(nd)
    return Snapshot(nodes=tuple(nodes), taken_at=snapshot.taken_at, source=snapshot.source)


def _annotations_patch(node: str, gpus: tuple[int, ...]) -> dict[str, Any]:
    text = ",".join(map(str, gpus))
    return {"metadata": {"annotations": {ann.GANG_PLANNED_NODE: node, ann.GANG_PLANNED_GPUS: text}}}


def replan_gang(
    pods: Sequence[Mapping[str, Any]],
    planner: GangPlanner,
    snapshot: Snapshot,
    labels_of: Callable[[GpuNode], Mapping[str, str]],
    now: float,
) -> Decision | None:
    """Re-plan the gang of ``pods`` (its ungated members: planned, bound) when the plan of a member not yet bound
    went stale (:func:`stale_plans`); ``None`` when nothing is stale. ``labels_of``: a node's labels (the levels').

    A gang is never half-bound:

    * no member bound yet: the whole gang is planned again, as at first (its stale plan's capacity freed);
    * some bound: only the unbound members are planned, in the tightest domain around the bound members that holds
      them (up to the asked level for ``required=``, up to the cluster for ``preferred=``); when none does, nothing
      is written: the unbound members wait (the extender refuses a plan on a gone or hot node) and the gang is
      retried every pass, the bound ones are not evicted (a running job is not stopped for a plan that may fit a
      few seconds later).

    The patches carry the new plan annotations only: the gate is gone already and cannot be put back."""
    members = [m for p in pods if (m := placed_member(p, planner.policy)) is not None]
    if not members:
        return None
    key = members[0].ref.key
    members = [m for m in members if m.ref.key == key]
    unbound = [m for m in members if m.bound is None]
    if not unbound:
        return None
    fw = planner.fw
    fleet = snapshot.arrays
    hot, predicted = thermal_masks(planner, fleet, fw.context(fleet, now))
    ask = members[0].ref.topology
    bound_nodes = [m.bound for m in members if m.bound is not None]
    stale = stale_plans(unbound, snapshot, hot, predicted)
    stale.update(outside_bound_domain(unbound, bound_nodes, snapshot, labels_of, planner.policy, ask, stale))
    if not stale:
        return None
    if fw.ledger is not None:  # the stale plan's own assumed capacity is free for its re-plan
        for m in unbound:
            fw.ledger.forget(m.key)
    keys = {m.key for m in unbound}
    why = "; ".join(stale[k] for k in sorted(stale))
    sub: list[tuple[Snapshot, TopologyAsk | None]]
    if not bound_nodes:
        sub = [(_without(snapshot, keys), ask)]
    else:
        sub = _around(snapshot, keys, bound_nodes, labels_of, planner.policy, ask)
    gang = Gang(key, tuple(Member(m.key, m.request, m.ref.index) for m in unbound), ask)
    failure: PlanFailure | None = None
    for snap, sub_ask in sub:
        sfleet = snap.arrays
        domains = build_domains(sfleet.names, [labels_of(nd) for nd in snap.nodes], planner.policy)
        result = planner.plan(replace(gang, topology=sub_ask), sfleet, domains, fw.context(sfleet, now))
        if isinstance(result, GangPlan):
            patches = {p.member: _annotations_patch(p.node, p.gpus) for p in result.placements}
            nodes = ", ".join(dict.fromkeys(result.nodes))
            kept = f"; {len(bound_nodes)} bound member(s) kept" if bound_nodes else ""
            reason = (
                f"gang {key} re-planned ({why}): {len(result.placements)} members planned in {result.level} "
                f"{result.domain} ({nodes}){kept}"
            )
            return Decision(key, patches, reason, True, plan=result, stale=stale)
        failure = result
    where = " next to its bound members" if bound_nodes else ""
    detail = f": {failure.reason}" if failure is not None else ": its bound members are spread past the asked level"
    reason = f"gang {key}: stale plan ({why}) cannot be re-planned{where} now{detail}"
    return Decision(key, {}, reason, False, stale=stale)


def _around(
    snapshot: Snapshot,
    keys: set[str],
    bound: Sequence[str],
    labels_of: Callable[[GpuNode], Mapping[str, str]],
    policy: GangPolicy,
    ask: TopologyAsk | None,
) -> list[tuple[Snapshot, TopologyAsk | None]]:
    """The sub-fleets to re-plan unbound members in, tightest first: per level from the innermost that holds every
    bound member in one domain, out to the asked level (``required=``) or the cluster, that domain's nodes."""
    fleet = snapshot.arrays
    domains = build_domains(fleet.names, [labels_of(nd) for nd in snapshot.nodes], policy)
    rows = [fleet.index[n] for n in bound if n in fleet.index]
    if not rows:
        return []
    last = domains.level_index(ask.level) if ask is not None and ask.required else len(domains.levels) - 1
    out: list[tuple[Snapshot, TopologyAsk | None]] = []
    seen: set[frozenset[str]] = set()
    for lv in range(last + 1):
        ids = domains.ids[lv]
        if len({int(ids[r]) for r in rows}) != 1:
            continue
        dom = int(ids[rows[0]])
        names = frozenset(n for i, n in enumerate(fleet.names) if int(ids[i]) == dom)
        if names in seen:
            continue
        seen.add(names)
        out.append((_without(snapshot, keys, _in(names)), None))
    return out


def _in(names: frozenset[str]) -> Callable[[GpuNode], bool]:
    return lambda nd: nd.name in names
