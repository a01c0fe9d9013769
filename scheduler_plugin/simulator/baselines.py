"""The FGD paper's baseline policies, as score plugins + GPU pickers of kelvin's framework, and the simulator's
registry (:data:`SIMULATOR`: the production one plus these). They are for comparison only: the production registry
(:data:`scheduler_plugin.policies.plugins.PRODUCTION`) does not hold them, so a policy file cannot select them.

Definitions follow the paper (Weng et al., USENIX ATC '23, section 6) and its public simulator:

* ``random``: a uniformly random feasible node (seeded).
* ``dotproduct``: Tetris' alignment heuristic; the node (and GPU) whose free-resource vector has the smallest dot
  product with the pod's request vector, both normalised by the largest node (128 cores, 8 GPUs / 1 GPU share).
* ``gpu-clustering``: keep pods of the same GPU request class (any GPU share, or N whole GPUs) on the same nodes:
  nodes already hosting this class only (75-100), mixed nodes hosting it (50-75), empty nodes (25-50), nodes of other
  classes (0-25); within a band, fuller nodes first.
* ``gpu-packing``: use a partly used GPU first (tighter is better), then free GPUs of a used node, then an idle node
  (fewer GPUs better).
* ``best-fit``: the node with the least CPU and GPU left after placement,
  ``int(100 * (1 - 0.5 (cpu_left - cpu)/128000 - 0.5 (gpu_left - req)/8000))``, min-max normalised over the feasible
  nodes as integers; inside the node, the tightest GPU that fits.

Scores are raw values (higher is better); ``normalize`` maps them to 0..10 for the extender.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import Field

from ..model import MILLI_PER_GPU, FleetArrays, GpuRequest
from ..policies.base import BoolA, CycleContext, FloatA, IntA
from ..policies.fragmentation import eligible_gpus
from ..policies.normalize import minmax
from ..policies.plugins import PRODUCTION
from ..policies.policy_file import CamelModel
from ..policies.registry import Kind, Registration, Registry

MAX_SPEC_CPU_MILLI = 128_000
MAX_SPEC_GPU_MILLI = 8 * MILLI_PER_GPU
MAX_NODE_SCORE = 100


class NoArgs(CamelModel):
    """The baselines take no arguments."""


class RandomArgs(CamelModel):
    seed: int = Field(0, description="seed of the random scores")


def _tightest_pick(req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
    """The ``count`` eligible GPUs with the least free share (stable: lower slot first)."""
    elig, _ = eligible_gpus(req, fleet, np.array([row], dtype=np.int64), ctx)
    cols = np.flatnonzero(elig[0])
    if len(cols) < max(req.count, 0):
        return None
    if not req.wants_gpu:
        return ()
    order = cols[np.argsort(fleet.free_milli[row, cols], kind="stable")]
    return tuple(int(fleet.gpu_index[row, c]) for c in order[: req.count])


def _gpu_demand_total(req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> IntA:
    """(len(idx),) thousandths of GPU the pod takes on each node (per-slot demand of the first eligible GPU)."""
    if not req.wants_gpu:
        return np.zeros(len(idx), dtype=np.int64)
    elig, demand = eligible_gpus(req, fleet, idx, ctx)
    first = np.argmax(elig, axis=1)
    return np.asarray(demand[np.arange(len(idx)), first] * req.count, dtype=np.int64)


def _explain_raw(name: str, raw: FloatA) -> list[str]:
    return [f"{name} raw score {float(raw[0]):.3f}"]


@dataclass(slots=True)
class _Baseline:
    name: str

    def normalize(self, raw: FloatA) -> FloatA:
        return minmax(raw)

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        raise NotImplementedError

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        return _tightest_pick(req, fleet, row, ctx)

    def explain(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> list[str]:
        return _explain_raw(self.name, self.score(req, fleet, np.array([row], dtype=np.int64), ctx))


@dataclass(slots=True)
class RandomPolicy(_Baseline):
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        return self.rng.random(len(idx))

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        elig, _ = eligible_gpus(req, fleet, np.array([row], dtype=np.int64), ctx)
        cols = np.flatnonzero(elig[0])
        if len(cols) < req.count:
            return None
        chosen = self.rng.choice(cols, size=req.count, replace=False) if req.count else cols[:0]
        return tuple(int(fleet.gpu_index[row, c]) for c in sorted(chosen))


@dataclass(slots=True)
class BestFitPolicy(_Baseline):
    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        cpu_after = fleet.cpu_free[idx] - req.cpu_milli
        gpu_after = fleet.free_milli[idx].sum(axis=1) - _gpu_demand_total(req, fleet, idx, ctx)
        left = 0.5 * cpu_after / MAX_SPEC_CPU_MILLI + 0.5 * gpu_after / MAX_SPEC_GPU_MILLI
        raw = np.trunc((1.0 - left) * MAX_NODE_SCORE).astype(np.int64)
        if len(raw) == 0:
            return np.zeros(0)
        lo, hi = int(raw.min()), int(raw.max())
        if hi == lo:
            return np.zeros(len(idx))
        return np.asarray((raw - lo) * MAX_NODE_SCORE // (hi - lo), dtype=np.float64)


@dataclass(slots=True)
class DotProductPolicy(_Baseline):
    def _alternatives(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> tuple[FloatA, BoolA]:
        """(len(idx), G) score of each GPU alternative (-inf where the GPU cannot take the pod), eligible mask."""
        cpu_node = fleet.cpu_free[idx] / MAX_SPEC_CPU_MILLI
        cpu_pod = req.cpu_milli / MAX_SPEC_CPU_MILLI
        elig, demand = eligible_gpus(req, fleet, idx, ctx)
        if req.shared:
            dot = cpu_node[:, None] * cpu_pod + (fleet.free_milli[idx] / MILLI_PER_GPU) * (demand / MILLI_PER_GPU)
            return np.where(elig, 1.0 - dot / 2.0, -np.inf), elig
        gpu_node = fleet.free_milli[idx].sum(axis=1) / MAX_SPEC_GPU_MILLI
        gpu_pod = req.count * MILLI_PER_GPU / MAX_SPEC_GPU_MILLI
        dims = 2.0 if req.wants_gpu else 1.0
        dot = cpu_node * cpu_pod + (gpu_node * gpu_pod if req.wants_gpu else 0.0)
        return np.repeat((1.0 - dot / dims)[:, None], elig.shape[1], axis=1), elig

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        alt, _ = self._alternatives(req, fleet, idx, ctx)
        return np.asarray(np.trunc(alt.max(axis=1) * MAX_NODE_SCORE), dtype=np.float64)

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        if not req.shared:
            return _tightest_pick(req, fleet, row, ctx)
        alt, elig = self._alternatives(req, fleet, np.array([row], dtype=np.int64), ctx)
        if not elig[0].any():
            return None
        return (int(fleet.gpu_index[row, int(np.argmax(alt[0]))]),)


@dataclass(slots=True)
class GpuPackingPolicy(_Baseline):
    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        free = fleet.free_milli[idx].astype(np.int64)
        present = fleet.gpu_present[idx]
        n_gpus = present.sum(axis=1)
        fully_free = ((free >= MILLI_PER_GPU) & present).sum(axis=1)
        out = np.zeros(len(idx))
        if not req.wants_gpu:
            return out
        idle = fully_free == n_gpus
        out[idle] = np.maximum(MAX_NODE_SCORE // 3 - fully_free[idle], fully_free[idle])
        elig, _ = eligible_gpus(req, fleet, idx, ctx)
        # The pod's GPUs, tightest first: a shared pod takes its tightest eligible GPU; whole pods take free GPUs.
        tight = np.where(elig, free, MILLI_PER_GPU + 1).min(axis=1)
        uses_free = req.whole | (tight >= MILLI_PER_GPU)
        band2 = ~idle & uses_free
        out[band2] = np.maximum(MAX_NODE_SCORE // 2 - req.count, MAX_NODE_SCORE // 3)
        band1 = ~idle & ~uses_free
        out[band1] = np.maximum(MAX_NODE_SCORE - (tight[band1] * 100 // MILLI_PER_GPU) // 10, MAX_NODE_SCORE // 2)
        return out


@dataclass(slots=True)
class GpuClusteringPolicy(_Baseline):
    """Clusters pods by their GPU request class; remembers the classes it placed on each node (by node name)."""

    classes: dict[str, set[int]] = field(default_factory=dict)
    _names: object = field(default=None, init=False, repr=False)
    """The fleet's ``names`` that :attr:`_count` and :attr:`_member` are rows of (``None``: not built yet)."""
    _count: IntA = field(default_factory=lambda: np.zeros(0, dtype=np.int64), init=False, repr=False)
    """(N,) how many classes :attr:`classes` holds for each row."""
    _member: dict[int, BoolA] = field(default_factory=dict, init=False, repr=False)
    """Class -> (N,) the row hosts that class."""

    @staticmethod
    def request_class(req: GpuRequest) -> int:
        """The paper's affinity classes: no GPU (0), any GPU share (-1), or N whole GPUs (N)."""
        if not req.wants_gpu:
            return 0
        return -1 if req.shared else req.count

    def _rows(self, fleet: FleetArrays) -> None:
        """:attr:`classes` as per-row arrays of ``fleet`` (rebuilt when the fleet's rows are other ones)."""
        if self._names is fleet.names:
            return
        n = fleet.n_nodes
        self._names, self._count, self._member = fleet.names, np.zeros(n, dtype=np.int64), {}
        index = fleet.index
        for name, have in self.classes.items():
            row = index.get(name)
            if row is not None:
                self._count[row] = len(have)
                for cls in have:
                    self._member.setdefault(cls, np.zeros(n, dtype=np.bool_))[row] = True

    def score(self, req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> FloatA:
        if not req.wants_gpu:
            return np.zeros(len(idx))
        cls = self.request_class(req)
        free_total = fleet.free_milli[idx].sum(axis=1)
        fill = (MAX_NODE_SCORE // 4) * (MAX_SPEC_GPU_MILLI - free_total) // MAX_SPEC_GPU_MILLI
        self._rows(fleet)
        count = self._count[idx]
        member = self._member.get(cls)
        hosts = member[idx] if member is not None else np.zeros(len(idx), dtype=np.bool_)
        # this class alone 3, with others 2; an empty node 1, other classes only 0
        band = np.where(hosts, np.where(count == 1, 3, 2), np.where(count == 0, 1, 0))
        return np.asarray(band * (MAX_NODE_SCORE // 4) + fill, dtype=np.float64)

    def pick(self, req: GpuRequest, fleet: FleetArrays, row: int, ctx: CycleContext) -> tuple[int, ...] | None:
        chosen = _tightest_pick(req, fleet, row, ctx)
        if chosen is not None and req.wants_gpu:
            cls = self.request_class(req)
            have = self.classes.setdefault(fleet.names[row], set())
            have.add(cls)
            if self._names is fleet.names:
                self._count[row] = len(have)
                self._member.setdefault(cls, np.zeros(fleet.n_nodes, dtype=np.bool_))[row] = True
        return chosen


def _same(cls: type[_Baseline], name: str) -> Callable[[NoArgs], _Baseline]:
    def factory(args: NoArgs) -> _Baseline:
        return cls(name)

    return factory


def _random_score(args: RandomArgs) -> RandomPolicy:
    return RandomPolicy("random", np.random.default_rng(args.seed))


def _random_picker(args: RandomArgs) -> RandomPolicy:
    return RandomPolicy("random", np.random.default_rng(args.seed + 1))


_TWO_WAY: tuple[tuple[str, type[_Baseline], str], ...] = (
    ("best-fit", BestFitPolicy, "Least CPU and GPU left after placement; tightest GPU (paper baseline)."),
    ("dotproduct", DotProductPolicy, "Tetris dot-product alignment (paper baseline)."),
    ("gpu-packing", GpuPackingPolicy, "Partly used GPUs first, then used nodes, then idle nodes (paper baseline)."),
    ("gpu-clustering", GpuClusteringPolicy, "Same GPU request class on the same nodes (paper baseline)."),
)

_KINDS: tuple[Kind, ...] = ("score", "picker")

BASELINES: tuple[Registration[Any], ...] = (
    Registration("score", "random", RandomArgs, _random_score, "A uniformly random feasible node (paper baseline)."),
    Registration("picker", "random", RandomArgs, _random_picker, "Random eligible GPUs (paper baseline)."),
    *(Registration(kind, name, NoArgs, _same(cls, name), doc) for name, cls, doc in _TWO_WAY for kind in _KINDS),
)
"""The paper's baselines, each a score plugin that is its own GPU picker (``random``'s picker draws apart)."""

SIMULATOR: Registry = PRODUCTION.extended(BASELINES)
"""The simulator's registry: every production policy plus :data:`BASELINES`."""
