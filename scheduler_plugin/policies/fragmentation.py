"""Fragmentation policy (FGD class): place a pod where it increases the fleet's fragmentation the least.

Definitions (Weng et al., "Beware of Fragmentation", USENIX ATC '23):

* The *target workload* M is a distribution over pod shapes m = (cpu, per-GPU thousandths, GPU count, allowed
  models) with probabilities p_m.
* A node's fragmentation for shape m, F_n(m), in thousandths of a GPU: every free GPU share of the node if m asks for
  no GPU, if m's model list excludes the node, or if m does not fit the node at all (CPU, or fewer than ``count`` GPUs
  each with at least m's share free); otherwise only the free shares of the GPUs individually too small for m.
* F_n(M) = sum_m p_m F_n(m). Placing a pod changes it by dF = F_n'(M) - F_n(M); FGD prefers the smallest dF.

Two scorers share that maths:

* ``fgd`` is the paper's scorer exactly (used as a baseline and to validate the simulator):
  ``int(100 * sigmoid(-dF / 1000))``, truncated; a shared-GPU pod tries each GPU that fits and keeps the best,
  ties to the lowest GPU index.
* ``fragmentation`` is kelvin's: the same quantised gradient (the quantisation is what makes FGD work: placements
  within a step are equal, instead of chasing noise), computed over a memory-aware F (a typical pod must also find
  its host memory; FGD checks CPU only), against a workload it learns from the requests it sees; inside the node
  it breaks ties by the raw dF, then the tightest GPU, instead of the lowest index. Two additions look past FGD's
  one-pod horizon:

  - **packing plan** (``packingPlan``, :mod:`.packing`): shared pods are ranked first by how far their placement
    strays from the optimal fractional packing of the workload's shares (the reduced cost of the arc-flow LP), so a
    0.32 share does not take the gap a 0.47 share would fill to 0.94;
  - **CPU stranding** (``strandingWeight``): dF is increased by the GPU a node can no longer feed with its free CPU at
    the workload's CPU-per-GPU ratio (:func:`stranded`; an increase only, never a credit: :func:`stranding_penalty`).
    FGD sees CPU only as a cliff, once a node's CPU is below a shape's request; by then the node's remaining GPUs are
    lost. The term fades out, for every pod, when the fleet as a whole lacks the CPU to feed its free GPUs
    (:func:`cpu_surplus_factor`): then every node strands and steering pods only moves the loss. (Kept on for CPU-only
    pods, it spread them over the CPU-rich nodes until every node was just short of CPU, where the lumpy GPU pods no
    longer fit: 0.8 point more GPUs unallocated with 2.5 times the trace's CPU-only demand.)

Everything is vectorised over candidate (node, GPU) placements: one call scores 5,000 nodes x 8 GPUs.

The target workload comes from ``ctx.extras[WORKLOAD_KEY]`` when the caller supplies one (the simulator computes it
from the trace); otherwise from the plugin's :class:`WorkloadEstimator`, a decayed histogram of the pods that
arrived, seeded with a default mix until enough pods have been seen. Scoring, picking and explaining only read the
estimator; it learns in one explicit step, :func:`learn` (called by ``Framework.observe``, once per arriving pod).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from pydantic import Field

from ..model import GIB, MILLI_PER_GPU, FleetArrays, GpuRequest
from ..model.claim import charge_milli
from ..model.gpu_models import matches_any
from ..model.request import MAX_GPUS_PER_POD
from . import eligibility
from .base import MAX_EXTENDER_PRIORITY, BoolA, CycleContext, FloatA, IntA
from .config import CamelModel
from .eligibility import cycle_demand, cycle_eligible
from .normalize import minmax
from .packing import DEFAULT_REPLAN_DRIFT, PlanCache

I32A = npt.NDArray[np.int32]

WORKLOAD_KEY = "fragmentation.workload"
"""``CycleContext.extras`` key of a :class:`Workload` that overrides the learned one."""

DEFAULT_COVERAGE = 0.95
DEFAULT_HALF_LIFE_PODS = 2000.0
DEFAULT_PRIOR_WEIGHT = 200.0
DEFAULT_LEVELS = 100
DEFAULT_MAX_SHAPES = 512
DEFAULT_REFERENCE_GPU_MEMORY = 80 * GIB
DEFAULT_STRANDING_WEIGHT = 4.0
_SEEN_KEYS = 20_000


class PodShape(NamedTuple):
    cpu_milli: int
    milli: int
    """Per-GPU thousandths (0 for a pod without GPUs)."""
    gpus: int
    models: frozenset[str] | None


def shape_of(req: GpuRequest, reference_gpu_memory: int = DEFAULT_REFERENCE_GPU_MEMORY) -> PodShape:
    """The workload shape of a request. A memory-pool share is converted to thousandths of a reference GPU."""
    if not req.wants_gpu:
        return PodShape(req.cpu_milli, 0, 0, None)
    if req.shared:
        milli = charge_milli(req.milli, req.memory_bytes, max(reference_gpu_memory, 1))
        return PodShape(req.cpu_milli, min(milli, MILLI_PER_GPU), 1, req.models)
    return PodShape(req.cpu_milli, MILLI_PER_GPU, req.count, req.models)


@dataclass(frozen=True, slots=True)
class Workload:
    """The target workload M: pod shapes and their probabilities (arrays of length M)."""

    cpu_milli: IntA
    milli: IntA
    count: IntA
    models: tuple[frozenset[str] | None, ...]
    prob: FloatA
    host_memory: IntA | None = None
    """(M,) mean host memory (bytes) of each shape's pods; used by memory-aware scoring (zeros when unknown)."""
    shares: tuple[IntA, FloatA] | None = None
    """(per-GPU thousandths, weights) of *every* one-GPU share seen, before the coverage cut: the packing plan needs
    the rare small shares too (they are what fills the gaps the common ones leave). ``None``: use the kept shapes."""
    thresholds: IntA = field(init=False, repr=False, compare=False)
    """Distinct per-GPU shares of the GPU shapes (ascending)."""
    tix: IntA = field(init=False, repr=False, compare=False)
    """(M,) index of each shape's share in ``thresholds`` (0 for CPU-only shapes)."""
    gpu_shapes: BoolA = field(init=False, repr=False, compare=False)
    by_threshold: FloatA = field(init=False, repr=False, compare=False)
    """(M, T) p_m in column ``tix[m]`` for GPU shapes: sums the probabilities of the shapes sharing a threshold."""
    unrestricted: bool = field(init=False, repr=False, compare=False)
    """No shape restricts GPU models (every node is accessible to every shape)."""
    _access: dict[tuple[str, ...], BoolA] = field(init=False, repr=False, compare=False)
    _node_access: list[tuple[tuple[str, ...], npt.NDArray[np.int32], BoolA]] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        if self.host_memory is None:
            object.__setattr__(self, "host_memory", np.zeros(len(self.prob), dtype=np.int64))
        gpu = self.count > 0
        fill = self.milli[gpu][0] if gpu.any() else 1
        th, tix = np.unique(np.where(gpu, self.milli, fill), return_inverse=True)
        object.__setattr__(self, "thresholds", th.astype(np.int32))
        object.__setattr__(self, "tix", tix.astype(np.int64))
        object.__setattr__(self, "gpu_shapes", gpu)
        by_t = np.zeros((len(self.prob), len(th)), dtype=np.float64)
        by_t[np.flatnonzero(gpu), tix[gpu]] = self.prob[gpu]
        object.__setattr__(self, "by_threshold", by_t)
        object.__setattr__(self, "_access", {})
        object.__setattr__(self, "unrestricted", all(m is None for m in self.models))
        object.__setattr__(self, "_node_access", [])

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[PodShape, float],
        coverage: float = DEFAULT_COVERAGE,
        host_memory: Mapping[PodShape, float] | None = None,
    ) -> Workload:
        """Keep the most frequent shapes until they cover ``coverage`` of the weight; renormalise.

        ``host_memory`` gives each shape's mean host memory in bytes (memory is not part of the shape key)."""
        items = sorted(((w, s) for s, w in counts.items() if w > 0), key=lambda x: (-x[0], x[1][:3]))
        if not items:
            raise ValueError("a workload needs at least one pod shape with positive weight")
        total = sum(w for w, _ in items)
        kept: list[tuple[float, PodShape]] = []
        acc = 0.0
        for w, s in items:
            kept.append((w, s))
            acc += w
            if acc >= coverage * total - 1e-9:
                break
        ws = np.array([w for w, _ in kept], dtype=np.float64)
        shared = [(s.milli, w) for w, s in items if s.gpus == 1 and 0 < s.milli < MILLI_PER_GPU]
        return cls(
            cpu_milli=np.array([s.cpu_milli for _, s in kept], dtype=np.int64),
            milli=np.array([s.milli for _, s in kept], dtype=np.int64),
            count=np.array([s.gpus for _, s in kept], dtype=np.int64),
            models=tuple(s.models for _, s in kept),
            prob=ws / ws.sum(),
            host_memory=np.array([int((host_memory or {}).get(s, 0)) for _, s in kept], dtype=np.int64),
            shares=(
                np.array([m for m, _ in shared], dtype=np.int64),
                np.array([w for _, w in shared], dtype=np.float64),
            ),
        )

    @classmethod
    def from_requests(
        cls,
        reqs: Iterable[GpuRequest],
        coverage: float = DEFAULT_COVERAGE,
        reference_gpu_memory: int = DEFAULT_REFERENCE_GPU_MEMORY,
    ) -> Workload:
        counts: Counter[PodShape] = Counter()
        mem: dict[PodShape, float] = {}
        for r in map(bounded_request, reqs):
            s = shape_of(r, reference_gpu_memory)
            counts[s] += 1
            mem[s] = mem.get(s, 0.0) + r.host_memory_bytes
        return cls.from_counts(counts, coverage, {s: mem[s] / counts[s] for s in counts})

    def __len__(self) -> int:
        return len(self.prob)

    @property
    def cpu_per_milli(self) -> float:
        """Millicores the GPU shapes ask for per thousandth of GPU, weighted by frequency (0 without GPU shapes)."""
        g = self.gpu_shapes
        gpu = float((self.prob[g] * self.milli[g] * self.count[g]).sum())
        return float((self.prob[g] * self.cpu_milli[g]).sum()) / gpu if gpu > 0 else 0.0

    def access_table(self, models: tuple[str, ...]) -> BoolA:
        """(len(models) + 1, M): shape m admits GPU model i; the last row (nodes without GPUs) admits everything.
        Cached per model list (fleets keep theirs)."""
        hit = self._access.get(models)
        if hit is None:
            table = np.ones((len(models) + 1, len(self)), dtype=np.bool_)
            for j, allowed in enumerate(self.models):
                if allowed:
                    table[: len(models), j] = [matches_any(allowed, m) for m in models]
            hit = self._access[models] = table
        return hit

    def node_access(self, fleet: FleetArrays) -> BoolA:
        """(N, M) :meth:`access_table` per node of ``fleet`` (by its first GPU's model). Cached for the last fleet:
        ``model_id`` is telemetry, never written in place, so its array object is the key."""
        hit = self._node_access
        if hit and hit[0][0] == fleet.models and hit[0][1] is fleet.model_id:
            return hit[0][2]
        table = self.access_table(fleet.models)
        per_node = np.asarray(table[fleet.model_id[:, 0]], dtype=np.bool_)  # model id -1 (no GPU) -> the last row
        hit[:] = [(fleet.models, fleet.model_id, per_node)]
        return per_node

    def shapes(self) -> list[tuple[PodShape, float]]:
        return [
            (PodShape(int(c), int(m), int(n), s), float(p))
            for c, m, n, s, p in zip(self.cpu_milli, self.milli, self.count, self.models, self.prob, strict=True)
        ]


#: Used until the estimator has seen pods: a broad mix of CPU-only pods, GPU shares, and 1 to 8 whole GPUs.
DEFAULT_SHAPES: dict[PodShape, float] = {
    PodShape(4000, 0, 0, None): 0.10,
    PodShape(4000, 250, 1, None): 0.10,
    PodShape(6000, 500, 1, None): 0.15,
    PodShape(8000, 1000, 1, None): 0.40,
    PodShape(16000, 1000, 2, None): 0.10,
    PodShape(32000, 1000, 4, None): 0.08,
    PodShape(64000, 1000, 8, None): 0.07,
}


#: What one observed pod may add to the learned workload: its CPU (millicores) and host memory (bytes) are clamped
#: to these, its GPU count to ``MAX_GPUS_PER_POD``. The workload is shared by every later request, so a pod that asks
#: for more than any node has (and more than int64 can add up) must not be able to store a value that breaks the
#: scoring of others; clamped, it still counts as "does not fit anywhere", which is what it is. Both bounds are far
#: above any node (2**40 millicores is a billion cores, 2**53 bytes 8 PiB) and exact in float64.
MAX_SHAPE_CPU_MILLI = 2**40
MAX_SHAPE_HOST_MEMORY = 2**53


def bounded_request(req: GpuRequest) -> GpuRequest:
    """``req`` with its CPU, host memory and GPU count clamped into the ranges the learned workload can hold."""
    cpu = min(max(req.cpu_milli, 0), MAX_SHAPE_CPU_MILLI)
    mem = min(max(req.host_memory_bytes, 0), MAX_SHAPE_HOST_MEMORY)
    count = min(max(req.count, 0), MAX_GPUS_PER_POD)
    if (cpu, mem, count) == (req.cpu_milli, req.host_memory_bytes, req.count):
        return req
    return replace(req, cpu_milli=cpu, host_memory_bytes=mem, count=count)


class WorkloadEstimator:
    """A decayed histogram of observed pod shapes (half-life in pods), seeded with a prior.

    Each pod is counted once (by ``pod_uid`` or ``pod_key``) even when the scheduler retries it. What it is fed is
    clamped first (:func:`bounded_request`): no request can store a value that later breaks scoring for others.
    """

    def __init__(
        self,
        *,
        half_life_pods: float = DEFAULT_HALF_LIFE_PODS,
        prior: Mapping[PodShape, float] | None = None,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        coverage: float = DEFAULT_COVERAGE,
        max_shapes: int = DEFAULT_MAX_SHAPES,
        reference_gpu_memory: int = DEFAULT_REFERENCE_GPU_MEMORY,
    ) -> None:
        self._growth = 2.0 ** (1.0 / half_life_pods)
        self._inc = 1.0
        self._coverage = coverage
        self._max_shapes = max_shapes
        self._ref_mem = reference_gpu_memory
        base = prior if prior is not None else DEFAULT_SHAPES
        total = sum(base.values()) or 1.0
        self._weights: dict[PodShape, float] = {s: prior_weight * w / total for s, w in base.items()}
        self._memory: dict[PodShape, float] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._cached: Workload | None = None
        self.observed = 0

    def observe(self, req: GpuRequest) -> None:
        key = req.pod_uid or req.pod_key
        if key:
            if key in self._seen:
                self._seen.move_to_end(key)
                return
            self._seen[key] = None
            if len(self._seen) > _SEEN_KEYS:
                self._seen.popitem(last=False)
        req = bounded_request(req)
        # Instead of decaying every weight, new observations weigh exponentially more; rescale before overflow.
        self._inc *= self._growth
        s = shape_of(req, self._ref_mem)
        self._weights[s] = self._weights.get(s, 0.0) + self._inc
        self._memory[s] = self._memory.get(s, 0.0) + self._inc * req.host_memory_bytes
        if self._inc > 1e12:
            self._weights = {k: v / self._inc for k, v in self._weights.items()}
            self._memory = {k: v / self._inc for k, v in self._memory.items()}
            self._inc = 1.0
        if len(self._weights) > self._max_shapes:
            floor = sorted(self._weights.values())[-self._max_shapes]
            self._weights = {k: v for k, v in self._weights.items() if v >= floor}
            self._memory = {k: v for k, v in self._memory.items() if k in self._weights}
        self.observed += 1
        self._cached = None

    def workload(self) -> Workload:
        if self._cached is None:
            mem = {k: v / self._weights[k] for k, v in self._memory.items() if self._weights.get(k, 0) > 0}
            self._cached = Workload.from_counts(self._weights, self._coverage, mem)
        return self._cached


# --------------------------------------------------------------------------------------------------------------- #
# Vectorised maths


def eligible_gpus(
    req: GpuRequest, fleet: FleetArrays, rows: IntA, ctx: CycleContext | None = None
) -> tuple[BoolA, IntA]:
    """(eligible GPU slots, per-slot demand in thousandths) of ``req`` on ``rows``.

    Eligibility is the fit filter's own per-GPU test (model, size, thermal limits, free share and memory), shared
    through the cycle's cache when a context is given.
    """
    rows = np.asarray(rows, dtype=np.int64)
    if ctx is None:
        return eligibility.eligible_gpus(req, fleet, rows), req.demand_milli(fleet.mem_total[rows]).astype(np.int64)
    ok = cycle_eligible(req, fleet, rows, ctx)
    return ok, cycle_demand(req, fleet, rows, ctx).astype(np.int64)


def _accessible(w: Workload, fleet: FleetArrays, rows: IntA) -> BoolA | None:
    """(len(rows), M) shape m may run on the node at all (its model list admits the node's GPU model); ``None``
    when every shape admits every model."""
    if w.unrestricted:
        return None
    return w.node_access(fleet)[rows]


@dataclass(frozen=True, slots=True)
class _Stats:
    """Per row and threshold t of the workload: GPUs with at least t free (cnt) and their free share (big)."""

    total: IntA  # (P,)
    cnt: IntA  # (P, T)
    big: FloatA  # (P, T)


def _stats(free: I32A, w: Workload) -> _Stats:
    # Bucket every GPU by how many thresholds its free share reaches; prefix sums per row: O(P * (G + T)).
    total = free.sum(axis=1, dtype=np.int64)
    p, g = free.shape
    t = len(w.thresholds)
    b = np.searchsorted(w.thresholds, free, side="right")  # free >= thresholds[k]  <=>  k < b
    flat = (np.arange(p)[:, None] * (t + 1) + b).ravel()
    hist = np.bincount(flat, minlength=p * (t + 1)).reshape(p, t + 1)
    amount = np.bincount(flat, weights=free.ravel(), minlength=p * (t + 1)).reshape(p, t + 1)
    cnt = g - np.cumsum(hist, axis=1)[:, :t]
    big = total[:, None] - np.cumsum(amount, axis=1)[:, :t]
    return _Stats(total, cnt, big)


class _FleetStats:
    """:func:`_stats` of a whole fleet's ``free_milli``, kept while the content is the same.

    Keyed by content, not by array object: the simulator writes ``free_milli`` in place, and a snapshot (or the
    ledger's overlay) keeps the same content for many cycles. Checking 40,000 slots costs a few microseconds;
    recounting them costs a millisecond. The stats of every row are computed independently of the other rows
    (integer counts and sums), so indexing them gives exactly what :func:`_stats` gives for those rows.
    """

    __slots__ = ("_free", "_stats", "_thresholds")

    def __init__(self) -> None:
        self._free: I32A | None = None
        self._thresholds: IntA | None = None
        self._stats: _Stats | None = None

    def rows(self, fleet: FleetArrays, rows: IntA, w: Workload) -> _Stats:
        free, th, st = self._free, self._thresholds, self._stats
        if (
            st is None
            or free is None
            or th is None
            or not np.array_equal(th, w.thresholds)
            or free.shape != fleet.free_milli.shape
            or not np.array_equal(free, fleet.free_milli)
        ):
            free = fleet.free_milli.copy()
            st = _stats(free, w)
            self._free, self._thresholds, self._stats = free, w.thresholds, st
        return _Stats(st.total[rows], st.cnt[rows], st.big[rows])


_FLEET_STATS = _FleetStats()


def _changed(st: _Stats, pos: IntA, old: IntA, new: IntA, w: Workload) -> _Stats:
    """The stats of rows ``pos`` after one GPU of each went from ``old`` to ``new`` thousandths free."""
    th = w.thresholds[None, :]
    ge_old = old[:, None] >= th
    ge_new = new[:, None] >= th
    cnt = st.cnt[pos] - ge_old + ge_new
    big = st.big[pos] - old[:, None] * ge_old + new[:, None] * ge_new
    return _Stats(st.total[pos] - (old - new), cnt, big)


def _frag(st: _Stats, cpu: IntA, acc: BoolA | None, w: Workload, mem: IntA | None) -> FloatA:
    ok = cpu[:, None] >= w.cpu_milli[None, :]
    ok &= st.cnt[:, w.tix] >= w.count[None, :]
    ok &= w.gpu_shapes[None, :]
    if acc is not None:
        ok &= acc
    if mem is not None and w.host_memory is not None:
        ok &= mem[:, None] >= w.host_memory[None, :]
    # F = sum_m p_m (total - [m fits] * big_t(m)), grouped by threshold.
    usable = (ok.astype(np.float64) @ w.by_threshold) * st.big
    return np.asarray(st.total * float(w.prob.sum()) - usable.sum(axis=1), dtype=np.float64)


def node_fragmentation(free: I32A, cpu: IntA, acc: BoolA | None, w: Workload, mem: IntA | None = None) -> FloatA:
    """F_n(M) for each row of ``free`` ((P, G) thousandths free per GPU slot, 0 for padding) and ``cpu`` ((P,)).

    With ``mem`` (host memory free per row, bytes) a shape also needs its mean host memory to fit (kelvin's
    extension; the paper checks CPU only)."""
    if not w.gpu_shapes.any():
        return np.asarray(free.sum(axis=1, dtype=np.int64) * float(w.prob.sum()), dtype=np.float64)
    return _frag(_stats(free, w), cpu, acc, w, mem)


@dataclass(frozen=True, slots=True)
class Placements:
    """Candidate placements of one request: ``pos`` indexes the candidate rows, ``taken`` the GPU slots used."""

    pos: IntA
    """(P,) position in the candidate rows (sorted ascending)."""
    taken: BoolA
    """(P, G) the GPU slots each placement takes (none for a CPU-only pod)."""
    delta: FloatA
    """(P,) F_n'(M) - F_n(M), thousandths of a GPU."""
    gpu_left: IntA
    """(P,) thousandths of GPU left free on the node after the placement."""
    slot_left: IntA
    """(P,) thousandths left on the GPU chosen (shared pods; 0 otherwise)."""
    cpu_left: IntA
    """(P,) millicores left on the node after the placement."""
    slot_free: IntA | None = None
    """(P,) thousandths free on the GPU chosen before the placement (shared pods; ``None`` otherwise)."""
    used: IntA | None = None
    """(P,) thousandths of GPU the placement takes (``None``: none, a CPU-only pod)."""

    def slots(self, i: int) -> IntA:
        return np.flatnonzero(self.taken[i])


def _first_of_kind(key: IntA, elig: BoolA) -> BoolA:
    """(P, G) eligible slots whose ``key`` (>= 0) no lower eligible slot of the row has. Compares the G (G - 1) / 2
    pairs of columns one (P,) vector at a time instead of building a (P, G, G) cube."""
    g = key.shape[1]
    cols = np.where(elig, key, -1 - np.arange(g, dtype=np.int64)).T.copy()  # an ineligible slot: a key of its own
    first = elig.T.copy()
    seen = np.empty(cols.shape[1], dtype=np.bool_)
    for j in range(1, g):
        np.equal(cols[0], cols[j], out=seen)
        for i in range(1, j):
            seen |= cols[i] == cols[j]
        first[j] &= ~seen
    return np.ascontiguousarray(first.T)


def placements(
    req: GpuRequest,
    fleet: FleetArrays,
    rows: IntA,
    w: Workload,
    ctx: CycleContext | None = None,
    *,
    memory_aware: bool = False,
) -> Placements:
    """Every distinct way of placing ``req`` on each of ``rows`` and its change in fragmentation.

    Shared pods: one placement per GPU that fits, GPUs with the same free share on a node counted once (the lowest
    slot). Whole-GPU pods: the first ``count`` eligible GPUs (all eligible GPUs are fully free, so which ones does not
    change the fragmentation). CPU-only pods: one placement per node.
    """
    rows = np.asarray(rows, dtype=np.int64)
    k = len(rows)
    free = fleet.free_milli[rows]
    cpu = fleet.cpu_free[rows]
    acc = _accessible(w, fleet, rows)
    mem = fleet.mem_free_host[rows] if memory_aware else None
    new_mem = mem - req.host_memory_bytes if mem is not None else None
    total_before = free.sum(axis=1, dtype=np.int64)
    if w.gpu_shapes.any():
        # Many candidates: the whole fleet's stats, computed once while its free capacity is unchanged.
        st_before = _FLEET_STATS.rows(fleet, rows, w) if k * 4 >= fleet.n_nodes else _stats(free, w)
        before = _frag(st_before, cpu, acc, w, mem)
    else:
        before = total_before * float(w.prob.sum())
    new_cpu_all = cpu - req.cpu_milli
    if not req.wants_gpu:
        after = node_fragmentation(free, new_cpu_all, acc, w, new_mem)
        return Placements(
            np.arange(k),
            np.zeros(free.shape, dtype=np.bool_),
            after - before,
            free.sum(axis=1, dtype=np.int64),
            np.zeros(k, dtype=np.int64),
            new_cpu_all,
        )
    elig, demand = eligible_gpus(req, fleet, rows, ctx)
    if req.shared:
        g = free.shape[1]
        pos, col = np.nonzero(_first_of_kind(free.astype(np.int64) * 4096 + demand, elig))
        p = len(pos)
        d = demand[pos, col]
        old = free[pos, col].astype(np.int64)
        if w.gpu_shapes.any():  # one GPU changes: update the per-threshold stats instead of recounting the node
            st_after = _changed(st_before, pos, old, old - d, w)
            after = _frag(st_after, new_cpu_all[pos], _at(acc, pos), w, _at(new_mem, pos))
        else:
            after = (total_before[pos] - d) * float(w.prob.sum())
        taken = np.zeros((p, g), dtype=np.bool_)
        taken[np.arange(p), col] = True
        return Placements(pos, taken, after - before[pos], total_before[pos] - d, old - d, new_cpu_all[pos], old, d)
    if req.count == 1:  # the first eligible GPU of each node that has one (the common pod: no cumulative count)
        pos = np.flatnonzero(elig.any(axis=1))
        take = np.zeros((len(pos), elig.shape[1]), dtype=np.bool_)
        take[np.arange(len(pos)), elig[pos].argmax(axis=1)] = True
    else:
        take = elig & (np.cumsum(elig, axis=1) <= req.count)
        pos = np.nonzero(take.sum(axis=1) == req.count)[0]
        take = take[pos]
    # A whole GPU's demand is a full GPU on every slot (``demand_milli``), so the pod uses ``count`` of them.
    used = np.full(len(pos), req.count * MILLI_PER_GPU, dtype=np.int64)
    if w.gpu_shapes.any():
        # Whole GPUs go from fully free (>= every threshold) to empty: every count and share drops alike.
        c = req.count
        st_after = _Stats(st_before.total[pos] - used, st_before.cnt[pos] - c, st_before.big[pos] - used[:, None])
        after = _frag(st_after, new_cpu_all[pos], _at(acc, pos), w, _at(new_mem, pos))
    else:
        after = (total_before[pos] - used) * float(w.prob.sum())
    return Placements(
        pos,
        take,
        after - before[pos],
        total_before[pos] - used,
        np.zeros(len(pos), dtype=np.int64),
        new_cpu_all[pos],
        used=used,
    )


def stranded(gpu_free: IntA, cpu_free: IntA, cpu_per_milli: float) -> FloatA:
    """Thousandths of GPU a node's free CPU cannot feed at the workload's CPU-per-GPU ratio: free GPU that typical
    pods will not be able to use because the CPU they also need runs out first."""
    if cpu_per_milli <= 0:
        return np.zeros(np.shape(gpu_free))
    return np.asarray(np.maximum(0.0, gpu_free - np.maximum(cpu_free, 0) / cpu_per_milli), dtype=np.float64)


def stranding_change(req: GpuRequest, pl: Placements, w: Workload) -> FloatA:
    """Per placement: how much more GPU its node strands for lack of CPU (:func:`stranded`) afterwards than before.

    FGD sees CPU only as a cliff (a node's GPUs count as fragmented for a shape once its CPU is below that shape's
    request). Nodes whose CPU-to-GPU ratio is below the workload's reach that cliff long before their GPUs are full;
    this term steers CPU-hungry pods to CPU-rich nodes before then, and CPU-light ones to CPU-poor nodes."""
    ratio = w.cpu_per_milli
    used = pl.used if pl.used is not None else np.zeros(len(pl.pos), dtype=np.int64)
    before = stranded(pl.gpu_left + used, pl.cpu_left + req.cpu_milli, ratio)
    return np.asarray(stranded(pl.gpu_left, pl.cpu_left, ratio) - before, dtype=np.float64)


def stranding_penalty(req: GpuRequest, pl: Placements, w: Workload) -> FloatA:
    """Per placement: the GPU it strands (:func:`stranding_change`), never a credit for the GPU it uses up.

    A placement that fills GPUs a CPU-poor node could not have fed lowers the stranded count, but what using those
    GPUs is worth is already in dF (FGD's measure counts the shapes that still fit there, multi-GPU ones included).
    Credited on top, at four times dF's scale, it outbid dF: a CPU-light 1-GPU pod broke an empty CPU-poor 8-GPU
    node that the workload's 8-GPU pods needed (half the GPU pods multi-GPU, 1/4-scale trace, seed 42: 9.54 % of
    GPUs unallocated, fgd 8.51; penalty only 8.00; default trace 3.92 -> 3.86)."""
    return np.maximum(stranding_change(req, pl, w), 0.0)


def cpu_surplus_factor(fleet: FleetArrays, w: Workload, full_at: float) -> float:
    """0..1: how much of the stranding term a pod gets. The fleet's free CPU on GPU nodes against what its free GPU
    needs at the workload's ratio: no surplus (the CPU cannot feed the GPUs anyway, so every node strands and steering
    GPU pods between nodes only moves the loss) gives 0, a surplus of ``full_at`` (0.5: 50 % more CPU than needed)
    or more gives 1."""
    need = w.cpu_per_milli * float(fleet.free_milli[fleet.gpu_present].sum())
    if need <= 0:
        return 1.0
    gpu_nodes = fleet.gpu_present.any(axis=1)
    have = float(np.maximum(fleet.cpu_free[gpu_nodes], 0).sum())
    return float(np.clip((have / need - 1.0) / full_at, 0.0, 1.0)) if full_at > 0 else float(have >= need)


def _at(a: npt.NDArray[Any] | None, pos: IntA) -> npt.NDArray[Any] | None:
    return None if a is None else a[pos]


def _segments(pos: IntA) -> tuple[IntA, IntA]:
    """(distinct positions, start offset of each) for a sorted ``pos``."""
    if len(pos) == 0:
        return pos, pos
    starts = np.flatnonzero(np.r_[True, pos[1:] != pos[:-1]])
    return pos[starts], starts


def best_per_row(values: FloatA, pos: IntA, k: int) -> tuple[FloatA, IntA]:
    """Per candidate row: the highest value among its placements (-inf if none) and the index of the first
    placement reaching it."""
    best = np.full(k, -np.inf)
    which = np.full(k, -1, dtype=np.int64)
    if len(pos) == 0:
        return best, which
    uniq, starts = _segments(pos)
    mx = np.maximum.reduceat(values, starts)
    best[uniq] = mx
    at_max = values >= mx[np.searchsorted(uniq, pos)]
    order = np.where(at_max, np.arange(len(pos)), len(pos))
    which[uniq] = np.minimum.reduceat(order, starts)
    return best, which


def quantised(delta: FloatA, levels: int = DEFAULT_LEVELS) -> FloatA:
    """int(levels * sigmoid(-dF / 1000)), truncated: the FGD paper's score of a placement when ``levels`` is 100."""
    return np.floor(levels / (1.0 + np.exp(np.clip(delta, -50_000, 50_000) / 1000.0)))


def fgd_value(delta: FloatA) -> FloatA:
    """The FGD paper's score of a placement: int(100 * sigmoid(-dF / 1000))."""
    return quantised(delta, 100)


# --------------------------------------------------------------------------------------------------------------- #
# Plugins


class FragmentationArgs(CamelModel):
    """Arguments of the ``fragmentation`` (kelvin) and ``fgd`` (paper) policies."""

    levels: int = Field(DEFAULT_LEVELS, ge=2, le=100_000, description="steps of the quantised score (FGD: 100)")
    memory_aware: bool = Field(True, description="typical pods must also fit the node's free host memory")
    half_life_pods: float = Field(DEFAULT_HALF_LIFE_PODS, gt=0, description="decay of the learned workload, in pods")
    prior_weight: float = Field(DEFAULT_PRIOR_WEIGHT, ge=0, description="pseudo-pods of the default workload")
    coverage: float = Field(DEFAULT_COVERAGE, gt=0, le=1, description="share of pods the workload's shapes cover")
    reference_gpu_memory_gib: float = Field(80, gt=0, description="GPU size for converting memory pools to shares")
    packing_plan: bool = Field(
        True, description="shared pods: prefer placements of the workload's optimal packing (kelvin only, not fgd)"
    )
    stranding_weight: float = Field(
        DEFAULT_STRANDING_WEIGHT,
        ge=0,
        le=1000,
        description="weight of the GPU a node strands for lack of CPU, added to dF (kelvin only; 0 = FGD's measure)",
    )
    stranding_full_surplus: float = Field(
        0.5,
        ge=0,
        le=10,
        description="pods get the full stranding weight once free CPU exceeds what free GPUs need by this share",
    )
    replan_drift: float = Field(
        DEFAULT_REPLAN_DRIFT, gt=0, le=2, description="re-solve the packing plan when the share mix moved this far (L1)"
    )

    def workload_settings(self) -> tuple[float, float, float, float]:
        """The arguments that decide what the workload estimator learns."""
        return (self.half_life_pods, self.prior_weight, self.coverage, self.reference_gpu_memory_gib)


@dataclass(slots=True)
class _Base:
    args: FragmentationArgs
    estimator: WorkloadEstimator
    name: str = "fragmentation"
    plans: PlanCache = field(default_factory=PlanCache)

    @classmethod
    def create(cls, args: FragmentationArgs) -> Any:
        est = WorkloadEstimator(
            half_life_pods=args.half_life_pods,
            prior_weight=args.prior_weight,
            coverage=args.coverage,
            reference_gpu_memory=int(args.reference_gpu_memory_gib * GIB),
        )
        return cls(args, est, plans=PlanCache(args.replan_drift))

    @property
    def memory_aware(self) -> bool:
        return self.args.memory_aware

    def workload(self, ctx: CycleContext) -> Workload:
        """The cycle's target workload: the caller's (``ctx.extras[WORKLOAD_KEY]``), else the one learned so far.
        Only reads the estimator (it learns in :func:`learn`)."""
        given = ctx.extras.get(WORKLOAD_KEY)
        if isinstance(given, Workload):
            return given
        w = self.estimator.workload()
        ctx.extras[WORKLOAD_KEY] = w
        return w

    def _values(
        self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, for_pick: bool = False
    ) -> FloatA:
        raise NotImplementedError

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        w = self.workload(ctx)
        pl = placements(req, fleet, idx, w, ctx, memory_aware=self.memory_aware)
        best, _ = best_per_row(self._values(req, fleet, pl, w), pl.pos, len(idx))
        return best

    def normalize(self, raw: FloatA) -> FloatA:
        return minmax(raw)

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        w = self.workload(ctx)
        rows = np.array([row], dtype=np.int64)
        pl = placements(req, fleet, rows, w, ctx, memory_aware=self.memory_aware)
        _, which = best_per_row(self._values(req, fleet, pl, w, True), pl.pos, 1)
        if which[0] < 0:
            return None
        return tuple(int(fleet.gpu_index[row, c]) for c in pl.slots(int(which[0])))

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        w = self.workload(ctx)
        rows = np.array([row], dtype=np.int64)
        acc = _accessible(w, fleet, rows)
        mem = fleet.mem_free_host[rows] if self.memory_aware else None
        before = float(node_fragmentation(fleet.free_milli[rows], fleet.cpu_free[rows], acc, w, mem)[0])
        pl = placements(req, fleet, rows, w, ctx, memory_aware=self.memory_aware)
        lines = [f"fragmentation now {before / MILLI_PER_GPU:.2f} GPU (against {len(w)} typical pod shapes)"]
        if len(pl.pos) == 0:
            return [*lines, "the pod does not fit on any GPU of this node"]
        _, which = best_per_row(self._values(req, fleet, pl, w, True), pl.pos, 1)
        i = int(which[0])
        gpus = ", ".join(str(int(fleet.gpu_index[row, c])) for c in pl.slots(i)) or "none"
        lines.append(f"best placement (GPU {gpus}) changes it by {pl.delta[i] / MILLI_PER_GPU:+.3f} GPU")
        return [*lines, *self._explain_extras(req, fleet, pl, w, i)]

    def _explain_extras(self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, i: int) -> list[str]:
        return []


FragmentationBase = _Base
"""The common base of the fragmentation plugins (for callers that share their workload estimator)."""


def learn(plugins: Iterable[object], req: GpuRequest) -> None:
    """Count one arriving pod in the workload estimators of ``plugins`` (each distinct estimator once; plugins
    without one are skipped). The one place the learned workload changes: scoring only reads it."""
    seen: set[int] = set()
    for p in plugins:
        if isinstance(p, _Base) and id(p.estimator) not in seen:
            seen.add(id(p.estimator))
            p.estimator.observe(req)


class FragmentationPolicy(_Base):
    """kelvin's fragmentation score: FGD's quantised gradient over a memory-aware F; in-node ties to the tightest fit.

    Nodes are ranked by the quantised score alone (``levels`` steps of sigmoid(-dF/1000)): placements whose dF
    differ by less than a step are equally good, and the caller's tie-break decides. Measured on the Alibaba trace,
    ranking by the raw dF instead chases noise and strands more GPUs. Inside the chosen node the GPU is picked by the
    quantised score, then the smallest raw dF, then the least share left on the GPU.

    Shared pods (``packingPlan``, on by default) are first ranked by the placement's reduced cost in the optimal
    packing of the workload's shares (:mod:`.packing`), in hundredths of a GPU: FGD's score only decides among
    placements the plan finds equally good.
    """

    def _values(
        self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, for_pick: bool = False
    ) -> FloatA:
        weight = self.args.stranding_weight * cpu_surplus_factor(fleet, w, self.args.stranding_full_surplus)
        primary = quantised(pl.delta + weight * stranding_penalty(req, pl, w), self.args.levels)
        penalty = self.plan_penalty(req, pl, w)
        if penalty is not None:
            primary = primary - (self.args.levels + 1) * penalty
        if not for_pick:
            return primary
        return np.asarray(
            primary - 1e-3 * np.tanh(pl.delta / MILLI_PER_GPU) + 1e-4 * (1.0 - pl.slot_left / MILLI_PER_GPU),
            dtype=np.float64,
        )

    def _explain_extras(self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, i: int) -> list[str]:
        out = []
        penalty = self.plan_penalty(req, pl, w)
        if penalty is not None:
            cost = float(penalty[i])
            out.append(
                "packing plan: part of the optimal packing of the workload's shares"
                if cost == 0
                else f"packing plan: {cost / 100:.2f} GPU worse than the optimal packing of the workload's shares"
            )
        change = float(stranding_change(req, pl, w)[i])
        if change and self.args.stranding_weight:
            factor = cpu_surplus_factor(fleet, w, self.args.stranding_full_surplus)
            what = "more" if change > 0 else "fewer"
            note = f"weight x{factor:.2f}" if change > 0 else "not credited: dF counts what using them is worth"
            out.append(
                f"CPU stranding: {abs(change) / MILLI_PER_GPU:.2f} {what} GPU left without CPU to feed it "
                f"(at {w.cpu_per_milli:.1f} millicores per thousandth of GPU; {note})"
            )
        return out

    def warm_plan(self) -> None:
        """Re-solve the packing plan for the learned workload off the request path (the framework calls it when a
        snapshot is published) once the share mix has moved half of ``replanDrift``."""
        if not self.args.packing_plan:
            return
        w = self.estimator.workload()
        if w.shares is not None:
            self.plans.plan(*w.shares, drift=self.args.replan_drift / 2)

    def plan_penalty(self, req: GpuRequest, pl: Placements, w: Workload) -> FloatA | None:
        """Each placement's reduced cost in the workload's packing plan (hundredths of a GPU), or ``None``."""
        if not (self.args.packing_plan and req.shared and pl.slot_free is not None and len(pl.pos)):
            return None
        if w.shares is not None:
            plan = self.plans.plan(*w.shares)
        else:
            shares = w.gpu_shapes & (w.count == 1) & (w.milli < MILLI_PER_GPU)
            plan = self.plans.plan(w.milli[shares], w.prob[shares])
        if plan is None:
            return None
        return plan.penalty(pl.slot_free, pl.slot_free - pl.slot_left)


class FgdPolicy(_Base):
    """The FGD paper's score, exactly: int(100 * sigmoid(-dF/1000)); inside the node, the first best GPU."""

    @property
    def memory_aware(self) -> bool:
        return False

    def _values(
        self, req: GpuRequest, fleet: FleetArrays, pl: Placements, w: Workload, for_pick: bool = False
    ) -> FloatA:
        return fgd_value(pl.delta)

    def normalize(self, raw: FloatA) -> FloatA:
        return np.asarray(np.clip(np.nan_to_num(raw, neginf=0.0), 0, 100) / 100 * MAX_EXTENDER_PRIORITY)


def workload_of(
    reqs: Sequence[GpuRequest],
    coverage: float = DEFAULT_COVERAGE,
    reference_gpu_memory: int = DEFAULT_REFERENCE_GPU_MEMORY,
) -> Workload:
    """The target workload of a trace (the paper's definition: shapes covering ``coverage`` of the pods); memory
    pools count as their share of a GPU of ``reference_gpu_memory`` bytes."""
    return Workload.from_requests(reqs, coverage, reference_gpu_memory)
