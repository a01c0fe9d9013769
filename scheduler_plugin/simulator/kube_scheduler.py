"""kube-scheduler around the extender: which nodes it asks kelvin about and how it turns kelvin's integer scores into
the node it binds (``pkg/scheduler/schedule_one.go`` and the NodeResourcesFit / NodeResourcesBalancedAllocation
plugins of Kubernetes v1.36).

A replay ranks nodes by kelvin's weighted mean (a float). In a cluster, kube-scheduler

1. runs its own filters from a start that moves on every cycle, over the nodes in a fixed order, and stops once it
   has found ``percentageOfNodesToScore`` of the nodes feasible (0: its adaptive default, ``50 - n/125`` % and at
   least 5 %; never fewer than 100 nodes): only those reach the extender's filter and prioritize;
2. adds the extender's integer 0..10 score times its ``weight`` times 10 to its own score plugins' scores, of which
   NodeResourcesFit (LeastAllocated: the CPU and memory left free) and NodeResourcesBalancedAllocation (CPU against
   memory) differ between nodes when no pod asks for affinity or spreading;
3. binds the node with the highest total, drawing at random among equal totals.

:class:`KubeScheduler` says which of those a replay models; :class:`KubeCycle` keeps kube-scheduler's state across a
replay (the moving start, the random draws). Pure computation over the fleet's arrays. What is not modelled: its own
filter counts CPU and memory only (kelvin's filter judges the GPUs; kube-scheduler's ``nvidia.com/gpu`` count would
take nodes without a free GPU out of the window earlier), node affinity, taints, topology spreading and image
locality (equal on every node of a trace), and the parallel filter's overshoot past the count it stops at.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model import FleetArrays, GpuRequest
from ..policies.base import MAX_EXTENDER_PRIORITY, BoolA, FloatA, IntA

#: kube-scheduler's ``MaxNodeScore``
MAX_NODE_SCORE = 100
#: ``minFeasibleNodesToFind`` and ``minFeasibleNodesPercentageToFind`` of schedule_one.go
MIN_FEASIBLE_NODES = 100
MIN_FEASIBLE_PERCENTAGE = 5
#: the requests kube-scheduler's scoring counts for a container that asks none (``schedutil.DefaultMilliCPURequest``,
#: ``DefaultMemoryRequest``)
DEFAULT_CPU_MILLI = 100
DEFAULT_MEMORY_BYTES = 200 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class KubeScheduler:
    """How kube-scheduler is configured around the extender."""

    percentage_of_nodes_to_score: int = 0
    """KubeSchedulerConfiguration ``percentageOfNodesToScore``: 0 is kube-scheduler's adaptive default."""
    extender_weight: int = 5
    """The extender's ``weight`` (the chart's ``scheduler.extender.weight``)."""
    resource_scores: bool = False
    """NodeResourcesFit's and NodeResourcesBalancedAllocation's scores count (kube-scheduler's default profile); the
    chart turns them off in kelvin's profile (``scheduler.disabledScorePlugins``)."""
    rounded_only: bool = False
    """The extender sends its weighted means rounded to 0..10 and nothing more, so many nodes share the top score
    (kelvin before it sent its first node alone at 10, :mod:`scheduler_plugin.policies.choice`)."""

    def __post_init__(self) -> None:
        if not 0 <= self.percentage_of_nodes_to_score <= 100:
            raise ValueError(f"percentage_of_nodes_to_score must be 0..100, got {self.percentage_of_nodes_to_score}")
        if self.extender_weight < 1:
            raise ValueError(f"extender_weight must be positive, got {self.extender_weight}")

    def describe(self) -> str:
        pct = self.percentage_of_nodes_to_score
        return (
            f"kube-scheduler: {'the adaptive share' if pct == 0 else f'{pct} %'} of nodes scored, extender weight "
            f"{self.extender_weight}, resource scores {'on' if self.resource_scores else 'off'}, "
            f"{'rounded scores only' if self.rounded_only else 'kelvin first node alone at 10'}"
        )


def nodes_to_find(n_nodes: int, percentage: int) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering (``numFeasibleNodesToFind``)."""
    if n_nodes < MIN_FEASIBLE_NODES:
        return n_nodes
    if percentage == 0:
        percentage = max(50 - n_nodes // 125, MIN_FEASIBLE_PERCENTAGE)
    return max(n_nodes * percentage // 100, MIN_FEASIBLE_NODES)


def resource_scores(req: GpuRequest, fleet: FleetArrays, cpu_alloc: IntA, mem_alloc: IntA, rows: IntA) -> IntA:
    """NodeResourcesFit (LeastAllocated over CPU and memory, weight 1 each) plus NodeResourcesBalancedAllocation
    (the balance of CPU against memory with the pod, against the balance without it), per row: 0..200. The node's
    requested CPU and memory are its allocatable (``cpu_alloc``, ``mem_alloc``: the empty fleet's free) less its
    free."""
    cap_c, cap_m = cpu_alloc[rows], mem_alloc[rows]
    used_c = cap_c - fleet.cpu_free[rows]
    used_m = cap_m - fleet.mem_free_host[rows]
    with_c = used_c + (req.cpu_milli or DEFAULT_CPU_MILLI)
    with_m = used_m + (req.host_memory_bytes or DEFAULT_MEMORY_BYTES)
    least = (_least_requested(with_c, cap_c) + _least_requested(with_m, cap_m)) // 2
    with_pod = _balance(with_c, with_m, cap_c, cap_m)
    without = _balance(used_c, used_m, cap_c, cap_m)
    balanced = MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + with_pod - without) // 2
    return np.asarray(least + balanced, dtype=np.int64)


def _least_requested(requested: IntA, capacity: IntA) -> IntA:
    ok = (capacity > 0) & (requested <= capacity)
    score = ((capacity - requested) * MAX_NODE_SCORE) // np.maximum(capacity, 1)
    return np.asarray(np.where(ok, score, 0), dtype=np.int64)


def _balance(cpu: IntA, mem: IntA, cap_c: IntA, cap_m: IntA) -> IntA:
    fc = np.minimum(cpu / np.maximum(cap_c, 1), 1.0)
    fm = np.minimum(mem / np.maximum(cap_m, 1), 1.0)
    return np.asarray(((1.0 - np.abs(fc - fm) / 2) * MAX_NODE_SCORE).astype(np.int64))


def rounded(combined: FloatA) -> IntA:
    """The weighted means rounded half up to 0..10, as the extender sent them before :mod:`~scheduler_plugin.policies.
    choice`."""
    return np.minimum(np.maximum(np.floor(combined + 0.5), 0), MAX_EXTENDER_PRIORITY).astype(np.int64)


class KubeCycle:
    """kube-scheduler's state over one replay: the node order of its snapshot, where its next filter pass starts and
    its random draws among equal totals."""

    def __init__(self, config: KubeScheduler, fleet: FleetArrays, seed: int) -> None:
        self.config = config
        self.order = np.random.default_rng([seed, 2]).permutation(fleet.n_nodes).astype(np.int64)
        self.start = 0
        self.draw = np.random.default_rng([seed, 3])
        self.to_find = nodes_to_find(fleet.n_nodes, config.percentage_of_nodes_to_score)
        self.cpu_alloc = fleet.cpu_free.copy()
        self.mem_alloc = fleet.mem_free_host.copy()

    def window(self, fits: BoolA) -> IntA:
        """The rows kube-scheduler sends to the extender, given which rows pass its own filter (``fits``, indexed by
        row): the first :attr:`to_find` passing ones from the current start in node order. Moves the start past the
        nodes it looked at."""
        n = self.order.size
        rotated = np.roll(self.order, -self.start)
        hits = np.flatnonzero(fits[rotated])
        if hits.size > self.to_find:
            hits = hits[: self.to_find]
            looked = int(hits[-1]) + 1
        else:
            looked = n
        self.start = (self.start + looked) % n if n else 0
        return rotated[hits]

    def choose(self, req: GpuRequest, fleet: FleetArrays, rows: IntA, ints: IntA, combined: FloatA) -> int:
        """The index into ``rows`` kube-scheduler binds: the highest total of the extender's scores (``ints``, or
        :func:`rounded` ``combined`` when :attr:`KubeScheduler.rounded_only`) times weight x 10, plus its resource
        scores when on; equal totals drawn at random."""
        cfg = self.config
        ext = rounded(combined) if cfg.rounded_only else ints
        total = ext * (cfg.extender_weight * (MAX_NODE_SCORE // MAX_EXTENDER_PRIORITY))
        if cfg.resource_scores:
            total = total + resource_scores(req, fleet, self.cpu_alloc, self.mem_alloc, rows)
        best = np.flatnonzero(total == total.max())
        return int(best[self.draw.integers(best.size)]) if best.size > 1 else int(best[0])
