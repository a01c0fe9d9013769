"""The target workload of the fragmentation policies: pod shapes, their probabilities, and the estimator that learns
them from arriving pods (a histogram seeded with a default mix, which forgets its past only when a test on the counts
finds that the recent mix differs from it)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from ...model import GIB, MILLI_PER_GPU, FleetArrays, GpuRequest
from ...model.claim import charge_milli
from ...model.gpu_models import matches_any
from ...model.request import MAX_GPUS_PER_POD
from ..base import BoolA, FloatA, IntA

DEFAULT_COVERAGE = 0.95
DEFAULT_DRIFT_WINDOW_PODS = 500
DEFAULT_DRIFT_SIGNIFICANCE = 1e-3
DEFAULT_PRIOR_WEIGHT = 200.0
DEFAULT_LEVELS = 100
DEFAULT_MAX_SHAPES = 512
DEFAULT_REFERENCE_GPU_MEMORY = 80 * GIB
DEFAULT_STRANDING_WEIGHT = 4.0
DEFAULT_CONFIDENCE_Z = 2.0
_SEEN_KEYS = 20_000
_MIN_EXPECTED = 5.0
"""A cell of the drift test needs this many pods expected in the smaller sample; rarer shapes are pooled."""
_FIRST_WINDOW = 25
"""Pods of the first drift window: until ``drift_window_pods`` have been seen, each window is as long as what came
before it (25, 25, 50, 100, ...), so a default mix the first pods contradict is forgotten within them."""


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
    cpu_ratio: float | None = None
    """:attr:`cpu_per_milli` as given (a :meth:`priced` copy keeps its source's); ``None``: from the shapes."""
    cpu_only_ratio: float | None = None
    """:attr:`cpu_only_per_milli` as given (a :meth:`priced` copy keeps its source's); ``None``: from the shapes."""
    evidence: tuple[FloatA, float] | None = None
    """A learned workload's sample: ((M,) the pods observed of each shape, the pods observed in all), in pods of the
    newest pod's weight, without the default mix's pseudo-pods (an assumption, not evidence). What tells a shape seen
    twice from one seen two thousand times at the same probability (kelvin prices the first at the upper end of what
    it may be: :func:`upper_bound_factors`). ``None``: a workload given (a trace's M), priced, or learned from no pod
    yet, taken as it is."""
    thresholds: IntA = field(init=False, repr=False, compare=False)
    """Distinct per-GPU shares of the GPU shapes (ascending)."""
    share_index: IntA = field(init=False, repr=False, compare=False)
    """(M,) index of each shape's share in ``thresholds`` (0 for CPU-only shapes)."""
    gpu_shapes: BoolA = field(init=False, repr=False, compare=False)
    by_threshold: FloatA = field(init=False, repr=False, compare=False)
    """(M, T) p_m in column ``share_index[m]`` for GPU shapes: sums the probabilities of the shapes sharing a
    threshold."""
    unrestricted: bool = field(init=False, repr=False, compare=False)
    """No shape restricts GPU models (every node is accessible to every shape)."""
    cpu_per_milli: float = field(init=False, repr=False, compare=False)
    """Millicores the GPU shapes ask for per thousandth of GPU, weighted by frequency (0 without GPU shapes)."""
    cpu_only_per_milli: float = field(init=False, repr=False, compare=False)
    """Millicores the CPU-only shapes ask for per thousandth of GPU the GPU shapes ask for, weighted by frequency: the
    CPU that arrives with each thousandth of GPU demand on top of the GPU pods' own (0 without GPU shapes)."""
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
        object.__setattr__(self, "share_index", tix.astype(np.int64))
        object.__setattr__(self, "gpu_shapes", gpu)
        by_t = np.zeros((len(self.prob), len(th)), dtype=np.float64)
        by_t[np.flatnonzero(gpu), tix[gpu]] = self.prob[gpu]
        object.__setattr__(self, "by_threshold", by_t)
        object.__setattr__(self, "_access", {})
        object.__setattr__(self, "unrestricted", all(m is None for m in self.models))
        object.__setattr__(self, "_node_access", [])
        gpu_milli = float((self.prob[gpu] * self.milli[gpu] * self.count[gpu]).sum())
        cpu = float((self.prob[gpu] * self.cpu_milli[gpu]).sum()) / gpu_milli if gpu_milli > 0 else 0.0
        object.__setattr__(self, "cpu_per_milli", cpu if self.cpu_ratio is None else self.cpu_ratio)
        cpu_only = float((self.prob[~gpu] * self.cpu_milli[~gpu]).sum()) / gpu_milli if gpu_milli > 0 else 0.0
        object.__setattr__(self, "cpu_only_per_milli", cpu_only if self.cpu_only_ratio is None else self.cpu_only_ratio)

    def priced(self, weights: FloatA) -> Workload:
        """This workload with each shape's probability multiplied by ``weights`` ((M,), >= 0; not renormalised: a
        weight above 1 adds to what the shape's losses cost). The CPU-per-GPU ratio, the host memory and the shares
        the packing plan reads stay this workload's (so do the CPU ratios): pricing changes what F charges, not the mix
        that arrives."""
        if weights.shape != self.prob.shape:
            raise ValueError(f"weights: expected {len(self.prob)} values, got shape {weights.shape}")
        return Workload(
            cpu_milli=self.cpu_milli,
            milli=self.milli,
            count=self.count,
            models=self.models,
            prob=self.prob * weights,
            host_memory=self.host_memory,
            shares=self.shares if self.shares is not None else self._own_shares(),
            cpu_ratio=self.cpu_per_milli,
            cpu_only_ratio=self.cpu_only_per_milli,
        )

    def with_evidence(self, counts: FloatA, total: float) -> Workload:
        """This workload with :attr:`evidence` ``(counts, total)`` (``counts``: (M,), the pods behind each shape)."""
        if counts.shape != self.prob.shape:
            raise ValueError(f"evidence: expected {len(self.prob)} counts, got shape {counts.shape}")
        return replace(self, evidence=(np.asarray(counts, dtype=np.float64), float(total)))

    def _own_shares(self) -> tuple[IntA, FloatA]:
        one = self.gpu_shapes & (self.count == 1) & (self.milli < MILLI_PER_GPU)
        return self.milli[one], self.prob[one]

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


def upper_bound_factors(counts: FloatA, total: float, z: float) -> FloatA:
    """(len(counts),) per shape seen ``counts`` times among ``total`` pods: the upper bound of the Wilson score interval
    of its probability, ``z`` standard deviations up, over the estimate ``counts / total`` (1 where ``z`` is 0 or a
    count is 0).

    Why an upper bound: the fragmentation measure prices a shape's losses by its probability, and the two errors do
    not cost alike. Pricing a rare, lumpy shape (a CPU-hungry 8-GPU pod whose few homes live scarcity keeps) too low
    lets the common pods break its homes, and every one of its pods that later finds none fails with all its GPUs;
    pricing it too high costs the common pods a slightly worse node. Measured on the multi-GPU 30 % variant (full
    size, seed 43): the trace's M with its 8-GPU shapes' probabilities scaled by 0.85 leaves 1.80 % of GPUs
    unallocated at 100 % arrived against 1.29 % (the learned mode's 1.80: its first 1,000 pods had brought 9 of the
    16 120-core 8-GPU pods expected), scaled by 1.08 or 1.15 the same 1.29 %. The factor shrinks as the counts grow
    (about ``1 + z / sqrt(count)``): a mix learned from many pods is priced as learned."""
    n = np.asarray(counts, dtype=np.float64)
    out = np.ones(len(n), dtype=np.float64)
    if z <= 0 or total <= 0:
        return out
    seen = n > 0
    k = np.minimum(n[seen], total)
    z2 = z * z
    upper = (k + z2 / 2 + z * np.sqrt(k * (1.0 - k / total) + z2 / 4)) / (1.0 + z2 / total)
    out[seen] = np.maximum(upper / k, 1.0)
    return out


def bounded_request(req: GpuRequest) -> GpuRequest:
    """``req`` with its CPU, host memory and GPU count clamped into the ranges the learned workload can hold."""
    cpu = min(max(req.cpu_milli, 0), MAX_SHAPE_CPU_MILLI)
    mem = min(max(req.host_memory_bytes, 0), MAX_SHAPE_HOST_MEMORY)
    count = min(max(req.count, 0), MAX_GPUS_PER_POD)
    if (cpu, mem, count) == (req.cpu_milli, req.host_memory_bytes, req.count):
        return req
    return replace(req, cpu_milli=cpu, host_memory_bytes=mem, count=count)


def drift_pvalue(history: Mapping[PodShape, float], window: Mapping[PodShape, float]) -> float:
    """p-value of "``window`` (the counts of the last pods) is drawn from the same shape mix as ``history`` (the
    weights before them)": Pearson's chi-square test of homogeneity on the 2 x K table of the two samples. Shapes
    whose pooled share would put fewer than 5 pods in the smaller sample are pooled into one cell (a new shape the
    history never saw lands there too), dropped if even that cell is that small. 1.0 when there is nothing to test."""
    h_total = sum(history.values())
    w_total = sum(window.values())
    if h_total <= 0 or w_total <= 0:
        return 1.0
    keys = list(history.keys() | window.keys())
    h = np.array([max(history.get(k, 0.0), 0.0) for k in keys], dtype=np.float64)
    w = np.array([max(window.get(k, 0.0), 0.0) for k in keys], dtype=np.float64)
    share = (h + w) / (h_total + w_total)
    small = share * min(h_total, w_total) < _MIN_EXPECTED
    h_cells, w_cells = list(h[~small]), list(w[~small])
    pooled = float(share[small].sum())
    if pooled * min(h_total, w_total) >= _MIN_EXPECTED:
        h_cells.append(float(h[small].sum()))
        w_cells.append(float(w[small].sum()))
    if len(h_cells) < 2:
        return 1.0
    hc, wc = np.array(h_cells), np.array(w_cells)
    hs, ws = float(hc.sum()), float(wc.sum())
    p = (hc + wc) / (hs + ws)
    stat = float((((hc - hs * p) ** 2) / (hs * p)).sum() + (((wc - ws * p) ** 2) / (ws * p)).sum())
    # imported here, as packing.py imports scipy: a second or more at every start otherwise (scipy.stats'
    # chi2_contingency computes the same statistic and costs seconds more to import)
    from scipy.special import chdtrc

    return float(chdtrc(len(hc) - 1, stat))


class WorkloadEstimator:
    """A histogram of observed pod shapes, seeded with a prior, that forgets only what a test says is out of date.

    Every ``drift_window_pods`` pods (at first, every time the pods seen have doubled, from 25), the counts of those
    pods are tested against the weights of the ones before (the prior included): when :func:`drift_pvalue` is below
    ``drift_significance``, the mix has changed, and the older weights are scaled down to weigh as much as the window
    (each further window that still differs halves what is left of the old mix). The default mix is history like any
    other: the first 25 pods that contradict it make it weigh 25 pseudo-pods instead of ``prior_weight``. While the
    mix stays the same nothing is forgotten, so the estimate keeps sharpening with every pod instead of being the
    noisy mix of the last few thousand (what a fixed half-life learns). The workload it returns carries the pods it
    was learned from (:attr:`Workload.evidence`). With ``half_life_pods`` set, a fixed
    exponential decay instead (new observations weigh ``2 ** (1 / half_life_pods)`` times the previous one) and no
    test.

    Each pod is counted once (by ``pod_uid`` or ``pod_key``) even when the scheduler retries it. What it is fed is
    clamped first (:func:`bounded_request`): no request can store a value that later breaks scoring for others.
    """

    def __init__(
        self,
        *,
        half_life_pods: float | None = None,
        drift_window_pods: int = DEFAULT_DRIFT_WINDOW_PODS,
        drift_significance: float = DEFAULT_DRIFT_SIGNIFICANCE,
        prior: Mapping[PodShape, float] | None = None,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        coverage: float = DEFAULT_COVERAGE,
        max_shapes: int = DEFAULT_MAX_SHAPES,
        reference_gpu_memory: int = DEFAULT_REFERENCE_GPU_MEMORY,
    ) -> None:
        if half_life_pods is not None and not half_life_pods > 0:
            raise ValueError(f"half_life_pods: must be positive, got {half_life_pods}")
        if drift_window_pods < 1:
            raise ValueError(f"drift_window_pods: must be at least 1, got {drift_window_pods}")
        if not 0 < drift_significance < 1:
            raise ValueError(f"drift_significance: must be between 0 and 1, got {drift_significance}")
        self._growth = 1.0 if half_life_pods is None else 2.0 ** (1.0 / half_life_pods)
        self._window_pods = drift_window_pods if half_life_pods is None else 0
        self._significance = drift_significance
        self._window: dict[PodShape, float] = {}
        self._in_window = 0
        self._inc = 1.0
        self._coverage = coverage
        self._max_shapes = max_shapes
        self._ref_mem = reference_gpu_memory
        base = prior if prior is not None else DEFAULT_SHAPES
        total = sum(base.values()) or 1.0
        self._weights: dict[PodShape, float] = {s: prior_weight * w / total for s, w in base.items()}
        self._prior = dict(self._weights)
        """What is left of the prior in :attr:`_weights` (forgotten and rescaled with them): not evidence."""
        self._memory: dict[PodShape, float] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._cached: Workload | None = None
        self.observed = 0
        self.drifts = 0
        """How many windows the test found drifted (each made the estimator forget)."""

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
            self._prior = {k: v / self._inc for k, v in self._prior.items()}
            self._memory = {k: v / self._inc for k, v in self._memory.items()}
            self._inc = 1.0
        if len(self._weights) > self._max_shapes:
            floor = sorted(self._weights.values())[-self._max_shapes]
            self._weights = {k: v for k, v in self._weights.items() if v >= floor}
            self._memory = {k: v for k, v in self._memory.items() if k in self._weights}
            self._prior = {k: v for k, v in self._prior.items() if k in self._weights}
        self.observed += 1
        self._cached = None
        if self._window_pods:
            self._window[s] = self._window.get(s, 0.0) + 1.0
            self._in_window += 1
            before = self.observed - self._in_window
            if self._in_window >= max(_FIRST_WINDOW, min(self._window_pods, before)):
                self._test_drift()

    def _test_drift(self) -> None:
        """End of a window: forget the older weights if the window's mix differs from theirs."""
        window, self._window, self._in_window = self._window, {}, 0
        history = {k: v - window.get(k, 0.0) for k, v in self._weights.items()}
        history = {k: v for k, v in history.items() if v > 1e-9}
        if drift_pvalue(history, window) >= self._significance:
            return
        self.drifts += 1
        keep = min(1.0, sum(window.values()) / sum(history.values()))
        for k in self._weights:
            old = history.get(k, 0.0)
            self._weights[k] -= (1.0 - keep) * old
            if k in self._memory and self._weights[k] + (1.0 - keep) * old > 0:
                # the shape's mean host memory is kept: scale its sum with its weight
                self._memory[k] *= self._weights[k] / (self._weights[k] + (1.0 - keep) * old)
        self._weights = {k: v for k, v in self._weights.items() if v > 1e-9}
        self._memory = {k: v for k, v in self._memory.items() if k in self._weights}
        # the prior is part of the older weights: it keeps the same share of them
        self._prior = {k: v * keep for k, v in self._prior.items() if k in self._weights}

    def weights(self) -> Mapping[PodShape, float]:
        """The histogram's weight per shape now (read only; not normalised): what :mod:`.publication` compares."""
        return MappingProxyType(self._weights)

    def workload(self) -> Workload:
        """The learned mix (:meth:`Workload.from_counts` of the histogram) with its :attr:`~Workload.evidence`: the
        pods observed, without the prior (an assumption, which ``prior_weight`` already says how much to trust; a
        shape only the prior has counts 0 and is taken as it is), in pods, i.e. over the newest pod's weight (with a
        fixed decay, a count is the pods it weighs as much as). No evidence before the first pod: the prior mix is
        taken as it is."""
        if self._cached is None:
            mem = {k: v / self._weights[k] for k, v in self._memory.items() if self._weights.get(k, 0) > 0}
            w = Workload.from_counts(self._weights, self._coverage, mem)
            if self.observed:
                seen = [max(self._weights.get(s, 0.0) - self._prior.get(s, 0.0), 0.0) for s, _ in w.shapes()]
                total = max(sum(self._weights.values()) - sum(self._prior.values()), 0.0)
                w = w.with_evidence(np.array(seen, dtype=np.float64) / self._inc, total / self._inc)
            self._cached = w
        return self._cached


def workload_of(
    reqs: Sequence[GpuRequest],
    coverage: float = DEFAULT_COVERAGE,
    reference_gpu_memory: int = DEFAULT_REFERENCE_GPU_MEMORY,
) -> Workload:
    """The target workload of a trace (the paper's definition: shapes covering ``coverage`` of the pods); memory
    pools count as their share of a GPU of ``reference_gpu_memory`` bytes."""
    return Workload.from_requests(reqs, coverage, reference_gpu_memory)
