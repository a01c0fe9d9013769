"""``/explain``'s gang part (docs/jobs.md): for a gang member, its gang and plan, and why.

A member the operator has planned carries its plan (``kelvin.dev/gang-planned-node`` and ``-planned-gpus``): the
answer says where it goes and whether that is the node asked about. A member not planned yet (gated) is planned
here, over the extender's snapshot and framework, as a gang of ``size`` members that each ask what this pod asks
(the planner's what-if; nothing is charged): the domain it would go to and each member's node and GPUs, or why it
cannot be placed now. The domains come from the Node objects' labels when the extender lists them (a Kubernetes API:
:class:`.node_labels.NodeLabelLister`, the labels the operator plans with), else from the snapshot's node labels: a
simulated fleet's carry them, a Prometheus or scrape snapshot's do not (its nodes are named from DCGM series). Only in
that case, where no node of the snapshot carries a policy level's label, the answer says so (``levels_unknown``): at
that level every node is its own domain here, a ``required=`` gang at it is reported as not known rather than as never
placeable, and the operator may decide otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..gang import GangError, GangPolicy, build_domains, read_gang
from ..gang.levels import TopologyLevel
from ..gang.planner import Gang, GangPlanner, Member, PlanFailure
from ..gang.topology import Domains
from ..model import FleetArrays, GpuRequest
from ..model import annotations as ann
from ..model.pod import key_of
from ..model.snapshot import Snapshot
from ..policies.base import CycleContext
from .node_labels import NodeLabels


def _planned(annotations: Mapping[str, Any], node: str) -> dict[str, Any] | None:
    planned = annotations.get(ann.GANG_PLANNED_NODE)
    if not isinstance(planned, str) or not planned:
        return None
    raw = str(annotations.get(ann.GANG_PLANNED_GPUS) or "")
    gpus = [int(g) for g in raw.split(",") if g.strip().isdigit()]
    return {"node": planned, "gpus": gpus, "this_node": planned == node}


def explain_gang(
    pod: Mapping[str, Any],
    req: GpuRequest,
    node: str,
    policy: GangPolicy,
    planner: GangPlanner,
    snapshot: Snapshot,
    ctx: CycleContext,
    node_labels: NodeLabels | None = None,
) -> dict[str, Any] | None:
    """The gang part of ``/explain`` for ``pod`` (asking ``req``) on ``node``; ``None`` for a pod of no gang.
    ``node_labels``: the Node objects' level labels by node name (:class:`.node_labels.NodeLabelLister`), what the
    operator plans with; ``None`` when not known (the snapshot's labels are used, and the levels none carries are
    reported as unknown)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    planned = _planned(annotations if isinstance(annotations, Mapping) else {}, node)
    try:
        ref = read_gang(pod, policy)
    except GangError as exc:  # e.g. a level this extender's policy lacks: the operator's plan is still shown
        return {"error": str(exc), **({"planned": planned} if planned is not None else {})}
    if ref is None:
        return None
    out: dict[str, Any] = {
        "gang": ref.key,
        "kind": ref.kind,
        "size": ref.size,
        "rank": ref.index,
        "topology": ref.topology.describe() if ref.topology is not None else None,
    }
    if planned is not None:
        out["planned"] = planned
        return out
    if ref.size is None:
        out["plan"] = {"planned": False, "reason": "the gang's size is not known (set kelvin.dev/gang-size)"}
        return out
    fleet: FleetArrays = snapshot.arrays
    if node_labels is not None:
        labels = [node_labels.get(nd.name, nd.labels) for nd in snapshot.nodes]
        out["levels_from"] = "the Node objects' labels"
    else:
        labels = [nd.labels for nd in snapshot.nodes]
        out["levels_from"] = f"the snapshot's node labels (source {snapshot.source!r})"
    domains = build_domains(fleet.names, labels, policy)
    unknown = _unknown_levels(policy, domains) if node_labels is None else []
    if unknown:
        out["levels_unknown"] = {
            "levels": [lv.name for lv in unknown],
            "labels": [lv.label for lv in unknown],
            "why": (
                f"no node in the extender's snapshot (source {snapshot.source!r}) carries the label of level "
                + ", ".join(f"{lv.name} ({lv.label})" for lv in unknown)
                + ": every node is its own domain there in this forecast; the operator plans with the Node objects' "
                "labels and may place the gang otherwise"
            ),
        }
        ask = ref.topology
        if ask is not None and ask.required and ask.level in out["levels_unknown"]["levels"]:
            reason = f"{ask.describe()}: not known here ({out['levels_unknown']['why']})"
            out["plan"] = {"planned": False, "reason": reason, "unresolvable": False, "levels_known": False}
            return out
    me = key_of(pod)
    rank = ref.index if ref.index is not None else 0
    others = [i for i in range(ref.size) if i != rank][: ref.size - 1]
    members = (Member(me, req, rank), *(Member(f"{ref.key}#rank-{i}", req, i) for i in others))
    result = planner.plan(Gang(ref.key, members, ref.topology), fleet, domains, ctx)
    if isinstance(result, PlanFailure):
        out["plan"] = {"planned": False, "reason": result.reason, "unresolvable": result.unresolvable}
        return out
    ranks = {m.key: m.index for m in members}
    mine = next(p for p in result.placements if p.member == me)
    out["plan"] = {
        "planned": True,
        "level": result.level,
        "domain": result.domain,
        "worst_thermal_quality": round(result.worst_thermal, 3),
        "why": list(result.why),
        "members": [{"rank": ranks[p.member], "node": p.node, "gpus": list(p.gpus)} for p in result.placements],
        "this_member": {"node": mine.node, "gpus": list(mine.gpus), "this_node": mine.node == node},
    }
    return out


def _unknown_levels(policy: GangPolicy, domains: Domains) -> list[TopologyLevel]:
    """The policy's levels no node of the snapshot carries the label of."""
    return [lv for lv in policy.levels if not domains.labelled[domains.level_index(lv.name)]]


def describe(gang: Mapping[str, Any]) -> list[str]:
    """Lines for ``kelvin explain``'s text output."""
    planned = gang.get("planned")
    if "error" in gang:
        lines = [f"gang: invalid: {gang['error']}"]
    else:
        ask = f", {gang['topology']}" if gang.get("topology") else ""
        rank = gang.get("rank")
        rank_text = rank if rank is not None else "-"
        lines = [f"gang {gang['gang']} ({gang['kind']}, {gang['size']} members{ask}), rank {rank_text}"]
    if planned is not None:
        where = "this node" if planned["this_node"] else f"node {planned['node']}, not this one"
        lines.append(f"  planned by the operator: {where}, GPUs {','.join(map(str, planned['gpus'])) or '-'}")
        return lines
    if "error" in gang:
        return lines
    unknown = gang.get("levels_unknown")
    if unknown:
        lines.append(f"  levels unknown here: {unknown['why']}")
    plan = gang.get("plan") or {}
    if not plan.get("planned"):
        if plan.get("levels_known") is False:
            what = "cannot be forecast"
        else:
            what = "can never be placed" if plan.get("unresolvable") else "cannot be placed now"
        lines.append(f"  not planned yet; planned now it {what}: {plan.get('reason')}")
        return lines
    lines.append(
        f"  not planned yet; planned now: {plan['level']} {plan['domain']} "
        f"(worst member's thermal quality {plan['worst_thermal_quality']:.2f})"
    )
    lines += [f"  {w}" for w in plan.get("why", [])]
    lines += [f"  rank {m['rank']}: {m['node']} GPUs {','.join(map(str, m['gpus'])) or '-'}" for m in plan["members"]]
    return lines
