"""The extender's side of gang planning (docs/jobs.md): a planned member goes to its planned node, with its planned
GPUs.

The operator's gang planner records a member's plan on the pod (``kelvin.dev/gang-planned-node`` and
``-planned-gpus``, which the pod listing merges into the snapshot, so the planned capacity counts as taken for every
other pod). At filter, :func:`planned_filter` passes that node only, every other with a reason naming it; a plan that
no longer holds (its node gone, hot now or predicted hot under load, its GPUs taken by another pod:
:mod:`scheduler_plugin.gang.plan_check`, the check the operator's stale-plan pass runs) passes nowhere (the operator
re-plans the gang). At bind, :func:`planned_gpus` gives the GPUs the snapshot holds for the pod on that node, so the
member gets what the plan charged instead of a fresh pick (which would see its own planned GPUs as taken). The pod
listing is refreshed every few seconds, so a member can reach bind before the snapshot shows its plan: bind then uses
the plan filter read from the pod itself (:func:`plan_of`), once :func:`bind_problem` finds its GPUs still free of
every pod the snapshot and the ledger know (a fresh pick there could take another member's planned GPUs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..gang.plan_check import PlannedOn, plan_problem, taken_by, thermal_masks
from ..gang.planner import GangPlanner
from ..model import GpuAssignment, GpuRequest
from ..model import annotations as ann
from ..model.claim import parse_gpu_indices
from ..model.pod import key_of
from ..model.snapshot import Snapshot
from ..policies.base import CycleContext


def planned_node(pod: Mapping[str, Any]) -> str | None:
    """The node the gang planner chose for this pod, or ``None`` for a pod without a plan."""
    value = _annotations(pod).get(ann.GANG_PLANNED_NODE)
    return value if isinstance(value, str) and value else None


def plan_of(pod: Mapping[str, Any], req: GpuRequest) -> PlannedOn | None:
    """The plan the gang planner wrote on ``pod`` (asking ``req``), or ``None`` for a pod without one. Its GPUs are
    empty when the pod names a node but no (readable) GPUs."""
    node = planned_node(pod)
    if node is None:
        return None
    gpus = parse_gpu_indices(_annotations(pod).get(ann.GANG_PLANNED_GPUS)) or ()
    return PlannedOn(key_of(pod), node, gpus, req)


def planned_filter(
    plan: PlannedOn,
    names: Sequence[str],
    snapshot: Snapshot,
    planner: GangPlanner,
    ctx: CycleContext,
) -> tuple[list[int], dict[str, str]]:
    """(positions of ``names`` that pass, node -> reason for the others) for a member with ``plan``. A plan that no
    longer holds (:func:`~scheduler_plugin.gang.plan_check.plan_problem`, the check the operator's stale-plan pass
    runs: node gone, hot, predicted hot under load, planned GPUs taken by another pod) passes nowhere, with the reason
    on every node: the member must not bind there before the operator re-plans."""
    hot, predicted = thermal_masks(planner, snapshot.arrays, ctx)
    problem = plan_problem(plan, snapshot, hot, predicted)
    if problem is not None:
        why = f"gang member: {problem}; the operator re-plans the gang"
        return [], dict.fromkeys(names, why)
    passed = [i for i, n in enumerate(names) if n == plan.node]
    other = f"gang member: kelvin's gang planner placed it on node {plan.node}"
    return passed, {n: other for n in names if n != plan.node}


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def planned_gpus(snapshot: Snapshot, node: str, pod_key: str) -> tuple[int, ...] | None:
    """The GPUs the snapshot holds for ``pod_key`` on ``node`` (its plan, or an earlier bind), or ``None``."""
    nd = snapshot.node(node)
    if nd is None:
        return None
    for a in nd.assignments:
        if a.pod_key == pod_key and a.gpu_indices:
            return a.gpu_indices
    return None


def bind_problem(plan: PlannedOn, snapshot: Snapshot, assumed: Sequence[GpuAssignment]) -> str | None:
    """Why the member cannot bind on its plan's GPUs now (``"its planned GPUs 0,1 on n1 are taken by ns/p"``), or
    ``None`` when they are still free: counted with the pods the snapshot lists on the node and ``assumed``, the
    ledger's binds there the pod listing does not show yet."""
    nd = snapshot.node(plan.node)
    if nd is None:
        return f"its planned node {plan.node} is gone"
    have = {a.pod_key for a in nd.assignments}
    extra = tuple(a for a in assumed if a.pod_key not in have)
    other = taken_by(replace(nd, assignments=nd.assignments + extra) if extra else nd, plan)
    if other is None:
        return None
    return f"its planned GPUs {','.join(map(str, plan.gpus))} on {plan.node} are taken by {other}"
