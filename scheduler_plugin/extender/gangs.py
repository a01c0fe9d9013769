"""The extender's side of gang planning (docs/jobs.md): a planned member goes to its planned node, with its planned
GPUs.

The operator's gang planner records a member's plan on the pod (``kelvin.dev/gang-planned-node``, and the
``kelvin.dev/gpu-assigned`` annotations the pod listing merges into the snapshot, so the planned capacity counts as
taken for every other pod). At filter, :func:`planned_filter` passes that node only, every other with a reason
naming it; a planned node that is gone, or hot now, passes nowhere (the operator re-plans the gang). At bind,
:func:`planned_gpus` gives the GPUs the snapshot holds for the pod on that node, so the member gets what the plan
charged instead of a fresh pick (which would see its own planned GPUs as taken).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..hotness import HotnessConfig, trigger_mask
from ..model import FleetArrays
from ..model import annotations as ann
from ..model.snapshot import Snapshot
from ..policies.framework import Framework


def planned_node(pod: Mapping[str, Any]) -> str | None:
    """The node the gang planner chose for this pod, or ``None`` for a pod without a plan."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    value = annotations.get(ann.GANG_PLANNED_NODE) if isinstance(annotations, Mapping) else None
    return value if isinstance(value, str) and value else None


def planned_filter(
    planned: str, names: Sequence[str], fleet: FleetArrays, framework: Framework
) -> tuple[list[int], dict[str, str]]:
    """(positions of ``names`` that pass, node -> reason for the others) for a member planned on ``planned``; hot by
    the framework's ``hotness`` rule (whether or not its hot filter is on)."""
    hotness = framework.hot_filter.cfg if framework.hot_filter is not None else HotnessConfig()
    row = fleet.index.get(planned)
    if row is None:
        why = f"gang member planned on node {planned}, which kelvin no longer sees; the operator re-plans the gang"
        return [], dict.fromkeys(names, why)
    hot = trigger_mask(fleet, hotness)[row]
    if hot.any():
        why = f"gang member planned on node {planned}, which is hot now; the operator re-plans the gang"
        return [], dict.fromkeys(names, why)
    passed = [i for i, n in enumerate(names) if n == planned]
    other = f"gang member: kelvin's gang planner placed it on node {planned}"
    return passed, {n: other for n in names if n != planned}


def planned_gpus(snapshot: Snapshot, node: str, pod_key: str) -> tuple[int, ...] | None:
    """The GPUs the snapshot holds for ``pod_key`` on ``node`` (its plan, or an earlier bind), or ``None``."""
    nd = snapshot.node(node)
    if nd is None:
        return None
    for a in nd.assignments:
        if a.pod_key == pod_key and a.gpu_indices:
            return a.gpu_indices
    return None
