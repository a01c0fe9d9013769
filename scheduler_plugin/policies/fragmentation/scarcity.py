"""Live scarcity of the workload's shapes: how few of the fleet's free GPUs can still host each shape, now.

FGD's measure weighs a shape's loss on a node by the shape's probability alone, as if its demand could go anywhere.
A shape that only a few nodes can host (a 120-core 8-GPU pod that fits only the biggest nodes, a pod pinned to a
rare GPU model) loses its *last* homes at the same price as a common shape loses one of many; the stranding term,
priced at the workload's mean CPU per GPU, then outbids it. Here each GPU shape m gets a weight from the snapshot:

    weight_m = clip(C / C_m, 1, cap), rounded down to a power of ``2 ** (1 / STEPS_PER_DOUBLING)``

where C is the fleet's free GPU thousandths and C_m the free thousandths that m could use now: on the nodes m
fits (CPU, host memory, ``count`` GPUs with m's share free, and a GPU model m admits), the GPUs with at least m's
share free (what F counts as usable for m). A shape every node can host weighs 1; one that only 5 % of the free
GPUs can host weighs 16 (``cap``, 64 by default); a shape that fits nowhere weighs 1 (its F is the same on every
node, so no placement changes it). The weights multiply the probabilities in F (:meth:`Workload.priced`); the
stranding ratio and the packing plan keep the workload's own mix.

Computed once per snapshot from the fleet's free stats (O(nodes x shapes)); the rounding keeps the priced workload
the same object while no weight crosses a step, so the fleet's F memo keeps serving it.
"""

from __future__ import annotations

import numpy as np

from ...model import FleetArrays
from ..base import BoolA, FloatA, IntA
from .shape_groups import shape_groups
from .workload import Workload

DEFAULT_SCARCITY_CAP = 64.0
STEPS_PER_DOUBLING = 2


def usable_capacity(
    w: Workload,
    gpus_at_least: IntA,
    free_at_least: FloatA,
    cpu: IntA,
    mem: IntA | None,
    access: BoolA | None,
) -> FloatA:
    """(M,) per shape of ``w``: the free GPU thousandths it could use now, summed over the rows (nodes).

    ``gpus_at_least`` / ``free_at_least``: (N, T) the rows' free stats per threshold of ``w``; ``cpu``: (N,) free
    millicores; ``mem``: (N,) free host memory (``None``: not checked); ``access``: (N, M) shape m admits the row's
    GPU model (``None``: every shape admits every node). CPU-only shapes get 0."""
    groups = shape_groups(w)
    out = np.zeros(len(w), dtype=np.float64)
    if not len(groups.members):
        return out
    ok = cpu[None, :] >= groups.cpu_milli[:, None]
    ok &= gpus_at_least.T[groups.threshold] >= groups.count[:, None]
    if mem is not None:
        ok &= mem[None, :] >= groups.host_memory[:, None]
    usable = np.where(ok, free_at_least.T[groups.threshold], 0.0)  # (G, N)
    for g, ms in enumerate(groups.members):
        if access is None:
            out[ms] = float(usable[g].sum())
        else:
            out[ms] = usable[g] @ access[:, ms]
    return out


def scarcity_weights(usable: FloatA, free_total: float, cap: float = DEFAULT_SCARCITY_CAP) -> FloatA:
    """(M,) the weight of each shape from its usable capacity (:func:`usable_capacity`) and the fleet's free GPU
    thousandths: ``free_total / usable``, at least 1, at most ``cap``, rounded down to a step; 1 where nothing is
    usable (the shape fits nowhere, or asks for no GPU)."""
    if cap < 1:
        raise ValueError(f"scarcity cap must be at least 1, got {cap:g}")
    out = np.ones(len(usable), dtype=np.float64)
    some = usable > 0
    if free_total <= 0 or not some.any():
        return out
    ratio = np.minimum(np.maximum(free_total / usable[some], 1.0), cap)
    steps = np.floor(np.log2(ratio) * STEPS_PER_DOUBLING + 1e-9) / STEPS_PER_DOUBLING
    out[some] = np.minimum(np.exp2(steps), cap)
    return out


def fleet_scarcity(
    w: Workload,
    fleet: FleetArrays,
    gpus_at_least: IntA,
    free_at_least: FloatA,
    memory_aware: bool,
    cap: float = DEFAULT_SCARCITY_CAP,
) -> FloatA:
    """:func:`scarcity_weights` of ``w`` on the whole ``fleet`` (its free stats per threshold given)."""
    access = None if w.unrestricted else w.node_access(fleet)
    mem = fleet.mem_free_host if memory_aware else None
    usable = usable_capacity(w, gpus_at_least, free_at_least, fleet.cpu_free, mem, access)
    free_total = float(np.where(fleet.gpu_present, fleet.free_milli, 0).sum(dtype=np.int64))
    return scarcity_weights(usable, free_total, cap)


def is_uniform(weights: FloatA) -> bool:
    return bool(np.all(weights == 1.0))


def describe(w: Workload, weights: FloatA, top: int = 3) -> str:
    """The scarcest shapes, for explain lines."""
    order = [int(i) for i in np.argsort(-weights, kind="stable")[:top] if weights[i] > 1.0]
    if not order:
        return "no shape is scarce (every shape can use most of the free GPUs)"
    parts = [
        f"{int(w.count[i])}x{int(w.milli[i]) / 1000:g} GPU {int(w.cpu_milli[i]) / 1000:g} cores x{weights[i]:g}"
        for i in order
    ]
    return "scarce shapes: " + ", ".join(parts)


__all__ = [
    "DEFAULT_SCARCITY_CAP",
    "STEPS_PER_DOUBLING",
    "describe",
    "fleet_scarcity",
    "is_uniform",
    "scarcity_weights",
    "usable_capacity",
]
