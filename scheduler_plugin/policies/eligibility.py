"""Which GPU slots of the candidate nodes could take one GPU of the request: the shared per-GPU test.

The fit filter counts these per node; scores and pickers use the same mask so that they judge only GPUs the pod can
really get. Vectorised over candidate rows: every function returns ``(len(idx), G)`` arrays.

Two layers:
* **static**: true of the GPU whatever runs on it (present, an allowed model, big enough, cool enough);
* **capacity**: free right now (a whole GPU unused; or, for a share, enough thousandths and memory left).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ..model import MILLI_PER_GPU, THERMAL_THROTTLE_MASK, FleetArrays, GpuRequest
from ..model.snapshot import IndexKey
from .base import BoolA, CycleContext, IntA, StateKey

I32A = npt.NDArray[np.int32]


@dataclass(frozen=True, slots=True)
class GpuLimits:
    """The thermal hard limits of the filter (from ``filters`` in the policy config)."""

    thermal_hard_limits: bool = True
    throttle_hard_limit: bool = True
    slowdown_margin_celsius: float = 0.0


LIMITS_KEY: StateKey[GpuLimits] = StateKey("kelvin.gpu_limits")
"""Cycle state: the configured :class:`GpuLimits` (written by the framework; default limits when absent)."""


def limits_of(ctx: CycleContext) -> GpuLimits:
    return ctx.state.find(LIMITS_KEY) or GpuLimits()


FEW_ROWS_SHARE = 4
"""Candidates are "few" below 1/4 of the fleet: then per-cycle data is computed for those rows only; at or above,
for every node at once (from the snapshot index) and indexed."""


def few_rows(n: int, fleet: FleetArrays) -> bool:
    """Whether ``n`` candidate rows are few enough to compute for them alone (see :data:`FEW_ROWS_SHARE`)."""
    return n * FEW_ROWS_SHARE < fleet.n_nodes


def model_ok(req: GpuRequest, fleet: FleetArrays, idx: IntA) -> BoolA:
    """Present and of an allowed model."""
    present = fleet.gpu_present[idx]
    if req.models is None:
        return present
    ids = sorted(fleet.model_ids(req.models))
    if not ids:
        return np.zeros_like(present)
    return present & np.isin(fleet.model_id[idx], np.asarray(ids, dtype=np.int32))


def size_ok(req: GpuRequest, fleet: FleetArrays, idx: IntA, demand: I32A | None = None) -> BoolA:
    """The GPU is big enough for one GPU of the request when empty (a share's memory pool fits its total memory).

    ``demand``: ``req.demand_milli`` of the ``idx`` rows when the caller has it already."""
    if not req.shared:
        return np.ones(fleet.gpu_present[idx].shape, dtype=np.bool_)
    if demand is None:
        demand = req.demand_milli(fleet.mem_total[idx])
    return demand <= MILLI_PER_GPU


BREAKS_LIMITS = IndexKey[BoolA]("eligibility.breaks_limits", ("temp", "slowdown", "throttle"), limit=16)
"""Snapshot index: (N, G) GPUs breaking the thermal hard limits, per :class:`GpuLimits`."""


def _limit_mask(limits: GpuLimits) -> Callable[[FleetArrays], BoolA]:
    def compute(fleet: FleetArrays) -> BoolA:
        hot = np.zeros(fleet.temp.shape, dtype=np.bool_)
        if limits.thermal_hard_limits:
            hot |= fleet.temp >= fleet.slowdown - limits.slowdown_margin_celsius
        if limits.throttle_hard_limit:
            hot |= (fleet.throttle & THERMAL_THROTTLE_MASK) != 0
        return hot

    return compute


def _breaks_limits(fleet: FleetArrays, limits: GpuLimits) -> BoolA:
    """(N, G) the GPU breaks the thermal hard limits, for every node; computed once per snapshot and limits."""
    return fleet.derive(BREAKS_LIMITS, _limit_mask(limits), limits)


def too_hot(req: GpuRequest, fleet: FleetArrays, idx: IntA, limits: GpuLimits) -> BoolA:
    """The GPU breaks a thermal hard limit or the pod's own ``kelvin.dev/max-temperature``."""
    hot = _breaks_limits(fleet, limits)[idx]
    if req.max_temperature is not None:
        hot |= fleet.temp[idx] > req.max_temperature
    return hot


def static_ok(req: GpuRequest, fleet: FleetArrays, idx: IntA, limits: GpuLimits, demand: I32A | None = None) -> BoolA:
    """Could take one GPU of the request if every pod on the node left (model, size, heat)."""
    ok = model_ok(req, fleet, idx) & ~too_hot(req, fleet, idx, limits)
    if req.shared:
        ok &= size_ok(req, fleet, idx, demand)
    return ok


def capacity_ok(req: GpuRequest, fleet: FleetArrays, idx: IntA, demand: I32A | None = None) -> BoolA:
    """Free right now for one GPU of the request."""
    free_milli = fleet.free_milli[idx]
    if not req.shared:
        return free_milli >= MILLI_PER_GPU
    ok = free_milli >= (req.demand_milli(fleet.mem_total[idx]) if demand is None else demand)
    if req.memory_bytes is not None:
        ok &= fleet.free_mem[idx] >= req.memory_bytes
    return np.asarray(ok, dtype=np.bool_)


def eligible_gpus(
    req: GpuRequest, fleet: FleetArrays, idx: IntA, limits: GpuLimits | None = None, demand: I32A | None = None
) -> BoolA:
    """(len(idx), G): the GPU could take one GPU of the request now (``demand``: see :func:`size_ok`)."""
    if req.shared and demand is None:
        demand = req.demand_milli(fleet.mem_total[idx])
    return static_ok(req, fleet, idx, limits or GpuLimits(), demand) & capacity_ok(req, fleet, idx, demand)


@dataclass(frozen=True, slots=True)
class _CycleDemand:
    req: GpuRequest
    mem_total: IntA
    rows: IntA | None  # None: ``demand`` covers every node; else the rows it was computed for, in order
    demand: I32A


DEMAND_KEY: StateKey[_CycleDemand] = StateKey("kelvin.demand")
"""Cycle state: the cycle's per-GPU demand (see :func:`cycle_demand`)."""


def cycle_demand(req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> I32A:
    """``req.demand_milli(fleet.mem_total[idx])``, computed once per (request, rows) and cycle, like
    :func:`cycle_eligible`: for many candidates taken from the snapshot index (:func:`static_of`).
    """
    hit = ctx.state.find(DEMAND_KEY)
    if hit is not None and hit.req is req and hit.mem_total is fleet.mem_total:
        if hit.rows is None:
            return hit.demand[idx]
        if hit.rows is idx:
            return hit.demand
    if few_rows(idx.size, fleet):
        demand = req.demand_milli(fleet.mem_total[idx])
        ctx.state.write(DEMAND_KEY, _CycleDemand(req, fleet.mem_total, idx, demand))
        return demand
    full = static_of(req, fleet, limits_of(ctx)).demand
    ctx.state.write(DEMAND_KEY, _CycleDemand(req, fleet.mem_total, None, full))
    return full[idx]


@dataclass(frozen=True, slots=True)
class StaticMasks:
    """Request-shape data over every node of a fleet that depends on telemetry columns only."""

    demand: I32A
    """(N, G) ``req.demand_milli(fleet.mem_total)``."""
    static: BoolA
    """(N, G) :func:`static_ok` for every node."""


#: Columns :func:`static_ok` and ``demand_milli`` read: telemetry, never written in place (not by the simulator
#: either), so a snapshot's masks stay valid for every cycle on it.
STATIC_COLUMNS = ("gpu_present", "model_id", "mem_total", "temp", "slowdown", "throttle")
_MAX_SHAPES = 64
STATIC_MASKS = IndexKey[StaticMasks]("eligibility.static", STATIC_COLUMNS, limit=_MAX_SHAPES)
"""Snapshot index: :class:`StaticMasks` per request shape (at most ``_MAX_SHAPES`` shapes per snapshot)."""


def static_of(req: GpuRequest, fleet: FleetArrays, limits: GpuLimits) -> StaticMasks:
    """:class:`StaticMasks` of ``req`` over the whole fleet, computed once per snapshot and request shape (the
    fields ``static_ok`` and ``demand_milli`` read), so filter and prioritize of pods alike share them."""
    shared = req.shared
    key = (
        fleet.models,
        req.models,
        req.count > 0,
        shared,
        req.milli if shared else None,
        req.memory_bytes if shared else None,
        req.max_temperature,
        limits,
    )

    def compute(f: FleetArrays) -> StaticMasks:
        every = np.arange(f.n_nodes, dtype=np.int64)
        demand = req.demand_milli(f.mem_total)
        return StaticMasks(demand, static_ok(req, f, every, limits, demand if shared else None))

    return fleet.derive(STATIC_MASKS, compute, key)


@dataclass(frozen=True, slots=True)
class _CycleMask:
    fleet: FleetArrays
    req: GpuRequest
    limits: GpuLimits
    rows: IntA | None  # None: ``mask`` covers every node; else the rows it was computed for, in order
    mask: BoolA


ELIGIBLE_KEY: StateKey[_CycleMask] = StateKey("kelvin.eligible")
"""Cycle state: the cycle's eligibility mask (see :func:`cycle_eligible`)."""


def cycle_eligible(req: GpuRequest, fleet: FleetArrays, idx: IntA, ctx: CycleContext) -> BoolA:
    """:func:`eligible_gpus` with the cycle's limits, computed once per (fleet, request, rows) and cycle.

    Filters and scores of one cycle share it: for many candidates it is computed for every node at once and indexed
    afterwards; for a few it is computed for those rows (and reused while the same rows array is passed). A caller
    that mutates ``fleet`` in place must start a new context.
    """
    limits = limits_of(ctx)
    hit = ctx.state.find(ELIGIBLE_KEY)
    if hit is not None and hit.fleet is fleet and hit.req is req and hit.limits == limits:
        if hit.rows is None:
            return hit.mask[idx]
        if hit.rows is idx:
            return hit.mask
    if few_rows(idx.size, fleet):
        mask = eligible_gpus(req, fleet, idx, limits, cycle_demand(req, fleet, idx, ctx) if req.shared else None)
        ctx.state.write(ELIGIBLE_KEY, _CycleMask(fleet, req, limits, idx, mask))
        return mask
    sm = static_of(req, fleet, limits)
    full = sm.static & capacity_ok(req, fleet, np.arange(fleet.n_nodes, dtype=np.int64), sm.demand)
    ctx.state.write(ELIGIBLE_KEY, _CycleMask(fleet, req, limits, None, full))
    return full[idx]


def whole_free(fleet: FleetArrays, idx: IntA) -> BoolA:
    """(len(idx), G): present and completely unused (what multi-GPU pods need)."""
    return fleet.gpu_present[idx] & (fleet.free_milli[idx] >= MILLI_PER_GPU)


def pow2(g: int) -> IntA:
    return np.left_shift(np.int64(1), np.arange(g, dtype=np.int64))


def mask_bits(mask: BoolA) -> IntA:
    """(n, G) bool -> (n,) int64 bitmask (bit j = slot j)."""
    return np.asarray(mask.astype(np.int64) @ pow2(mask.shape[1]), dtype=np.int64)
