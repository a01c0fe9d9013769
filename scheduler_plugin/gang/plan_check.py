"""Whether a gang member's plan still holds: the one check the operator's stale-plan pass
(:func:`scheduler_plugin.gang.cycle.stale_plans`) and the extender's planned-node filter
(:func:`scheduler_plugin.extender.gangs.planned_filter`) share, so the two never disagree (docs/jobs.md).

A plan (node and GPUs, written by the operator's gang planner) no longer holds when its node is

* gone from the snapshot,
* hot now (the planner's ``hotness`` rule, whether or not the extender's hot filter is on),
* predicted hot under load (thermal quality below ``gang.minThermalQuality``: the planner never puts a member there),
* or when another pod now holds its planned GPUs (the member would no longer fit them; what each pod occupies is its
  charge on the GPU, :func:`~scheduler_plugin.model.claim.charged_milli`). Other gang *plans* do not count: the
  planner charges every plan to its ledger, so two plans overlap only while a re-plan's annotations are being
  written, and re-planning is the operator's.

The extender refuses such a member every node (it must not bind there in the seconds before the operator's next pass);
the operator re-plans its gang. Pure: the caller passes the snapshot and the thermal masks (:func:`thermal_masks`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..hotness import trigger_mask
from ..model import FleetArrays, GpuNode, GpuRequest
from ..model.claim import charged_milli, claim_of
from ..model.gpu import MILLI_PER_GPU
from ..model.snapshot import Snapshot
from ..policies.base import CycleContext
from .planner import GangPlanner

BoolA = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class PlannedOn:
    """A member's plan: ``key`` (``namespace/name``) asking ``request``, planned on ``node``'s ``gpus``."""

    key: str
    node: str
    gpus: tuple[int, ...]
    request: GpuRequest


def thermal_masks(planner: GangPlanner, fleet: FleetArrays, ctx: CycleContext) -> tuple[BoolA, BoolA]:
    """Per fleet row: (hot now by the planner's ``hotness`` rule, predicted hot under load: thermal quality below
    ``gang.minThermalQuality``), the two reasons the planner keeps a gang member off a node."""
    hot = np.asarray(trigger_mask(fleet, planner.hotness).any(axis=1), dtype=np.bool_)
    quality = planner.node_quality(planner.fw.view(fleet, ctx))
    return hot, np.asarray(quality < planner.policy.min_thermal_quality, dtype=np.bool_)


def taken_by(node: GpuNode, plan: PlannedOn) -> str | None:
    """The pod holding the plan's GPUs on ``node`` so that the member no longer fits them, or ``None``. The member
    itself and gang plans (``GpuAssignment.gang_plan``, its own gang's and others') do not count; a bound member of
    its gang does, like any pod."""
    want = claim_of(plan.request, plan.gpus)
    for g in node.gpus:
        if g.index not in plan.gpus:
            continue
        others = [a for a in node.assignments if g.index in a.gpu_indices and not a.gang_plan and a.pod_key != plan.key]
        used = sum(charged_milli(a, g.memory_total_bytes) for a in others)
        if others and used + charged_milli(want, g.memory_total_bytes) > MILLI_PER_GPU:
            return others[0].pod_key
    return None


def plan_problem(
    plan: PlannedOn,
    snapshot: Snapshot,
    hot: Sequence[bool] | BoolA,
    predicted: Sequence[bool] | BoolA,
) -> str | None:
    """Why ``plan`` no longer holds (``"its planned node n1 is hot"``), or ``None`` when it still does. ``hot`` and
    ``predicted``: per row of ``snapshot.arrays`` (:func:`thermal_masks`)."""
    row = snapshot.arrays.index.get(plan.node)
    node = snapshot.node(plan.node)
    if row is None or node is None:
        return f"its planned node {plan.node} is gone"
    if hot[row]:
        return f"its planned node {plan.node} is hot"
    if predicted[row]:
        return f"its planned node {plan.node} is predicted hot under load"
    other = taken_by(node, plan)
    if other is not None:
        gpus = ",".join(map(str, plan.gpus))
        return f"its planned GPUs {gpus} on {plan.node} are taken by {other}"
    return None
