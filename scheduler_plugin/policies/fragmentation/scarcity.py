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

Kept in the snapshot index (:class:`FleetUsable`) and updated by the rows whose content changed (the simulator's
trace-given workload: O(shapes) per arrival besides those rows); the rounding keeps the priced workload the same
object while no weight crosses a step, so the fleet's F memo keeps serving it. A learned workload is a new object
when it is republished (:mod:`.publication`): its weights are computed when a snapshot is published (``prepare``,
off the request path) and looked up per request by shape (:func:`by_shape`, :func:`weights_for`: O(shapes)).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from ...model import FleetArrays
from ...model.snapshot import IndexKey
from ..base import BoolA, FloatA, IntA
from .gradient import FLEET_FREE_TOTALS, FleetFreeTotals, free_stats
from .row_stamps import moved, row_stamps
from .shape_groups import shape_groups
from .workload import PodShape, Workload

DEFAULT_SCARCITY_CAP = 64.0
STEPS_PER_DOUBLING = 2


def _group_of_shape(w: Workload) -> IntA:
    """(M,) each shape's group in :func:`shape_groups` (CPU-only shapes: one past the last group)."""
    return shape_groups(w).of_shape


def _node_usable(w: Workload, gpus_at_least: IntA, free_at_least: FloatA, cpu: IntA | None, mem: IntA | None) -> FloatA:
    """(N, G + 1) per row and shape group: the free thousandths the group could use on the row (0 where it does not
    fit; the last column, for CPU-only shapes, is 0). ``cpu`` ``None``: the CPU is not checked."""
    groups = shape_groups(w)
    out = np.zeros((len(gpus_at_least), len(groups.members) + 1), dtype=np.float64)
    if not len(groups.members):
        return out
    ok = gpus_at_least[:, groups.threshold] >= groups.count[None, :]
    if cpu is not None:
        ok &= cpu[:, None] >= groups.cpu_milli[None, :]
    if mem is not None:
        ok &= mem[:, None] >= groups.host_memory[None, :]
    out[:, :-1] = np.where(ok, free_at_least[:, groups.threshold], 0.0)
    return out


def _per_shape(node_usable: FloatA, group: IntA, access: BoolA | None) -> FloatA:
    """(M,) :func:`_node_usable` summed over the rows per shape (only rows whose model the shape admits)."""
    per = node_usable[:, group]
    if access is not None:
        per = np.where(access, per, 0.0)
    return np.asarray(per.sum(axis=0), dtype=np.float64)


def usable_capacity(
    w: Workload,
    gpus_at_least: IntA,
    free_at_least: FloatA,
    cpu: IntA | None,
    mem: IntA | None,
    access: BoolA | None,
) -> FloatA:
    """(M,) per shape of ``w``: the free GPU thousandths it could use now, summed over the rows (nodes).

    ``gpus_at_least`` / ``free_at_least``: (N, T) the rows' free stats per threshold of ``w``; ``cpu``: (N,) free
    millicores (``None``: not checked); ``mem``: (N,) free host memory (``None``: not checked); ``access``: (N, M)
    shape m admits the row's GPU model (``None``: every shape admits every node). CPU-only shapes get 0."""
    node = _node_usable(w, gpus_at_least, free_at_least, cpu, mem)
    return _per_shape(node, _group_of_shape(w), access)


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


@dataclass(frozen=True, slots=True)
class _UsableMemo:
    workload: Workload
    memory_aware: bool
    count_cpu: bool
    stamps: IntA
    """(N,) :func:`.row_stamps` of the rows' content ``node`` was computed for."""
    node: FloatA
    """(N, G + 1) :func:`_node_usable` of every row (private to the holder: updated in place, under its lock)."""
    total: FloatA
    """(M,) :func:`_per_shape` of ``node``: every shape's usable thousandths over the fleet."""


class FleetUsable:
    """Every shape's usable free thousandths over a fleet (:func:`usable_capacity`), kept in the snapshot index and
    updated by the rows whose content changed (the simulator writes one node per arrival; content-checked like the
    fleet's F memo, by the fleet's :func:`.row_stamps`). The values are sums of integers (thousandths) in float64, so
    updating them gives what summing afresh gives. The per-row table is never handed out: an update writes its
    changed rows in place (copying the table cost a tenth of an update), under the lock.

    ``bare``: count the free GPUs alone (each shape's count and share; no CPU, host memory or GPU model check): what
    the shape's GPU demand would find if it asked for nothing else (:func:`fleet_scarcity`'s ``structural``)."""

    __slots__ = ("_bare", "_lock", "_memo")

    def __init__(self, bare: bool = False) -> None:
        self._memo: _UsableMemo | None = None
        self._lock = threading.Lock()
        self._bare = bare

    def holds(self, w: Workload, memory_aware: bool, count_cpu: bool = True) -> bool:
        """Whether the memo is for ``w`` (then :meth:`usable` costs the rows that changed only)."""
        memo = self._memo
        return (
            memo is not None
            and memo.workload is w
            and memo.memory_aware == memory_aware
            and memo.count_cpu == count_cpu
        )

    def usable(
        self, fleet: FleetArrays, w: Workload, memory_aware: bool, stamps: IntA | None = None, count_cpu: bool = True
    ) -> FloatA:
        """(M,) every shape's usable free thousandths on ``fleet`` now; ``stamps``: :func:`.row_stamps` of ``fleet``
        when the caller has them (the cycle's); ``count_cpu``: whether a shape must fit the row's free CPU."""
        stamps = row_stamps(fleet) if stamps is None else stamps
        if self._bare:
            memory_aware = count_cpu = False
        with self._lock:
            return self._usable(fleet, w, memory_aware, stamps, count_cpu)

    def _usable(self, fleet: FleetArrays, w: Workload, memory_aware: bool, stamps: IntA, count_cpu: bool) -> FloatA:
        free, mem = fleet.free_milli, fleet.mem_free_host
        cpu = fleet.cpu_free if count_cpu else None
        access = None if w.unrestricted or self._bare else w.node_access(fleet)
        group = _group_of_shape(w)
        memo = self._memo
        same = self.holds(w, memory_aware, count_cpu)
        changed = moved(memo.stamps, stamps) if memo is not None and same else None
        if changed is None:
            st = free_stats(free, w)
            node = _node_usable(w, st.gpus_at_least, st.free_at_least, cpu, mem if memory_aware else None)
            self._memo = _UsableMemo(w, memory_aware, count_cpu, stamps, node, _per_shape(node, group, access))
            return self._memo.total
        assert memo is not None
        if not len(changed):
            return memo.total
        st = free_stats(free[changed], w)
        sub = _node_usable(
            w,
            st.gpus_at_least,
            st.free_at_least,
            None if cpu is None else cpu[changed],
            mem[changed] if memory_aware else None,
        )
        acc = None if access is None else access[changed]
        # exact integers in float64: adding the rows' difference gives what adding the new and taking the old gives
        total = memo.total + _per_shape(sub - memo.node[changed], group, acc)
        memo.node[changed] = sub
        self._memo = _UsableMemo(w, memory_aware, count_cpu, stamps, memo.node, total)
        return total


FLEET_USABLE = IndexKey[FleetUsable]("fragmentation.scarcity", ())
"""Snapshot index: the :class:`FleetUsable` holder of a fleet (content-checked: no column identity)."""


FLEET_USABLE_BARE = IndexKey[FleetUsable]("fragmentation.scarcity.bare", ())
"""Snapshot index: the bare :class:`FleetUsable` of a fleet (free GPUs only; content-checked)."""


def fleet_usable(fleet: FleetArrays, bare: bool = False) -> FleetUsable:
    if bare:
        return fleet.derive(FLEET_USABLE_BARE, lambda _: FleetUsable(bare=True))
    return fleet.derive(FLEET_USABLE, lambda _: FleetUsable())


def fleet_scarcity(
    w: Workload,
    fleet: FleetArrays,
    memory_aware: bool,
    cap: float = DEFAULT_SCARCITY_CAP,
    stamps: IntA | None = None,
    count_cpu: bool = True,
    structural: float = 1.0,
) -> FloatA:
    """:func:`scarcity_weights` of ``w``'s shapes on the whole ``fleet`` now (``stamps``: :func:`.row_stamps` of
    ``fleet`` when the caller has them). ``count_cpu`` ``False``: a shape's homes are counted without checking their
    free CPU (the fragmentation policy's choice while the fleet has no CPU surplus: :meth:`scored_workload
    <.plugin.FragmentationPolicy.scored_workload>`).

    ``structural`` > 1: for the multi-GPU shapes, the part of a weight that the shape's own demands cause (CPU, host
    memory, GPU model: the weight over the one its GPU count and share alone would get on the free GPUs, the *bare*
    weight) is multiplied by it: ``min(bare + structural * (weight - bare), cap)``. Scarcity that the free GPUs'
    shares explain (a fleet filling up, whole GPUs broken into shares) is common to every shape of that count and
    share and stays as it is. A multi-GPU shape's home is a whole node's worth of free GPUs and CPU, which one
    smaller pod takes away at once; one-GPU shapes keep their weights (scaled too, the default trace's CPU- and
    memory-hungry one-GPU shapes, one half-step scarcer than their GPUs late in the run, were placed differently
    at no gain: full size, seeds 42-47, 3.73 % of GPUs unallocated either way; seed 42: 3.738 -> 3.757)."""
    stamps = row_stamps(fleet) if stamps is None else stamps
    usable = fleet_usable(fleet).usable(fleet, w, memory_aware, stamps, count_cpu)
    free_total, _ = fleet.derive(FLEET_FREE_TOTALS, lambda _: FleetFreeTotals()).totals(fleet, stamps)
    weights = scarcity_weights(usable, float(free_total), cap)
    multi = w.count > 1
    if structural <= 1.0 or not (weights[multi] > 1.0).any():
        return weights
    bare = scarcity_weights(
        fleet_usable(fleet, bare=True).usable(fleet, w, False, stamps, False), float(free_total), cap
    )
    scaled = np.minimum(bare + structural * np.maximum(weights - bare, 0.0), cap)
    return np.asarray(np.where(multi, scaled, weights), dtype=np.float64)


def by_shape(w: Workload, weights: FloatA) -> dict[PodShape, float]:
    """``weights`` keyed by ``w``'s shapes (for a workload learned later: :func:`weights_for`)."""
    return {s: float(x) for (s, _), x in zip(w.shapes(), weights.tolist(), strict=True)}


def weights_for(w: Workload, table: dict[PodShape, float]) -> FloatA:
    """(M,) the weights ``table`` (:func:`by_shape`) gives ``w``'s shapes; 1 for a shape it does not know."""
    return np.array([table.get(s, 1.0) for s, _ in w.shapes()], dtype=np.float64)


__all__ = [
    "DEFAULT_SCARCITY_CAP",
    "FLEET_USABLE",
    "FLEET_USABLE_BARE",
    "STEPS_PER_DOUBLING",
    "FleetUsable",
    "by_shape",
    "fleet_scarcity",
    "scarcity_weights",
    "usable_capacity",
    "weights_for",
]
