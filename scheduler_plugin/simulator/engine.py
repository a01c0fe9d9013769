"""Replay a trace through a policy: filter, rank and pick with the policy's framework (the extender's own), on a
mutable copy of the fleet's arrays. Pure computation; the CLI adds I/O (progress, tables, files)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from ..model import MILLI_PER_GPU, FleetArrays, GpuRequest
from ..model.claim import charge_milli
from ..policies.base import CycleContext
from ..policies.fragmentation import DEFAULT_REFERENCE_GPU_MEMORY, WORKLOAD_KEY, Workload, workload_of
from ..policies.ranking import tied_best
from .fleet import apply_placement, build_fleet, gpu_memory_bytes
from .kube_scheduler import KubeCycle, KubeScheduler
from .policies import SimPolicy, feasible, kube_fits, pick, rank
from .protocol import DEFAULT_TARGET, arrivals
from .trace import Trace, TracePod

FloatA = npt.NDArray[np.float64]
IntA = npt.NDArray[np.int64]
BoolA = npt.NDArray[np.bool_]

CHECKPOINTS = (100, 110, 120, 130)


@dataclass(slots=True)
class RunResult:
    policy: str
    seed: int
    total_gpus: int
    arrived_pct: FloatA
    """(A,) arrived GPU demand after each arrival, % of cluster GPU capacity: what the placed pods were charged on
    the GPUs they got, plus what the failed ones would take (a memory pool: its charge on the fleet's median GPU).
    So the allocation never exceeds it."""
    alloc_pct: FloatA
    """(A,) GPU allocation ratio after each arrival, % of cluster GPU capacity."""
    failed: BoolA
    """(A,) the arrival could not be placed."""
    pod_names: tuple[str, ...]
    seconds: float
    placements: int = 0
    fleet: FleetArrays | None = field(default=None, repr=False)
    """The fleet's arrays after the last arrival."""

    def alloc_at(self, pct: float) -> float:
        """Allocation ratio (%) once ``pct`` % has arrived: after the last arrival that leaves the arrived workload at
        most ``pct`` % (0 before any; the last value if arrivals stopped short of it). The pod that carries the
        arrived workload past ``pct`` counts at the next point, so the curve never exceeds the arrived workload."""
        i = int(np.searchsorted(self.arrived_pct, pct + 1e-9, side="right")) - 1
        return float(self.alloc_pct[i]) if i >= 0 else 0.0

    def curve(self, points: Sequence[int] = tuple(range(131))) -> list[float]:
        return [self.alloc_at(p) for p in points]

    def unallocated_gpus_at(self, pct: float) -> float:
        return self.total_gpus * (100.0 - self.alloc_at(pct)) / 100.0

    @property
    def first_failure(self) -> tuple[int, float, str] | None:
        """(arrival number, arrived %, pod name) of the first pod that could not be placed."""
        hits = np.flatnonzero(self.failed)
        if len(hits) == 0:
            return None
        i = int(hits[0])
        return i, float(self.arrived_pct[i]), self.pod_names[i]

    def summary(self) -> dict[str, object]:
        ff = self.first_failure
        return {
            "policy": self.policy,
            "seed": self.seed,
            "alloc_pct": {str(p): round(self.alloc_at(p), 3) for p in CHECKPOINTS},
            "unallocated_gpus_at_100": round(self.unallocated_gpus_at(100), 1),
            "unallocated_pct_at_100": round(100.0 - self.alloc_at(100), 3),
            "unallocated_gpus_at_end": round(self.total_gpus * (100.0 - float(self.alloc_pct[-1])) / 100.0, 1)
            if len(self.alloc_pct)
            else float(self.total_gpus),
            "arrivals": len(self.arrived_pct),
            "failed": int(self.failed.sum()),
            "first_failure": None if ff is None else {"arrival": ff[0], "arrived_pct": round(ff[1], 3), "pod": ff[2]},
            "seconds": round(self.seconds, 2),
        }


@dataclass(slots=True)
class Prepared:
    """What every run of one trace shares: the empty fleet, the parsed requests and the target workload."""

    trace: Trace
    fleet: FleetArrays
    requests: tuple[GpuRequest, ...]
    workload: Workload
    capacity_milli: int = field(init=False)

    def __post_init__(self) -> None:
        self.capacity_milli = int(self.fleet.gpu_present.sum()) * MILLI_PER_GPU


def _account_memory_pools(trace: Trace) -> Trace:
    """A pod that asks for a GPU memory pool takes a share that depends on the GPU it lands on (:func:`charge_milli`,
    as the extender charges it). Until it is placed it is counted as its charge on the fleet's median GPU: that is
    what sizes the target workload, and what a pod that fails adds to the arrived workload (:func:`run` counts a
    placed pod by the charge it took)."""
    pooled = [p for p in trace.pods if p.gpu_memory_bytes is not None]
    if not pooled:
        return trace
    sizes = [gpu_memory_bytes(n) for n in trace.nodes for _ in range(n.gpus)]
    if not sizes:
        return trace
    median = int(np.median(sizes))
    pods = tuple(
        replace(p, gpu_milli=min(MILLI_PER_GPU, charge_milli(share_of(p), p.gpu_memory_bytes, median)))
        if p.gpu_memory_bytes is not None
        else p
        for p in trace.pods
    )
    return Trace(trace.nodes, pods)


def share_of(pod: TracePod) -> int | None:
    """The compute share a pod's request gives besides its memory pool (``None``: the pool only)."""
    return pod.request().milli


def prepare(trace: Trace) -> Prepared:
    # the requests are the pods' own claims (charged by the real GPU's size on placement, as bind and the listing
    # charge them); the median GPU only sizes memory pools in the arrived workload and the target workload M
    reqs = tuple(p.request() for p in trace.pods)
    sizes = [gpu_memory_bytes(n) for n in trace.nodes for _ in range(n.gpus)]
    reference = int(np.median(sizes)) if sizes else DEFAULT_REFERENCE_GPU_MEMORY
    trace = _account_memory_pools(trace)
    return Prepared(trace, build_fleet(trace.nodes), reqs, workload_of(reqs, reference_gpu_memory=reference))


def choose_row(
    policy: SimPolicy, req: GpuRequest, fleet: FleetArrays, ctx: CycleContext, node_rank: IntA, cycle: KubeCycle | None
) -> int:
    """The row the pod goes to, -1 when none is feasible: the best ranked (ties by ``node_rank``), or with ``cycle``
    the one kube-scheduler binds among the nodes its filter pass sent."""
    all_rows = np.arange(fleet.n_nodes, dtype=np.int64)
    if cycle is None:
        cand = feasible(policy, req, fleet, all_rows, ctx)
        if not len(cand):
            return -1
        tied = tied_best(cand, rank(policy, req, fleet, cand, ctx))
        return int(tied[np.argmin(node_rank[tied])])
    cand = feasible(policy, req, fleet, cycle.window(kube_fits(req, fleet, all_rows, ctx)), ctx)
    if len(cand) <= 1:  # kube-scheduler binds a lone feasible node without scoring it
        return int(cand[0]) if len(cand) else -1
    ints, combined = policy.framework.prioritize(req, fleet, cand, ctx)
    return int(cand[cycle.choose(req, fleet, cand, ints, combined)])


def run(
    prep: Prepared,
    policy: SimPolicy,
    seed: int,
    *,
    target: float = DEFAULT_TARGET,
    progress: Callable[[float, float], None] | None = None,
    workload: Workload | None = None,
    learn_workload: bool = False,
    kube: KubeScheduler | None = None,
) -> RunResult:
    """Replay ``prep``'s trace through ``policy`` with the paper's protocol and ``seed``.

    Ties between equally ranked nodes go to a node order drawn at random per seed (as in the paper's simulator).
    The fragmentation policies get the trace's target workload (``workload``, default ``prep.workload``: the paper's
    M), or with ``learn_workload`` none at all: they learn it from the arriving pods (the framework's ``observe`` on
    each arrival, before it is scored, fitting or not), as the extender does at filter in a cluster (a decayed
    histogram seeded with a default mix).

    With ``kube``, kube-scheduler's side of a cluster's placement is replayed too (:mod:`.kube_scheduler`): only
    the nodes its own filter pass finds reach the policy, and the node is the highest total of the policy's integer
    scores (and kube-scheduler's resource scores when on), equal totals drawn at random.
    """
    if target <= 0:
        raise ValueError(f"target must be positive, got {target}")
    started = time.perf_counter()
    fleet = prep.fleet.copy()
    n = fleet.n_nodes
    node_rank = np.random.default_rng([seed, 1]).permutation(n)
    cap = max(prep.capacity_milli, 1)
    goal = target * prep.capacity_milli
    arrived: list[float] = []
    alloc: list[float] = []
    failed: list[bool] = []
    names: list[str] = []
    allocated = 0
    demand_so_far = 0
    placed = 0
    w = workload if workload is not None else prep.workload
    fw = policy.framework
    cycle = KubeCycle(kube, prep.fleet, seed) if kube is not None else None
    for p in arrivals(prep.trace.pods, seed):
        req = prep.requests[p]
        pod = prep.trace.pods[p]
        names.append(pod.name)
        if learn_workload:
            fw.observe(req)
        ctx = fw.context(fleet, 0.0)
        if not learn_workload:
            ctx.state.write(WORKLOAD_KEY, w)
        row = choose_row(policy, req, fleet, ctx, node_rank, cycle)
        gpus = pick(policy, req, fleet, row, ctx) if row >= 0 else None
        if gpus is None or (req.wants_gpu and len(gpus) != req.count):
            failed.append(True)
            demand_so_far += pod.gpu_demand_milli  # what it would take (a memory pool: on the median GPU)
        else:
            taken = apply_placement(fleet, req, row, gpus)
            allocated += taken
            demand_so_far += taken  # what it took: a memory pool on the GPU it landed on
            placed += 1
            failed.append(False)
        arrived.append(100.0 * demand_so_far / cap)
        alloc.append(100.0 * allocated / cap)
        if progress is not None:
            progress(arrived[-1], 100.0 * target)
        if demand_so_far >= goal:
            break
    return RunResult(
        policy=policy.name,
        seed=seed,
        total_gpus=cap // MILLI_PER_GPU,
        arrived_pct=np.asarray(arrived, dtype=np.float64),
        alloc_pct=np.asarray(alloc, dtype=np.float64),
        failed=np.asarray(failed, dtype=np.bool_),
        pod_names=tuple(names),
        seconds=time.perf_counter() - started,
        placements=placed,
        fleet=fleet,
    )
